"""A consumer's partitions, by handle and by partition index, and their handles on the
client's streams: with a message listener (`subscribe_many`) the `Listeners` is registered
for each handle and told which consumer's sink and part it stands for, else the consumer's
own sink. Guarded by the consumer's condition.
"""
from __future__ import annotations

from collections.abc import Iterator

from shadowtopic.client.consumer_part import Part
from shadowtopic.client.listener import ItemSink, Listeners
from shadowtopic.client.read_position import ReadPosition
from shadowtopic.client.stream import Multiplexer


class Handles:
    """The parts of one consumer."""

    __slots__ = ("by_handle", "by_index", "_sink", "_listeners")

    def __init__(self, sink: ItemSink, listeners: Listeners | None) -> None:
        self.by_handle: dict[int, Part] = {}
        self.by_index: dict[int, Part] = {}
        self._sink = sink
        self._listeners = listeners

    def open(self, mux: Multiplexer, topic: str, index: int, reader: bool) -> Part:
        """A handle on `mux` for the partition `topic` (its `index`, -1 for a topic that has
        no partitions); `reader`: it keeps a `ReadPosition` (a consumer of no subscription)."""
        handle = mux.register(self._receiver(), topic)
        p = self.by_handle[handle] = self.by_index[index] = Part(topic, index, handle, mux)
        if reader:
            p.position = ReadPosition()
        if self._listeners is not None:
            self._listeners.add(self._sink, p)
        return p

    def move(self, p: Part, mux: Multiplexer) -> None:
        """`p` reconnects on `mux`: a new handle there, the old one left."""
        handle = mux.register(self._receiver(), p.topic)
        self.unregister(p)
        self.by_handle.pop(p.handle, None)
        p.handle, p.mux = handle, mux
        self.by_handle[handle] = p
        if self._listeners is not None:
            self._listeners.add(self._sink, p)

    def unregister(self, p: Part) -> None:
        """`p`'s handle hears nothing more (`p` stays listed under it until it moves)."""
        p.mux.unregister(p.handle)
        if self._listeners is not None:
            self._listeners.remove(p.handle)

    def get(self, handle: int) -> Part | None:
        return self.by_handle.get(handle)

    def __iter__(self) -> Iterator[Part]:
        return iter(list(self.by_handle.values()))

    def __len__(self) -> int:
        return len(self.by_handle)

    def _receiver(self) -> ItemSink | Listeners:
        return self._sink if self._listeners is None else self._listeners
