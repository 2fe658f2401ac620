"""The plan of a job (compaction/plan.py): which ledgers it reads up to its horizon, and that
a ledger up to the horizon that is not sealed yet fails the plan instead of being skipped
(issue 21: skipped, its messages were missing from the compacted view for good)."""
from __future__ import annotations

import pytest

from shadowtopic.compaction.plan import make_plan
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import TopicName
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

TOPIC = TopicName("t", "ns", "plan-me")
SEALED, OPEN = mpb.LedgerState.SEALED, mpb.LedgerState.OPEN


def ledger_list(*states: int) -> mpb.LedgerList:
    """Ledgers 1, 2, ... of 4 entries each, in these states."""
    lst = mpb.LedgerList()
    for lid, state in enumerate(states, start=1):
        lst.ledgers.add(ledger_id=lid, state=state, entries=4 if state == SEALED else 0,
                        size_bytes=100, path=f"l/{lid}.parquet")
    return lst


def test_the_plan_reads_every_sealed_ledger_up_to_the_horizon():
    plan = make_plan(TOPIC, "j", ledger_list(SEALED, SEALED, OPEN), MessageId(2, 3), None, True)
    assert [i.ledger_id for i in plan.ledgers] == [1, 2]
    assert plan.input_entries == 8


@pytest.mark.parametrize("states", [(OPEN, SEALED, OPEN), (SEALED, OPEN, SEALED, OPEN),
                                    (mpb.LedgerState.LEDGER_STATE_UNSPECIFIED, SEALED)])
def test_an_unsealed_ledger_up_to_the_horizon_fails_the_plan(states):
    horizon = MessageId(len(states) - (states[-1] == OPEN), 3)
    with pytest.raises(errors.NotAllowed, match=r"ledger \d is not sealed yet"):
        make_plan(TOPIC, "j", ledger_list(*states), horizon, None, True)


def test_an_unsealed_ledger_before_the_previous_horizon_is_not_read_anyway():
    """An incremental plan reads only the ledgers after the previous compacted ledger's
    horizon: one before it is not the job's concern."""
    prev = mpb.CompactionPointer(job_id="j0", manifest=mpb.CompactedManifest(
        job_id="j0", horizon=MessageId(1, 3).to_pb()))
    plan = make_plan(TOPIC, "j", ledger_list(OPEN, SEALED, OPEN), MessageId(2, 3), prev, True)
    assert [i.ledger_id for i in plan.ledgers] == [2]
