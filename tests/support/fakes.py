"""Fakes of the broker's seams that the unit suites drive engines through.

`Outbox` is the one client-stream outbox the read engine and the subscriptions send to
(`has_room` / `call_when_room` / `send_entries` / `send_error` / `send_notice`): it records
every frame, error and notice, and answers per handle (`raws`, `ids`, `payloads`,
`entries`). `room=False` makes it full until `drain()`. A test that needs more (a shared
budget, different bookkeeping) derives from it. `Count` is the metrics sink that counts what
was sent out."""
from __future__ import annotations

from shadowtopic.pb.v1 import common_pb2


class Outbox:
    """One client stream: records what the engine queues, per frame and per handle."""

    def __init__(self, room: bool = True, raise_errors: bool = False):
        self.room = room
        self.raise_errors = raise_errors  # a test that expects no error fails at the first
        self.frames: list[tuple[list[int], list[common_pb2.EncodedEntry]]] = []
        self.errors: list[tuple[int, object]] = []
        self.notices: list[tuple[int, object]] = []
        self._waiting: list = []

    # ---- the seam ----
    def has_room(self) -> bool:
        return self.room

    def call_when_room(self, callback) -> None:
        self._waiting.append(callback)

    def send_entries(self, handles, encoded, size) -> None:
        self.frames.append((list(handles), [common_pb2.EncodedEntry.FromString(e)
                                             for e in encoded]))

    def send_error(self, handle, error) -> None:
        if self.raise_errors:
            raise AssertionError(f"reader failed: {error}")
        self.errors.append((handle, error))

    def send_notice(self, handle, notice) -> None:
        self.notices.append((handle, notice))

    # ---- the test's side ----
    def drain(self) -> None:
        """Make room and call whoever waited for it."""
        self.room = True
        waiting, self._waiting = self._waiting, []
        for cb in waiting:
            cb()

    def entries(self, handle: int | None = None) -> list[common_pb2.EncodedEntry]:
        """The entries sent to `handle` (every entry sent, once, for None), in order."""
        return [e for handles, entries in self.frames
                if handle is None or handle in handles for e in entries]

    def raws(self, handle: int | None = None) -> list[bytes]:
        return [e.raw for e in Outbox.entries(self, handle)]


    def ids(self, handle: int | None = None) -> list[tuple[int, int]]:
        return [(e.ledger_id, e.entry_id) for e in Outbox.entries(self, handle)]

    def payloads(self, handle: int | None = None) -> list[bytes]:
        return [common_pb2.Message.FromString(e.raw).payload
                for e in Outbox.entries(self, handle)]


class Count:
    """The metrics sink of sent messages: counts them."""

    def __init__(self):
        self.msgs = 0

    def add_out(self, msgs, size) -> None:
        self.msgs += msgs
