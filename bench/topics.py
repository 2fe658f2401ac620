"""Topic names of the bench's parts: each part of each run has a namespace of its own,
`bench/<part>-<run>` (`<run>`: the start time and a random suffix, fixed when this module is
first imported), so parts that share an etcd, a broker or a data dir never meet a topic
another part or an earlier run made (`TopicAlreadyExists`, a backlog that is not theirs)."""
from __future__ import annotations

import time
import uuid

#: this run's id (one per process that imports this module: the bench's parent process,
#: which passes whole topic names to the client processes it spawns)
RUN = f"{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"


def name(part: str, local: str = "t") -> str:
    """`persistent://bench/<part>-<run>/<local>`: topic `local` of bench part `part`."""
    return f"persistent://bench/{part}-{RUN}/{local}"
