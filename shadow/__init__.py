"""The read replica: a shadow topic's view of its source's ledgers (docs/ARCHITECTURE.md,
"Replication to shadows")."""
from shadowtopic.shadow.ledger import ShadowLedger

__all__ = ["ShadowLedger"]
