"""The chaos run (issue 18): `python -m scripts.chaos.run` (or `make chaos`).

cluster.py  start, kill -9, pause and restart etcd, the source broker, the shadow broker and
            the compaction worker on a private data root and private loopback ports
workload.py producers, durable subscribers, compaction requests and the record of what was
            sent (acked / unknown) and delivered
checks.py   the checker: pure functions over those records (no process, unit-testable)
run.py      the driver loop, its command line, and the generated section of docs/CHAOS.md
"""
