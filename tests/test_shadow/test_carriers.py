"""Which shadow's stream carries a source's bytes to a shadow broker (shadow/carriers.py):
one per source; the others' ids wait for the carrier's bytes, or take over when it lags."""
from __future__ import annotations

import asyncio

from shadowtopic.shadow.carriers import Carriers


def test_one_stream_per_source_carries_until_it_goes_quiet():
    async def body():
        c = Carriers(idle_s=1.0)  # far longer than the calls between (a loaded machine)
        assert c.carries("src", "a") is True
        assert c.carries("src", "b") is False
        assert c.carries("src", "a") is True      # still the carrier while it sends
        assert c.carries("other", "b") is True    # per source
        await asyncio.sleep(1.2)                  # a's batches stopped coming
        assert c.carries("src", "b") is True
        assert c.carries("src", "a") is False
    asyncio.run(body())


def test_an_id_waits_for_the_carriers_bytes():
    async def body():
        c = Carriers(wait_s=5.0)
        applied = []
        c.carries("src", "a")
        c.when_carried("src", "b", (3, 9), lambda: applied.append("b9"))
        c.carried("src", (3, 5))
        assert applied == []                       # not yet up to (3, 9)
        c.when_carried("src", "b", (3, 12), lambda: applied.append("b12"))  # replaces
        c.carried("src", (3, 12))
        assert applied == ["b12"]
        c.when_carried("src", "b", (3, 10), lambda: applied.append("held"))
        assert applied == ["b12", "held"]          # already carried: at once
        assert c.handovers == 0
    asyncio.run(body())


def test_a_waiting_shadow_takes_over_when_the_bytes_are_late():
    async def body():
        c = Carriers(wait_s=0.02)
        applied = []
        assert c.carries("src", "a")
        assert not c.carries("src", "b")
        c.when_carried("src", "b", (3, 9), lambda: applied.append("b"))
        await asyncio.sleep(0.06)
        assert applied == ["b"] and c.handovers == 1  # applied anyway: read from the owner
        assert c.carries("src", "b") is True          # b is at the tail: it carries now
        assert c.carries("src", "a") is False
    asyncio.run(body())


def test_a_stream_that_ends_applies_what_it_waited_for():
    async def body():
        c = Carriers(wait_s=5.0)
        applied = []
        c.carries("src", "a")
        c.when_carried("src", "b", (1, 1), lambda: applied.append("b"))
        c.forget("b")
        assert applied == ["b"]
        c.carried("src", (1, 1))
        assert applied == ["b"]                       # once
    asyncio.run(body())
