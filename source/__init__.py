"""shadowtopic foundation: core types, metadata, ledgers, source broker, client and CLI."""
