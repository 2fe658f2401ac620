"""Placeholder package: implemented by later issues (DESIGN.md §5)."""
