"""Unit tests of the chaos checker (scripts/chaos/checks.py): no process is started.
(`make chaos` runs the checker; `make test-unit` runs these.)"""
import importlib.util
import sys
from pathlib import Path

# scripts/ is not a package the tests import (the repo root is off sys.path): load the
# checker from its file; it imports nothing of scripts/ itself.
_path = Path(__file__).resolve().parents[2] / "scripts" / "chaos" / "checks.py"
_spec = importlib.util.spec_from_file_location("chaos_checks", _path)
checks = importlib.util.module_from_spec(_spec)
sys.modules["chaos_checks"] = checks  # dataclasses look their module up by name
_spec.loader.exec_module(checks)
Delivery, Send, fold, in_window, model = (checks.Delivery, checks.Send, checks.fold,
                                          checks.in_window, checks.model)
check_compacted, check_subscriber = checks.check_compacted, checks.check_subscriber


def sends(*specs):
    """(pid, seq, key, value, status) -> Send, acked ones with id "1:<seq>"."""
    out = []
    for pid, seq, key, value, status in specs:
        out.append(Send(pid, seq, key, value, 0.0, status,
                        f"1:{seq}" if status == "acked" else ""))
    return out


def d(pid, seq, session=0, t=0.0):
    return Delivery(pid, seq, f"1:{seq}", session, t)


S = sends((0, 0, "a", b"0", "acked"), (0, 1, "b", b"1", "acked"), (0, 2, "a", None, "acked"))


def test_everything_once_in_order_passes():
    rep = check_subscriber("s", S, [d(0, 0), d(0, 1), d(0, 2)], {}, 2.0)
    assert rep.failures() == [] and rep.dup_ok == 0


def test_a_missing_acked_send_is_lost():
    rep = check_subscriber("s", S, [d(0, 0), d(0, 2)], {}, 2.0)
    assert rep.lost == [(0, 1)]
    assert any("order" in f for f in rep.failures()) is False  # a gap is loss, not disorder


def test_a_send_first_seen_after_a_later_one_is_disorder():
    rep = check_subscriber("s", S, [d(0, 0), d(0, 2, 1), d(0, 1, 2)], {0: 1.0, 1: 2.0}, 2.0)
    assert any("first delivered after" in x for x in rep.order)


def test_a_duplicate_within_a_session_fails():
    rep = check_subscriber("s", S, [d(0, 0), d(0, 0), d(0, 1), d(0, 2)], {}, 2.0)
    assert rep.dup_bad and rep.order


def test_a_redelivery_after_a_reconnect_within_the_window_is_allowed():
    dl = [d(0, 0, 0, 9.5), d(0, 1, 0, 9.8), d(0, 0, 1, 11.0), d(0, 1, 1, 11.1), d(0, 2, 1, 11.2)]
    rep = check_subscriber("s", S, dl, {0: 10.0}, 2.0)
    assert rep.failures() == [] and rep.dup_ok == 2


def test_a_redelivery_of_an_old_message_fails_unless_a_fault_covers_it():
    dl = [d(0, 0, 0, 1.0), d(0, 1, 0, 9.8), d(0, 0, 1, 11.0), d(0, 1, 1, 11.1), d(0, 2, 1, 11.2)]
    assert check_subscriber("s", S, dl, {0: 10.0}, 2.0).dup_bad
    assert not check_subscriber("s", S, dl, {0: 10.0}, 2.0, [(2.5, 8.0)]).dup_bad
    assert check_subscriber("s", S, dl, {0: 10.0}, 2.0, [(10.5, 12.0)]).dup_bad  # after


def test_in_window():
    assert in_window(9.0, 10.0, 2.0, [])
    assert not in_window(7.0, 10.0, 2.0, [])
    assert in_window(4.0, 10.0, 2.0, [(5.0, 6.0)])
    assert not in_window(4.0, None, 2.0, [(5.0, 6.0)])


def test_a_wrong_id_or_a_phantom_fails():
    bad = Delivery(0, 0, "7:7", 0, 0.0)
    assert check_subscriber("s", S, [bad, d(0, 1), d(0, 2)], {}, 2.0).ids
    assert check_subscriber("s", S, [d(0, 0), d(0, 1), d(0, 2), d(0, 9)], {}, 2.0).ids


def test_unknown_sends_may_be_missing_or_delivered():
    s = S + sends((0, 3, "b", b"3", "unknown"), (0, 4, "b", b"4", "acked"))
    assert check_subscriber("s", s, [d(0, 0), d(0, 1), d(0, 2), d(0, 4)], {}, 2.0).failures() == []
    dl = [d(0, 0), d(0, 1), d(0, 2), Delivery(0, 3, "1:3", 0, 0), d(0, 4)]
    assert check_subscriber("s", s, dl, {}, 2.0).failures() == []


def test_model_and_fold():
    assert fold([("a", b"1"), ("b", b"2"), ("a", None)]) == {"b": b"2"}
    m = model(S + sends((0, 3, "b", b"3", "unknown")))
    assert m == {"a": {None}, "b": {b"1", b"3"}}
    assert model(sends((1, 0, "c", b"x", "unknown"))) == {"c": {None, b"x"}}


def test_compacted_view_against_the_model():
    assert check_compacted("c", S, [("b", b"1")]) == []
    assert check_compacted("c", S, [("a", b"0"), ("b", b"1")])            # delete lost
    assert check_compacted("c", S, [("b", b"1"), ("z", b"9")])            # unknown key
    s = S + sends((0, 3, "b", b"3", "unknown"))
    assert check_compacted("c", s, [("b", b"3")]) == []
    assert check_compacted("c", s, [("b", b"1")]) == []


def test_a_read_not_compacted_up_to_the_horizon_fails():
    whole = [("a", b"0", "1:0"), ("b", b"1", "1:1"), ("a", None, "1:2")]
    assert check_compacted("c", S, whole) == []                    # no horizon: model only
    assert any("not compacted" in f for f in check_compacted("c", S, whole, "1:2"))
    assert check_compacted("c", S, [("b", b"1", "1:1")], "1:2") == []
    assert check_compacted("c", S, whole, "1:0") == []             # after the horizon: all


def test_a_send_delivered_under_two_ids_was_stored_twice():
    """A producer's resend stored again shows as one (producer, seq) under two ids, in the
    same session or after a reconnect; a redelivery (same id) is not that."""
    again = Delivery(0, 1, "2:0", 0, 0.1)
    rep = check_subscriber("s", S, [d(0, 0), d(0, 1), again, d(0, 2)], {}, 2.0)
    assert rep.stored_twice == [(0, 1)]
    assert any("stored twice" in f for f in rep.failures())
    redelivered = [d(0, 0, 0, 9.5), d(0, 1, 0, 9.8), d(0, 1, 1, 11.0), d(0, 2, 1, 11.2)]
    assert check_subscriber("s", S, redelivered, {0: 10.0}, 2.0).stored_twice == []
