"""The shadow broker: a broker process (source/broker/server.py) with the role `shadow`.

    python -m shadowtopic.shadow.broker --etcd HOST:PORT
        --storage-root <the source's storage root> ...

It takes the same flags as the source broker (its config file section is [shadow]:
source/config_file.py) and registers with the role "shadow": the
source's replicators and the brokers' Lookup send shadow topics here. It is assembled with
the same features (`--features`, default every installed one); with the shadow role the
shadow feature (shadow/feature.py) serves shadow topics and the Replication service here.
A produce to a shadow is refused; source topics are served too.

Its storage root must be the source broker's (standalone passes the same one), so that
sealed ledgers are readable here. The open ledger's entries are read from the source's WAL
when this broker shares the source's WAL directory (the standalone), else from the source's
broker over gRPC (shadow/tail.py).
"""
from __future__ import annotations

from shadowtopic.broker import server
from shadowtopic.broker.config import parse_config
from shadowtopic.shadow.feature import ROLE, ShadowFeature


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv, "shadowtopic shadow-broker",
                       "run a shadow broker (serves shadow topics; sources too)", "shadow")
    if cfg.features is not None and ShadowFeature.name not in cfg.features:
        raise SystemExit("shadowtopic shadow-broker: --features must include shadow "
                         "(a shadow broker serves shadow topics through it)")
    cfg.roles = (ROLE,)
    server.run(cfg)


if __name__ == "__main__":
    main()
