"""The checker of a chaos run: pure functions over what the producers sent and what the
subscribers and compacted readers got (no process, no client: unit-testable).

A send is `acked` (the broker returned its id: it must be delivered) or `unknown` (it raised:
it may or may not be stored). Every message carries its producer and sequence number in its
properties, so a delivery names its send. Per subscriber:

- lost: an acked send never delivered;
- order: within one consumer session a producer's sequence numbers only go up, and a send
  never shows up for the first time after a later send of the same producer;
- duplicates: a send delivered again is allowed only in a later session (a reconnect after a
  broker or consumer restart) and only if its previous delivery falls in the at-least-once
  window: at most `window` seconds before that session ended, or during a disruption (from
  `window` seconds before a fault began until `window` seconds after everything had
  recovered from it) that began before the session ended. docs/ARCHITECTURE.md: cursors are
  flushed once a flush interval (1 s), so acks of at most one interval are lost in a crash;
  while etcd or a broker is down or paused no flush can land. Anything else is a failure;
- ids: a delivered acked send carries the id its send returned; nothing is delivered that was
  never sent;
- stored twice: one send delivered under two message ids was stored twice (a producer's
  resend after a lost receipt: idempotent producing must make this 0). A redelivery has the
  same id.

The compacted view (a read_compacted reader from earliest to the end) folded into key ->
value must equal the model: each key's latest acked value (an empty payload deletes the key),
or the value of an `unknown` send that came after it.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Send:
    pid: int
    seq: int
    key: str
    value: bytes | None          # None: a delete (empty payload)
    t_start: float
    status: str = "pending"      # pending | acked | unknown
    msg_id: str = ""
    t_end: float = 0.0


@dataclass
class Delivery:
    pid: int
    seq: int
    msg_id: str
    session: int
    t: float


@dataclass
class SubscriberReport:
    name: str
    delivered: int = 0
    lost: list = field(default_factory=list)          # (pid, seq)
    order: list = field(default_factory=list)         # text
    dup_ok: int = 0
    dup_bad: list = field(default_factory=list)       # text
    ids: list = field(default_factory=list)           # text
    stored_twice: list = field(default_factory=list)  # (pid, seq): under two message ids
    max_redelivery_age: float = 0.0

    def failures(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{self.name}: {len(self.lost)} acknowledged messages lost, e.g. "
                       f"(producer, seq) {sorted(self.lost)[:5]}")
        out += [f"{self.name}: order: {x}" for x in self.order[:5]]
        out += [f"{self.name}: duplicate: {x}" for x in self.dup_bad[:5]]
        out += [f"{self.name}: {x}" for x in self.ids[:5]]
        if self.stored_twice:
            out.append(f"{self.name}: {len(self.stored_twice)} sends stored twice (under two "
                       f"message ids), e.g. (producer, seq) {self.stored_twice[:5]}")
        return out


def in_window(t_prev: float, t_end: float | None, window: float,
              disruptions: list[tuple[float, float]]) -> bool:
    """May a message delivered at `t_prev`, in a session that ended at `t_end`, come again?"""
    if t_end is None:
        return False
    if t_prev >= t_end - window:
        return True
    return any(start <= t_end and start - window <= t_prev <= end + window
               for start, end in disruptions)


def check_subscriber(name: str, sends: list[Send], deliveries: list[Delivery],
                     session_ends: dict[int, float], window: float,
                     disruptions: list[tuple[float, float]] = ()) -> SubscriberReport:
    """Everything `name` was delivered (in delivery order) against every send;
    `disruptions`: (start, end) of each fault, end = when everything had recovered."""
    rep = SubscriberReport(name, delivered=len(deliveries))
    by_id = {(s.pid, s.seq): s for s in sends}
    last_in_session: dict[tuple[int, int], int] = {}     # (session, pid) -> seq
    max_first: dict[int, int] = {}                       # pid -> highest seq delivered
    seen: dict[tuple[int, int], Delivery] = {}
    for d in deliveries:
        k = (d.pid, d.seq)
        s = by_id.get(k)
        if s is None:
            rep.ids.append(f"delivered {k} ({d.msg_id}) that was never sent")
            continue
        if s.status == "acked" and s.msg_id != d.msg_id:
            rep.ids.append(f"{k} acked as {s.msg_id}, delivered as {d.msg_id}")
        prev_seq = last_in_session.get((d.session, d.pid))
        if prev_seq is not None and d.seq <= prev_seq:
            rep.order.append(f"session {d.session}: producer {d.pid} seq {d.seq} after "
                             f"{prev_seq}")
        last_in_session[(d.session, d.pid)] = d.seq
        prev = seen.get(k)
        if prev is not None and prev.msg_id != d.msg_id:
            rep.stored_twice.append(k)  # not a redelivery: another copy of the send
            continue
        if prev is None:
            if d.seq < max_first.get(d.pid, -1):
                rep.order.append(f"producer {d.pid} seq {d.seq} first delivered after seq "
                                 f"{max_first[d.pid]} (session {d.session})")
            max_first[d.pid] = max(max_first.get(d.pid, -1), d.seq)
        elif prev.session == d.session:
            rep.dup_bad.append(f"{k} delivered twice in session {d.session}")
        else:
            end = session_ends.get(prev.session)
            age = (end - prev.t) if end is not None else float("inf")
            rep.max_redelivery_age = max(rep.max_redelivery_age, age)
            if not in_window(prev.t, end, window, list(disruptions)):
                rep.dup_bad.append(f"{k} redelivered in session {d.session}: delivered "
                                   f"{age:.1f} s before session {prev.session} ended, outside "
                                   f"the at-least-once window ({window:g} s, disruptions "
                                   f"{[(round(a, 1), round(b, 1)) for a, b in disruptions][-3:]}"
                                   f", delivered at {prev.t:.1f})")
            else:
                rep.dup_ok += 1
        seen[k] = d
    rep.lost = [k for k, s in by_id.items() if s.status == "acked" and k not in seen]
    return rep


def model(sends: list[Send]) -> dict[str, set]:
    """key -> the values a compacted view may hold for it (None: absent/deleted). Keys are
    owned by one producer each, so a producer's order is the key's order."""
    allowed: dict[str, set] = {}
    for s in sorted(sends, key=lambda s: (s.pid, s.seq)):
        if s.status == "acked":
            allowed[s.key] = {s.value}
        elif s.status == "unknown":
            allowed.setdefault(s.key, {None}).add(s.value)
    return allowed


def fold(messages: list[tuple[str, bytes | None]]) -> dict[str, bytes]:
    """(key, value) in read order -> the latest value of each key; None deletes."""
    out: dict[str, bytes] = {}
    for key, value in messages:
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _mid(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(":"))


def check_compacted(name: str, sends: list[Send], messages: list[tuple],
                    horizon: str | None = None) -> list[str]:
    """Failures of one compacted read, (key, value, [message id]) in read order (empty: it
    equals the model). With `horizon` (the id the last compaction covered), the read must
    also be compacted: one message per key at most up to the horizon, ids going up."""
    allowed = model(sends)
    got = fold([(m[0], m[1]) for m in messages])
    bad = []
    for key in sorted(set(allowed) | set(got)):
        v = got.get(key)
        ok = allowed.get(key, {None})
        if v not in ok:
            bad.append(f"{key}: read {v!r}, model {sorted(ok, key=repr)!r}")
    out = []
    if bad:
        out.append(f"{name}: compacted view differs from the model on {len(bad)} keys, e.g. "
                   + "; ".join(bad[:3]))
    if horizon is not None and all(len(m) > 2 for m in messages):
        ids = [_mid(m[2]) for m in messages]
        if ids != sorted(set(ids)):
            out.append(f"{name}: compacted read's ids do not go up")
        before = [m[0] for m, i in zip(messages, ids) if i <= _mid(horizon)]
        if len(before) != len(set(before)):
            out.append(f"{name}: not compacted: {len(before)} messages for {len(set(before))} "
                       f"keys up to the horizon {horizon}")
    return out


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
