"""The audit log (docs/SECURITY.md, "Audit"): the logger `shadowtopic.broker.audit`. One
line per Admin call (its method, the role and how it was authenticated), one per call refused for
its credentials (the peer and the reason) and one per call or stream refused for its role
(the role, the action and the target). It never holds a token."""
from __future__ import annotations

import logging

audit = logging.getLogger(__name__)  # shadowtopic.broker.audit
