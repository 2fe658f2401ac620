"""Broker arguments the integration suites share."""
from __future__ import annotations

BROKER_ARGS = ["--lease-ttl", "3"]  # short leases: a killed broker's topics move on within seconds
