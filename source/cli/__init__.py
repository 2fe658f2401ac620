"""The `shadowtopic` command line."""
