"""The workload of a chaos run: producer threads, durable subscriber threads, compaction
requests and compacted reads, and the record of all of it (`checks.Send`, `checks.Delivery`).

The client does not reconnect an established stream after a broker restart, so every
producer and subscriber catches errors, drops its client (closed on a thread of its own, so a
hung close never blocks the loop) and opens a new one after a bounded back-off (0.1 s
doubling to 2 s, reset by a send that is acked). A send that raised is recorded `unknown`;
one that returned an id `acked`.
Each reopen of a subscriber starts a new session (what the duplicate check keys on). A
subscriber that is behind the producers and has received nothing for `stall` seconds also
reopens; those reopens are counted (`stalls`) and reported.

Each message: key "p<producer>-k<n>" (a key belongs to one producer), payload
"<producer>:<seq>" or empty (a delete, 1 in 10), properties {"p": producer, "s": seq}.
"""
from __future__ import annotations

import random
import threading
import time

from scripts.chaos.checks import Delivery, Send
from shadowtopic.client import Client, errors

SUBSCRIPTION = "chaos"


def _close_quietly(*things) -> None:
    def run():
        for t in things:
            try:
                if t is not None:
                    t.close()
            except Exception:
                pass
    threading.Thread(target=run, daemon=True, name="chaos-close").start()


class Workload:
    def __init__(self, topic: str, source_url: str, subscribers: dict[str, tuple[str, str]],
                 producers: int = 2, keys: int = 20, interval: float = 0.01, seed: int = 0,
                 send_timeout: float = 5.0, stall: float = 10.0):
        """`subscribers`: name -> (topic, broker url)."""
        self.topic = topic
        self.url = source_url
        self.subscribers = subscribers
        self.n_producers = producers
        self.keys = keys
        self.interval = interval
        self.seed = seed
        self.send_timeout = send_timeout
        self.stall = stall
        self.lock = threading.Lock()
        self.sends: list[Send] = []
        self.acked_max = [-1] * producers                   # highest acked seq per producer
        self.deliveries: dict[str, list[Delivery]] = {n: [] for n in subscribers}
        self.delivered_max = {n: [-1] * producers for n in subscribers}
        self.session_ends: dict[str, dict[int, float]] = {n: {} for n in subscribers}
        self.session_reasons: dict[str, list[str]] = {n: [] for n in subscribers}
        self.stalls: list[str] = []
        self.errors: list[str] = []                         # open / send errors, for the log
        self._stop = threading.Event()
        self._run_producers = threading.Event()
        self._idle = [threading.Event() for _ in range(producers)]
        self._threads: list[threading.Thread] = []

    # ---- control -------------------------------------------------------------------------

    def start(self) -> None:
        for pid in range(self.n_producers):
            self._threads.append(threading.Thread(target=self._produce, args=(pid,),
                                                  daemon=True, name=f"chaos-producer-{pid}"))
        for name in self.subscribers:
            self._threads.append(threading.Thread(target=self._subscribe, args=(name,),
                                                  daemon=True, name=f"chaos-sub-{name}"))
        for t in self._threads:
            t.start()

    def resume_producers(self) -> None:
        for e in self._idle:
            e.clear()
        self._run_producers.set()

    def pause_producers(self, timeout: float) -> bool:
        """Stop sending; True once no send is in flight (within `timeout`)."""
        self._run_producers.clear()
        deadline = time.monotonic() + timeout
        return all(e.wait(max(0.0, deadline - time.monotonic())) for e in self._idle)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._run_producers.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    # ---- what the driver asks ------------------------------------------------------------

    def acked_since(self, t: float) -> list[int | None]:
        """Per producer, the highest acked seq of a send started after `t` (None: none yet)."""
        out: list[int | None] = [None] * self.n_producers
        with self.lock:
            for s in reversed(self.sends):
                if s.t_start <= t:
                    break
                if s.status == "acked" and out[s.pid] is None:
                    out[s.pid] = s.seq
        return out

    def behind(self, targets: list[int] | None = None) -> dict[str, list[int]]:
        """Subscribers that have not delivered up to `targets` (default: every acked send):
        name -> per producer, how many sequence numbers short."""
        with self.lock:
            want = list(self.acked_max) if targets is None else targets
            out = {}
            for name, got in self.delivered_max.items():
                short = [max(0, w - g) for w, g in zip(want, got)]
                if any(short):
                    out[name] = short
            return out

    def snapshot(self) -> tuple[list[Send], dict[str, list[Delivery]], dict[str, dict]]:
        with self.lock:
            return (list(self.sends), {n: list(d) for n, d in self.deliveries.items()},
                    {n: dict(e) for n, e in self.session_ends.items()})

    # ---- producers -----------------------------------------------------------------------

    def _produce(self, pid: int) -> None:
        rng = random.Random(self.seed * 1000 + pid)
        seq, backoff = 0, 0.1
        client = prod = None
        while not self._stop.is_set():
            if not self._run_producers.is_set():
                self._idle[pid].set()
                self._run_producers.wait(0.2)
                continue
            if prod is None:
                try:
                    client = Client(self.url, timeout=self.send_timeout)
                    prod = client.create_producer(self.topic, linger_ms=0)
                except Exception as exc:
                    self._note(f"producer {pid}: open: {exc!r}")
                    _close_quietly(client)
                    client = prod = None
                    time.sleep(backoff)
                    backoff = min(2.0, backoff * 2)
                    continue
            key = f"p{pid}-k{rng.randrange(self.keys)}"
            value = None if rng.random() < 0.1 else f"{pid}:{seq}".encode()
            s = Send(pid, seq, key, value, time.monotonic())
            with self.lock:
                self.sends.append(s)
            try:
                mid = prod.send(value or b"", key=key, properties={"p": str(pid), "s": str(seq)},
                                timeout=self.send_timeout)
                with self.lock:
                    s.status, s.msg_id, s.t_end = "acked", str(mid), time.monotonic()
                    self.acked_max[pid] = seq
                backoff = 0.1
            except Exception as exc:
                with self.lock:
                    s.status, s.t_end = "unknown", time.monotonic()
                self._note(f"producer {pid}: send {seq}: {exc!r}")
                _close_quietly(prod, client)
                client = prod = None
                time.sleep(backoff)
                backoff = min(2.0, backoff * 2)
            seq += 1
            if self.interval:
                time.sleep(self.interval)
        _close_quietly(prod, client)

    # ---- subscribers ---------------------------------------------------------------------

    def _subscribe(self, name: str) -> None:
        topic, url = self.subscribers[name]
        session, backoff = -1, 0.1
        client = consumer = None
        last_msg = time.monotonic()

        def end(reason: str) -> None:
            nonlocal client, consumer
            with self.lock:
                self.session_ends[name][session] = time.monotonic()
                self.session_reasons[name].append(f"session {session}: {reason}")
            _close_quietly(consumer, client)
            client = consumer = None

        while not self._stop.is_set():
            if consumer is None:
                try:
                    client = Client(url, timeout=self.send_timeout)
                    consumer = client.subscribe(topic, SUBSCRIPTION,
                                                initial_position="earliest")
                    session += 1
                    backoff, last_msg = 0.1, time.monotonic()
                except Exception as exc:
                    self._note(f"{name}: subscribe: {exc!r}")
                    _close_quietly(consumer, client)
                    client = consumer = None
                    time.sleep(backoff)
                    backoff = min(2.0, backoff * 2)
                    continue
            try:
                msg = consumer.receive(timeout=0.5)
            except errors.Timeout:
                if time.monotonic() - last_msg > self.stall and name in self.behind():
                    with self.lock:
                        self.stalls.append(
                            f"{name} session {session}: nothing for {self.stall:g} s "
                            f"while behind {self.behind_unlocked(name)}")
                    end("stalled")
                continue
            except Exception as exc:
                end(repr(exc))
                continue
            last_msg = time.monotonic()
            pid, seq = int(msg.properties["p"]), int(msg.properties["s"])
            with self.lock:
                self.deliveries[name].append(Delivery(pid, seq, str(msg.message_id), session,
                                                      last_msg))
                if seq > self.delivered_max[name][pid]:
                    self.delivered_max[name][pid] = seq
            try:
                consumer.acknowledge(msg)
            except Exception as exc:
                end(f"ack: {exc!r}")
        with self.lock:
            self.session_ends[name][session] = time.monotonic()
        _close_quietly(consumer, client)

    def behind_unlocked(self, name: str) -> list[int]:
        return [max(0, w - g) for w, g in zip(self.acked_max, self.delivered_max[name])]

    def _note(self, text: str) -> None:
        with self.lock:
            self.errors.append(f"{time.monotonic():.1f} {text}")


# ---- compaction and compacted reads (called from the driver's thread) ---------------------

def request_compaction(url: str, topic: str, timeout: float = 60.0) -> str:
    """A new compaction job's id; waits for a running job to end first (bounded)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with Client(url, timeout=5) as c:
                return c.admin.compact(topic)
        except errors.CompactionInProgress as exc:
            last = exc
        except errors.ShadowTopicError as exc:
            if not exc.retriable:
                raise
            last = exc
        except Exception as exc:  # grpc channel errors while a broker restarts
            last = exc
        time.sleep(0.5)
    raise TimeoutError(f"could not request a compaction in {timeout:g} s: {last!r}")


def wait_compaction(url: str, topic: str, job_id: str, timeout: float):
    """The job's final status (phase done or failed); TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with Client(url, timeout=5) as c:
                st = c.admin.compaction_status(topic)
            last = st
            if st.job_id == job_id and st.done:
                return st
        except Exception as exc:
            last = exc
        time.sleep(0.5)
    raise TimeoutError(f"compaction job {job_id} not done after {timeout:g} s: {last!r}")


def read_compacted(url: str, topic: str, timeout: float = 60.0
                   ) -> list[tuple[str, bytes | None, str]]:
    """(key, value or None for a delete, message id) of a read_compacted reader from earliest
    to the end; retried from the start on errors until `timeout`."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        out = []
        try:
            with Client(url, timeout=10) as c, \
                    c.create_reader(topic, "earliest", read_compacted=True) as r:
                while r.has_message_available():
                    m = r.read_next(timeout=10)
                    out.append((m.key.decode() if m.key else "", m.payload or None,
                                str(m.message_id)))
            return out
        except Exception as exc:
            last = exc
            time.sleep(0.5)
    raise TimeoutError(f"compacted read of {topic} failed for {timeout:g} s: {last!r}")
