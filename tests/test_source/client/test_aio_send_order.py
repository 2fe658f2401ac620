"""`AsyncProducer.send` keeps the order of concurrent sends while it waits for room
(source/client/aio/producer.py): sends that found the producer full wait in line, and a send
that comes when room has just appeared joins the line instead of overtaking them (it once
did: `asyncio.gather` of 2,000 sends now and then stored one send after later ones)."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from shadowtopic.client.aio.producer import AsyncProducer


class FullCore:
    """The producer core's side AsyncProducer uses: `full` until `room` is set."""

    receipt_wait_s = 5.0
    topic = "persistent://public/default/t"
    partitions = 0

    def __init__(self):
        self.room = threading.Event()
        self.queued: list[str] = []

    def settle_batches_with(self, sink) -> None:
        pass

    @property
    def full(self) -> bool:
        return not self.room.is_set()

    def wait_for_room(self, timeout: float) -> bool:
        return self.room.wait(timeout)

    def queue_message(self, payload, key, properties, event_time, future) -> None:
        self.queued.append(payload)
        future.get_loop().call_soon(future.set_result, payload)

    def flush_nowait(self) -> None:
        pass


def test_sends_waiting_for_room_keep_their_order_against_later_sends():
    async def main():
        core = FullCore()
        with ThreadPoolExecutor(4) as pool:
            p = AsyncProducer(core, pool)  # type: ignore[arg-type]
            early = [asyncio.ensure_future(p.send(f"m{i}")) for i in range(5)]
            await asyncio.sleep(0.05)  # all five wait for room
            core.room.set()  # room: the next send comes before the waiting ones resume
            late = asyncio.ensure_future(p.send("late"))
            await asyncio.wait_for(asyncio.gather(*early, late), 10)
        return core.queued

    assert asyncio.run(main()) == ["m0", "m1", "m2", "m3", "m4", "late"]
