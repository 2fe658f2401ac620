"""The read replica (DESIGN.md §5): a shadow topic's view of its source's ledgers."""
from shadow.ledger import ShadowLedger

__all__ = ["ShadowLedger"]
