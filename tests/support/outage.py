"""A metadata store that a test takes down and brings back (the outage tests of
test_metadata_contract.py and test_metadata_follow.py)."""
from __future__ import annotations

import asyncio

from shadowtopic.metadata import EtcdServer, EtcdStore, MemoryStore


class Outage:
    """A store taken down and brought back: MemoryStore.set_available, or a private etcd
    stopped (SIGTERM), killed (SIGKILL) or paused (SIGSTOP) and then restarted or resumed."""

    def __init__(self, kind: str):
        self.kind = kind
        self.server = None
        if kind == "memory":
            self.store = MemoryStore()
        else:
            self.server = EtcdServer().start()
            self.store = EtcdStore(self.server.endpoint, timeout=2.0)

    def down(self) -> None:
        if self.kind == "memory":
            self.store.set_available(False)
        elif self.kind == "etcd-stop":
            self.server.stop()
        elif self.kind == "etcd-kill":
            self.server.kill()
        else:
            self.server.pause()

    def up(self) -> None:
        if self.kind == "memory":
            self.store.set_available(True)
        elif self.kind in ("etcd-stop", "etcd-kill"):
            self.server.restart()  # the same ports and data
        else:
            self.server.resume()

    def close(self) -> None:
        asyncio.run(self.store.close())
        if self.server:
            self.server.resume()
            self.server.close()
