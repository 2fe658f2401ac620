"""Broadcast at scale (issue 8): `--subs` (100,000) durable Exclusive subscriptions on one
topic of one real etcd + broker process, attached with `Client.subscribe_many` from `--procs`
(4) client processes, then one message a second for `--duration` (60) seconds.

    .venv/bin/python bench/broadcast.py --subs 100000 --procs 4 --duration 60 [--profile PATH]

Measured (targets of the issue in brackets):
- attach: every process builds its Client, then all call `subscribe_many(topic, names,
  initial_position="latest", message_listener=cb)` for their share of the names at one
  barrier time; attach = barrier -> the last process has its consumers back [< 60 s].
  The listener is `cb(message, recipients)` (one call per message for every consumer of the
  process that got it in one frame; `recipients.acknowledge(message)` acks for all of them in
  one command); a client whose listener is still `cb(consumer, message)` gets a per-consumer
  callback that calls `consumer.acknowledge(message)`;
- broker memory per idle subscription: (VmRSS after attach and `--settle` s of quiet -
  VmRSS before attach) / N, from /proc/<broker>/status [< 2 KB];
- end-to-end latency: the producer (in this process, a batch per message) sends `seq,
  time.time()` as the payload on a fixed schedule, once a second, with `send_async` (its
  receipt, after fsync, is timed too); a listener call takes `time.time() - sent` for every
  recipient and acknowledges; p50 / p99 / max over all N x messages deliveries (histogram in
  0.1 ms steps) [p99 < 1 s], and per message the time until the last of the N subscriptions
  had it (first and last ten messages apart: does a backlog build up?). Each process counts
  deliveries per (subscription, message): delivered must equal N x sent, with missing and
  duplicates reported;
- cursor flush rate sustained: the broker persists changed cursors once a second
  (`CursorFlusher`); this process polls the topic's `CursorPointer` in etcd every 0.2 s (one
  small key: every save moves it, and each file it names records how many cursors it holds),
  so no one walks 100,000 cursors through admin internal stats. Reported: cursors written
  per second over the send window, saves, and the gaps between saves;
- broker (and etcd) CPU seconds from /proc/<pid>/stat per phase: attach, idle, traffic;
  the client processes' CPU by thread (/proc/self/task) and their RSS per subscription.

`fanout100` (bench/run.py --only fanout100) is the other half of the issue: 100 Exclusive
subscriptions reading a pre-filled topic (bench/consume.py's exclusive case with
`exclusive_subs=100`), beside limits.py's decoded fan-out ceiling and NATS with `--subs 100`.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
from array import array

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:  # the sibling bench modules imported below
    sys.path.insert(0, BENCH)

PAYLOAD = struct.Struct("<Id")  # sequence, send time (time.time())


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _subscriber(idx: int, url: str, topic: str, names: list[str], messages: int,
                queue_size: int, go, start_at, stop, progress, out) -> None:
    """One client process: `subscribe_many` for `names` with a listener that records the
    latency of every delivery (a histogram in 0.1 ms steps), counts it per (subscription,
    message) and acknowledges it."""
    from shadowtopic.client import Client

    n = len(names)
    counts = bytearray(n * messages)  # deliveries per (subscription, message), saturating
    hist: dict[int, int] = {}  # latency in 0.1 ms -> deliveries
    last = array("d", [0.0] * messages)  # per message: latest delivery (wall clock)
    index: dict[int, int] = {}
    state = {"delivered": 0, "bad": 0, "errors": 0, "calls": 0}
    unpack = PAYLOAD.unpack_from

    def record(msg, consumers) -> bool:
        now = time.time()
        state["calls"] += 1
        try:
            seq, sent = unpack(msg.payload)
            for c in consumers:
                k = index[id(c)] * messages + seq
                if counts[k] < 255:
                    counts[k] += 1
            if now > last[seq]:
                last[seq] = now
        except (struct.error, KeyError, IndexError):
            state["bad"] += 1
            return False
        key = round((now - sent) * 10_000)
        hist[key] = hist.get(key, 0) + len(consumers)
        state["delivered"] += len(consumers)
        return True

    def grouped(msg, recipients) -> None:
        """`message_listener(message, recipients)`: one call for every consumer of this
        process that got the message in one frame, one ack command for all of them."""
        record(msg, recipients)
        try:
            recipients.acknowledge(msg)
        except Exception:  # noqa: BLE001 - counted, the bench reports it
            state["errors"] += 1

    def single(consumer, msg) -> None:
        """`message_listener(consumer, message)` (the first version of the API)."""
        record(msg, (consumer,))
        try:
            consumer.acknowledge(msg)
        except Exception:  # noqa: BLE001 - counted, the bench reports it
            state["errors"] += 1

    listener = grouped if _grouped_api() else single

    rss0 = rss_bytes(os.getpid())
    with Client(url, timeout=120) as client:
        client.admin.get_topic(topic)  # channel up before the barrier
        out.put((idx, "ready", None))
        go.wait()
        while time.time() < start_at.value:
            time.sleep(0.001)
        c0 = time.process_time()
        t0 = time.time()
        consumers = client.subscribe_many(topic, names, consumer_type="exclusive",
                                          initial_position="latest",
                                          receiver_queue_size=queue_size,
                                          message_listener=listener)
        t1 = time.time()
        index.update((id(c), i) for i, c in enumerate(consumers))
        out.put((idx, "attached", {"t0": t0, "t1": t1, "cpu_s": time.process_time() - c0,
                                   "rss_delta": rss_bytes(os.getpid()) - rss0}))
        c1 = time.process_time()
        while not stop.wait(0.2):
            progress[idx] = state["delivered"]
        progress[idx] = state["delivered"]
        cpu = time.process_time() - c1
        threads = _thread_cpu()
        missing = counts.count(0)
        t2 = time.time()
        client.close()
        close_s = time.time() - t2
    out.put((idx, "done", {"delivered": state["delivered"], "missing": missing,
                           "duplicates": state["delivered"] - (len(counts) - missing),
                           "bad": state["bad"], "ack_errors": state["errors"],
                           "cpu_s": cpu, "close_s": close_s, "hist": hist,
                           "calls": state["calls"], "api": listener.__name__,
                           "threads": threads,
                           "last": last.tobytes()}))


def _grouped_api() -> bool:
    """Does this client's `message_listener` take `(message, recipients)`?"""
    from shadowtopic.client import listener

    return hasattr(listener, "Recipients")


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads so far, by Python thread name (digits dropped),
    else by the kernel's name (gRPC's own threads), from /proc/self/task."""
    tick = os.sysconf("SC_CLK_TCK")
    named = {t.native_id: t.name.rstrip("0123456789-_ ") or t.name
             for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        name = named.get(int(tid)) or comm.rstrip("0123456789-_ ") or comm
        out[name] = round(out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick, 2)
    return out


class PointerWatch(threading.Thread):
    """Polls the topic's CursorPointer in etcd: every save of the cursor flusher moves it.
    `saves` maps each file's sequence to (seen at, cursors, bytes, full)."""

    def __init__(self, etcd: str, topic: str, every: float = 0.2):
        super().__init__(daemon=True, name="pointer-watch")
        from shadowtopic.core.names import TopicName
        from shadowtopic.metadata import keys
        from shadowtopic.metadata.etcd import make_client

        self.key = keys.cursors(TopicName.parse(topic))
        self.client = make_client(etcd, 5.0)
        self.every = every
        self.saves: dict[int, tuple[float, int, int, bool]] = {}
        self.polls = self.failures = 0
        self._halt = threading.Event()

    def run(self) -> None:
        from shadowtopic.pb.storage.v1 import cursors_pb2 as cpb

        while not self._halt.wait(self.every):
            try:
                value, _ = self.client.get(self.key)
            except Exception:  # noqa: BLE001 - a missed poll: the next one catches up
                self.failures += 1
                continue
            self.polls += 1
            now = time.time()
            if value is None:
                continue
            ptr = cpb.CursorPointer.FromString(value)
            for ref, full in ((ptr.full, True), *((d, False) for d in ptr.deltas)):
                if ref.sequence and ref.sequence not in self.saves:
                    at = ptr.written_ms / 1000 if ref.sequence == ptr.sequence else now
                    self.saves[ref.sequence] = (at, ref.cursors, ref.size_bytes, full)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.client.close()

    def window(self, t0: float, t1: float) -> dict:
        """The saves seen in [t0, t1]: cursors/s, saves, gaps between them."""
        inside = sorted(s for s in self.saves.values() if t0 <= s[0] <= t1)
        gaps = [b[0] - a[0] for a, b in zip(inside, inside[1:])]
        cursors = sum(s[1] for s in inside)
        return {"saves": len(inside), "cursors": cursors,
                "cursors_per_s": round(cursors / (t1 - t0)) if t1 > t0 else None,
                "cursors_per_save_max": max((s[1] for s in inside), default=0),
                "cursors_per_save_mean": round(cursors / len(inside)) if inside else 0,
                "full_files": sum(s[3] for s in inside),
                "bytes_per_save_mean": round(statistics.mean(s[2] for s in inside))
                if inside else None,
                "gap_s_median": round(statistics.median(gaps), 2) if gaps else None,
                "gap_s_max": round(max(gaps), 2) if gaps else None}


def run_broadcast(data_dir: str, subs: int = 100_000, procs: int = 4, duration: float = 60.0,
                  rate: float = 1.0, queue_size: int = 1000, settle: float = 5.0,
                  grace: float = 60.0, profile: str | None = None) -> dict:
    """One etcd + broker under `data_dir`; attach, idle, send; returns the figures.
    `profile`: the broker runs under cProfile and dumps its stats there when it exits."""
    import topics  # bench/topics.py
    from consume import proc_cpu  # bench/consume.py

    from shadowtopic.broker.server import free_port
    from shadowtopic.client import Client
    from shadowtopic.metadata.etcd_server import EtcdServer
    from shadowtopic.standalone import BrokerProcess

    topic = topics.name("broadcast")
    messages = max(1, int(duration * rate))
    names = [f"b-{i}" for i in range(subs)]
    groups = [names[i::procs] for i in range(procs)]
    res: dict = {"subscriptions": subs, "processes": procs, "messages": messages,
                 "rate_per_s": rate, "receiver_queue_size": queue_size, "settle_s": settle}
    with EtcdServer(os.path.join(data_dir, "etcd-broadcast")) as etcd:
        etcd.start()
        broker = BrokerProcess(etcd.endpoint, os.path.join(data_dir, "broker-broadcast"),
                               free_port(), extra_args=["--profile", profile] if profile else [])
        broker.start(timeout=60)
        bpid, epid = broker.proc.pid, etcd.proc.pid
        ctx = mp.get_context("spawn")  # gRPC channels do not survive fork
        q = ctx.Queue()
        go, stop = ctx.Event(), ctx.Event()
        start_at = ctx.Value("d", 0.0)
        progress = ctx.Array("q", procs)
        ps = [ctx.Process(target=_subscriber, args=(i, broker.url, topic, g, messages,
                                                    queue_size, go, start_at, stop,
                                                    progress, q), daemon=True)
              for i, g in enumerate(groups)]
        watch = PointerWatch(etcd.endpoint, topic)
        try:
            with Client(broker.url, timeout=120) as c:
                c.admin.create_topic(topic)
                # a batch per message: sent at once, no linger
                producer = c.create_producer(topic, producer_name="broadcast-bench",
                                             batch_max_messages=1)
                for p in ps:
                    p.start()
                _collect(q, "ready", procs, 300, ps)
                time.sleep(1.0)
                rss0 = rss_bytes(bpid)
                cpu0, ecpu0 = proc_cpu(bpid), proc_cpu(epid)
                watch.start()
                start_at.value = time.time() + 0.5
                go.set()
                attached = _collect(q, "attached", procs, 600, ps)
                t_att = max(a["t1"] for a in attached)
                cpu1, ecpu1 = proc_cpu(bpid), proc_cpu(epid)
                res.update(
                    attach_s=round(t_att - start_at.value, 2),
                    attach_per_s=round(subs / (t_att - start_at.value)),
                    attach_s_per_process=[round(a["t1"] - a["t0"], 2) for a in attached],
                    client_attach_cpu_s=round(sum(a["cpu_s"] for a in attached), 2),
                    client_bytes_per_sub=round(sum(a["rss_delta"] for a in attached) / subs),
                    broker_attach_cpu_s=round(cpu1 - cpu0, 2),
                    etcd_attach_cpu_s=round(ecpu1 - ecpu0, 2))
                print(f"  attached {subs:,} subscriptions in {res['attach_s']} s", flush=True)
                time.sleep(settle)
                rss1 = rss_bytes(bpid)
                cpu2 = proc_cpu(bpid)
                res.update(broker_rss_before_mb=round(rss0 / 2**20, 1),
                           broker_rss_idle_mb=round(rss1 / 2**20, 1),
                           bytes_per_idle_sub=round((rss1 - rss0) / subs),
                           broker_idle_cores=round((cpu2 - cpu1) / (time.time() - t_att), 3),
                           attach_flush=watch.window(start_at.value, time.time()))
                print(f"  broker RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB: "
                      f"{res['bytes_per_idle_sub']} B per idle subscription", flush=True)
                # traffic: one message every 1/rate s, on schedule (a slow receipt does not
                # hold the next one back)
                ecpu2 = proc_cpu(epid)
                t_send0 = time.time()
                send_at, acked_at, failed = [], [0.0] * messages, []

                def receipt(i: int):
                    def done(mid, exc) -> None:
                        acked_at[i] = time.time()
                        if exc is not None:
                            failed.append(exc)
                    return done

                for i in range(messages):
                    ahead = t_send0 + i / rate - time.time()
                    if ahead > 0:
                        time.sleep(ahead)
                    t = time.time()
                    send_at.append(t)
                    producer.send_async(PAYLOAD.pack(i, t), callback=receipt(i))
                t_send1 = time.time()
                producer.flush(timeout=120)
                send_lat = [a - t for a, t in zip(acked_at, send_at)]
                want = subs * messages
                seen, t_prog = 0, time.time()
                while time.time() - t_prog < grace:
                    now_seen = sum(progress)
                    if now_seen != seen:
                        seen, t_prog = now_seen, time.time()
                    if seen >= want:
                        break
                    time.sleep(0.1)
                t_done = time.time()
                cpu3, ecpu3 = proc_cpu(bpid), proc_cpu(epid)
                time.sleep(2.5)  # the flusher saves the last acks
                rss2 = rss_bytes(bpid)
                watch.stop()
                stop.set()
                done = _collect(q, "done", procs, 600, ps)
                producer.close()
            res.update(_deliveries(done, send_at))
            span = t_done - t_send0
            res.update(
                sent=messages, expected=want,
                send_ack_ms_p50=round(statistics.median(send_lat) * 1000, 1),
                send_ack_ms_max=round(max(send_lat) * 1000, 1), send_failures=len(failed),
                send_window_s=round(t_send1 - t_send0, 2),
                all_delivered_after_s=round(t_done - t_send1, 2) if seen >= want else None,
                broker_traffic_cpu_s=round(cpu3 - cpu2, 2),
                broker_traffic_cores=round((cpu3 - cpu2) / span, 3),
                etcd_traffic_cpu_s=round(ecpu3 - ecpu2, 2),
                broker_rss_after_traffic_mb=round(rss2 / 2**20, 1),
                flush=watch.window(t_send0, t_send1 + 1.0),
                pointer_polls=watch.polls, pointer_poll_failures=watch.failures,
                client_close_s=[round(d["close_s"], 2) for d in done],
                client_traffic_cpu_s=round(sum(d["cpu_s"] for d in done), 2),
                client_thread_cpu_s=_merge([d["threads"] for d in done]))
            res["flush"]["window_s"] = round(t_send1 + 1.0 - t_send0, 2)
            for p in ps:
                p.join(30)
        finally:
            stop.set()
            for p in ps:
                if p.is_alive():
                    p.terminate()
            if watch.is_alive():
                watch.stop()
            broker.terminate(timeout=120)
    return res


def _collect(q, kind: str, n: int, timeout: float, ps) -> list[dict]:
    got: dict[int, dict] = {}
    deadline = time.time() + timeout
    while len(got) < n:
        try:
            idx, k, payload = q.get(timeout=max(0.1, min(5.0, deadline - time.time())))
        except Exception:  # noqa: BLE001 - queue.Empty: check the processes are alive
            dead = [p for p in ps if p.exitcode not in (None, 0)]
            if dead or time.time() > deadline:
                raise SystemExit(f"bench: broadcast: {n - len(got)} client processes did not "
                                 f"report {kind!r} (see their traceback above)") from None
            continue
        if k != kind:
            raise SystemExit(f"bench: broadcast: expected {kind!r} from process {idx}, got {k!r}")
        got[idx] = payload
    return [got[i] for i in range(n)]


def _merge(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = round(out.get(k, 0) + v, 2)
    return out


def _deliveries(done: list[dict], send_at: list[float]) -> dict:
    hist: dict[int, int] = {}
    for d in done:
        for k, v in d["hist"].items():
            hist[k] = hist.get(k, 0) + v
    keys = sorted(hist)
    total = sum(hist.values())

    def pct(q: float) -> float | None:
        want, seen = q * total, 0
        for k in keys:
            seen += hist[k]
            if seen >= want:
                return round(k / 10, 1)
        return None

    last = [0.0] * len(send_at)
    for d in done:
        for i, t in enumerate(array("d", d["last"])):
            last[i] = max(last[i], t)
    # per message: from its send time to the last subscription that got it
    spread = sorted(t - send_at[i] for i, t in enumerate(last) if t)
    return {
        "listener_api": done[0]["api"],
        "listener_calls": sum(d["calls"] for d in done),
        "delivered": sum(d["delivered"] for d in done),
        "missing": sum(d["missing"] for d in done),
        "duplicates": sum(d["duplicates"] for d in done),
        "bad_payloads": sum(d["bad"] for d in done),
        "ack_errors": sum(d["ack_errors"] for d in done),
        "latency_ms_p50": pct(0.50) if total else None,
        "latency_ms_p99": pct(0.99) if total else None,
        "latency_ms_max": keys[-1] / 10 if total else None,
        "latency_ms_min": keys[0] / 10 if total else None,
        "all_subs_ms_median": round(statistics.median(spread) * 1000, 1) if spread else None,
        "all_subs_ms_max": round(spread[-1] * 1000, 1) if spread else None,
        # the first and the last ten messages: does a backlog build up over the window?
        "all_subs_ms_first10": _ms_median(last[:10], send_at[:10]),
        "all_subs_ms_last10": _ms_median(last[-10:], send_at[-10:]),
    }


def _ms_median(last: list[float], sent: list[float]) -> float | None:
    d = [a - b for a, b in zip(last, sent) if a]
    return round(statistics.median(d) * 1000, 1) if d else None


def broadcast_lines(res: dict) -> list[str]:
    """The RESULTS.md section."""
    n, f, a = res["subscriptions"], res["flush"], res["attach_flush"]
    ok = lambda good: "yes" if good else "**no**"  # noqa: E731
    api = ("`message_listener(message, recipients)`, one call per message and process for "
           "every consumer that got it, acknowledged for all of them with one "
           "`recipients.acknowledge(message)`" if res.get("listener_api") == "grouped" else
           "`message_listener(consumer, message)`, `consumer.acknowledge(message)` each")
    threads = ", ".join(f"{k} {v:g}" for k, v in sorted(
        res["client_thread_cpu_s"].items(), key=lambda kv: -kv[1]) if v >= 0.05)
    p99 = res["latency_ms_p99"]
    return [
        f"## Broadcast: {n:,} durable subscriptions on one topic (bench/broadcast.py)", "",
        f"One real etcd + broker process, fresh data dir. {res['processes']} client processes, "
        "each one Client calling `subscribe_many` (Exclusive, \"latest\", receiver queue "
        f"{res['receiver_queue_size']}) for its share of the names, all at one barrier time; "
        f"listener: {api}. Memory: broker VmRSS before attaching and after "
        f"{res['settle_s']:g} s idle. Then one message every {1 / res['rate_per_s']:g} s for "
        f"{res['messages']} messages on a fixed schedule (payload: sequence + send time, "
        "`send_async`, a batch each); latency = listener time - send time, for every delivery. "
        "Cursor flushes from the topic's CursorPointer in etcd (polled every 0.2 s: each save "
        "moves it and records its cursor count). CPU from /proc/<pid>/stat.", "",
        "| measure | result | target | met |", "|---|---:|---:|---|",
        f"| attach {n:,} subscriptions | {res['attach_s']} s ({res['attach_per_s']:,}/s) "
        f"| < 60 s | {ok(res['attach_s'] < 60)} |",
        f"| broker memory per idle subscription | {res['bytes_per_idle_sub']:,} B "
        f"({res['broker_rss_before_mb']} -> {res['broker_rss_idle_mb']} MiB) | < 2 KB | "
        f"{ok(res['bytes_per_idle_sub'] < 2048)} |",
        f"| end-to-end latency p50 / p99 / max | {res['latency_ms_p50']} / {p99} / "
        f"{res['latency_ms_max']} ms | p99 < 1 s | {ok(p99 is not None and p99 < 1000)} |",
        f"| delivered (decoded, acked) | {res['delivered']:,} of {res['expected']:,} "
        f"({res['missing']:,} missing, {res['duplicates']:,} duplicates) | all | "
        f"{ok(res['delivered'] == res['expected'] and not res['missing'])} |",
        f"| cursor flush sustained | {f['cursors_per_s'] or 0:,} cursors/s ({f['saves']} saves "
        f"in {f['window_s']} s, {f['cursors_per_save_mean']:,} cursors each on average, "
        f"{f['full_files']} full files) | | |",
        "", f"- per message, until the last of the {n:,} subscriptions had it: median "
        f"{res['all_subs_ms_median']} ms (first ten messages {res['all_subs_ms_first10']} ms, "
        f"last ten {res['all_subs_ms_last10']} ms), max {res['all_subs_ms_max']} ms; "
        f"{res['listener_calls']:,} listener calls; the producer's receipts (after fsync) "
        f"came {res['send_ack_ms_p50']} ms after `send_async` (median), at most "
        f"{res['send_ack_ms_max']} ms",
        f"- broker CPU: attach {res['broker_attach_cpu_s']} s, idle "
        f"{res['broker_idle_cores']} cores, traffic {res['broker_traffic_cpu_s']} s "
        f"({res['broker_traffic_cores']} cores); etcd: attach {res['etcd_attach_cpu_s']} s, "
        f"traffic {res['etcd_traffic_cpu_s']} s; broker RSS after the traffic "
        f"{res['broker_rss_after_traffic_mb']} MiB",
        f"- clients: attach per process {res['attach_s_per_process']} s "
        f"({res['client_attach_cpu_s']} CPU s in all), ~{res['client_bytes_per_sub']:,} B of "
        f"client RSS per subscription, {res['client_traffic_cpu_s']} CPU s during the traffic "
        f"(CPU s by thread over the processes' lives: {threads}), closing took "
        f"{res['client_close_s']} s per process",
        f"- cursor saves during attach + idle: {a['saves']} ({a['cursors']:,} cursors); "
        f"during the traffic at most {f['cursors_per_save_max']:,} cursors a save, gaps "
        f"between saves median {f['gap_s_median']} s, max {f['gap_s_max']} s (the flusher "
        "waits 1 s between the starts of saves: a longer gap is how long a save took)", ""]


# ---- fanout100: 100 Exclusive subscriptions of a pre-filled topic (consume.py's case) -------

def run_fanout100(peers: str | None, data_dir: str, messages: int = 100_000, payload: int = 100,
                  rounds: int = 3, procs: int = 2, nats_messages: int = 2_000,
                  subs: int = 100, queue_size: int = 1000) -> dict:
    """bench/consume.py's exclusive case with `subs` subscriptions: rounds of (limits.py
    fanout --subs S, ours, nats_jetstream.py --subs S), paired ratios."""
    from consume import run_consume  # bench/consume.py

    res = run_consume(peers, data_dir, messages, payload, rounds, exclusive_subs=subs,
                      exclusive_procs=procs, exclusive_ack="cumulative",
                      nats_messages=nats_messages, queue_size=queue_size,
                      cases=("exclusive",), part="fanout100")
    return {**res["exclusive"], "messages": messages, "payload": payload,
            "nats_messages": nats_messages, "receiver_queue_size": queue_size,
            "prefill_s": res["prefill_s"]}


def fanout100_lines(res: dict) -> list[str]:
    from consume import _fmt, _pct, _x

    n = res["subscriptions"]
    lines = [f"## Fan-out to {n} durable subscriptions (bench/consume.py, exclusive case)", "",
             f"One topic pre-filled with {res['messages']:,} messages of {res['payload']} "
             f"bytes; each round {n} fresh Exclusive subscriptions at \"earliest\" over "
             f"{res['processes']} client processes (one Client each, receiver queue "
             f"{res['receiver_queue_size']}) read every message; only messages received as "
             "decoded `Message`s and acknowledged (cumulatively, the last of each "
             "`batch_receive`) count, and the broker's stats must then show no backlog. "
             f"Alternating rounds: limits.py `--only fanout --subs {n}` "
             "(`grpc_decoded_fanout_msgs_per_s`), ours, nats_jetstream.py "
             f"`--subs {n} --messages {res['nats_messages']:,}` (`fanout_delivered_msgs_per_s`: "
             f"{n} durable pull consumers, fetch 1000, ack the last). Target: half the decoded "
             "ceiling of the same run.", "",
             "| round | ceiling msgs/s | shadowtopic msgs/s | of ceiling | NATS msgs/s | x NATS "
             "| CPU us/msg client | CPU us/msg broker |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(res["rounds"], 1):
        lines.append(f"| {i} | {_fmt(r['ceiling'])} | {r['msgs_per_s']:,} | {_pct(r['ratio'])} "
                     f"| {_fmt(r['nats'])} | {_x(r['nats_ratio'])} | "
                     f"{r['client_cpu_us_per_msg']} | {r['broker_cpu_us_per_msg']} |")
    lines += ["", f"- median round: {res['median_msgs_per_s']:,.0f} msgs/s delivered and acked"]
    if res["median_ratio"] is not None:
        lines.append(f"- median of the paired ratios to the decoded fan-out ceiling: "
                     f"**{res['median_ratio']:.1%}** (target 50%)")
    if res["median_nats_ratio"] is not None:
        lines.append(f"- median of the paired ratios to NATS JetStream: "
                     f"**{res['median_nats_ratio']:.1f}x**")
    return lines + [""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--subs", type=int, default=100_000)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=1.0, help="messages per second")
    p.add_argument("--receiver-queue", type=int, default=1000)
    p.add_argument("--settle", type=float, default=5.0,
                   help="seconds idle after attaching before reading the broker's RSS")
    p.add_argument("--profile", default=None,
                   help="run the broker under cProfile (its whole life) and dump its stats "
                        "to this path; the timings are then the profiler's")
    a = p.parse_args()
    base = os.path.join(ROOT, "data", "bench")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        res = run_broadcast(d, a.subs, a.procs, a.duration, a.rate, a.receiver_queue, a.settle,
                            profile=os.path.abspath(a.profile) if a.profile else None)
    print(json.dumps(res))
    print("\n".join(broadcast_lines(res)))


if __name__ == "__main__":
    main()
