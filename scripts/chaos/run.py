"""The chaos driver: `python -m scripts.chaos.run --cycles 20 --seed 1` (`make chaos`).

Starts a private cluster (scripts/chaos/cluster.py), a source topic with two shadows, two
producers and a durable subscriber on the source and on each shadow (workload.py). Then, N
cycles (and at most --max-minutes): producers run; maybe a compaction is requested; one fault
(SIGKILL then restart on the same data dir, or SIGSTOP for a few seconds then SIGCONT) hits
the source broker, the shadow broker, the compaction worker or etcd; the recovery time is
measured (from the restart / SIGCONT until the process serves and every subscriber has
everything acked by a send started after it); producers run on, then stop; every subscriber
must reach the tail within --catchup seconds; a compaction is run; the checker
(checks.py) compares what was delivered and the compacted views with what was acked.
Failures are printed (once each) as they are found; the exit code is 1 if there was any.
The figures go to the generated section of docs/CHAOS.md (report.py).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time

from scripts.chaos import checks, report
from scripts.chaos.cluster import TARGETS, Cluster
from scripts.chaos.workload import Workload, read_compacted, request_compaction, wait_compaction
from shadowtopic.client import Client

TOPIC = "persistent://public/chaos/events"
SHADOWS = [TOPIC + "-shadow-a", TOPIC + "-shadow-b"]
#: the faults of an --s3 run: the machine lost (SIGKILL, then its disk wiped) of the source
#: broker (its WAL on S3) three times in a block of six, of the shadow broker once
LOST_KINDS = [("source", "lost"), ("source", "lost"), ("source", "lost"), ("shadow", "lost"),
              ("source", "pause"), ("etcd", "kill")]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    p.add_argument("--max-minutes", type=float, default=25.0, help="total time bound")
    p.add_argument("--catchup", type=float, default=30.0,
                   help="seconds a subscriber has to reach the tail after a fault")
    p.add_argument("--dup-window", type=float, default=2.0,
                   help="at-least-once window (s): a redelivered message must have been "
                        "delivered at most this long before its session ended, or during a "
                        "fault (widened by this much on both sides); default: the 1 s cursor "
                        "flush interval + 1 s")
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--keys", type=int, default=20, help="keys per producer")
    p.add_argument("--interval", type=float, default=0.01, help="pause between sends (s)")
    p.add_argument("--spark-master", default="local[1]")
    p.add_argument("--lease-ttl", type=int, default=3)
    p.add_argument("--s3", action="store_true",
                   help="the storage root and the source broker's WAL on an S3 server "
                        "(moto), and the 'lost' fault: a broker's machine lost with its disk")
    p.add_argument("--docs", default="docs/CHAOS.md", help="'' to write no figures")
    p.add_argument("--keep", action="store_true", help="keep the data root (kept on failure)")
    return p.parse_args(argv)


class Run:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.failures: dict[str, int] = {}
        self.recovery: dict[str, list[float]] = {}
        self.compactions: list[tuple[str, float]] = []   # (phase, seconds)
        self.disruptions: list[tuple[float, float]] = []  # (fault start, recovered)
        self.mid_jobs: list[str] = []    # how the jobs requested just before a fault ended
        self.cycle = 0

    def fail(self, text: str) -> None:
        if text not in self.failures:
            self.failures[text] = self.cycle
            print(f"  FAIL (cycle {self.cycle}): {text}", flush=True)

    # ---- one fault -----------------------------------------------------------------------

    def fault(self, cl: Cluster, wl: Workload, rng: random.Random, target: str,
              action: str) -> tuple[float, float | None]:
        """Inject, heal; returns (down seconds, recovery seconds or None when it failed)."""
        t_fault = time.monotonic()
        down, rec = self._fault(cl, wl, rng, target, action)
        end = time.monotonic() if rec is None else t_fault + down + rec
        self.disruptions.append((t_fault, end))
        return down, rec

    def _fault(self, cl: Cluster, wl: Workload, rng: random.Random, target: str,
               action: str) -> tuple[float, float | None]:
        if action in ("kill", "lost"):
            down = rng.uniform(0.0, 2.0)
            if action == "lost":
                cl.lose(target)
            else:
                cl.kill(target)
            time.sleep(down)
            t_heal = time.monotonic()
            try:
                cl.restart(target)
            except (RuntimeError, OSError) as exc:
                self.fail(f"{target} did not restart after the kill: {exc}")
                return down, None
        else:
            down = rng.uniform(2.0, 5.0)
            cl.pause(target)
            time.sleep(down)
            t_heal = time.monotonic()
            cl.resume(target)
        start_bound = 240.0 if target == "worker" else 60.0
        while not cl.serving(target):
            code = cl.exited(target)
            if code is not None:
                self.fail(f"{target} exited with {code} after the {action}; the end of "
                          f"{cl.log_path(target)}:\n{cl.log_tail(target)}")
                return down, None
            if time.monotonic() - t_heal > start_bound:
                self.fail(f"{target} not serving {start_bound:g} s after the {action}")
                return down, None
            time.sleep(0.1)
        t_up = time.monotonic()
        if target == "worker":   # the data path does not go through it
            return down, t_up - t_heal
        targets = None
        while True:
            now = time.monotonic()
            if targets is None:
                got = wl.acked_since(t_heal)
                if all(x is not None for x in got):
                    targets = got
            if targets is not None and not wl.behind(targets):
                return down, now - t_heal
            if now - t_up > self.a.catchup:
                what = (f"behind {wl.behind(targets)}" if targets is not None else
                        f"producers acked nothing new (acked since: {wl.acked_since(t_heal)})")
                self.fail(f"not recovered {self.a.catchup:g} s after the {action} of {target} "
                          f"was healed: {what}")
                return down, None
            time.sleep(0.05)

    # ---- the checks of a cycle -----------------------------------------------------------

    def check(self, cl: Cluster, wl: Workload) -> dict:
        out: dict = {}
        deadline = time.monotonic() + self.a.catchup
        while wl.behind() and time.monotonic() < deadline:
            time.sleep(0.1)
        if wl.behind():
            self.fail(f"subscribers not at the tail {self.a.catchup:g} s after producers "
                      f"stopped: {wl.behind()}")
        horizon = None
        try:
            t0 = time.monotonic()
            job = request_compaction(cl.url("source"), TOPIC, timeout=240)
            st = wait_compaction(cl.url("source"), TOPIC, job, timeout=240)
            self.compactions.append((st.phase, time.monotonic() - t0))
            horizon = str(st.horizon) if st.phase == "done" and st.horizon else None
            if st.phase != "done":
                self.fail(f"compaction job {job} (producers stopped, no fault running) "
                          f"ended {st.phase}: {st.error!r}")
        except Exception as exc:
            self.fail(f"compaction at the end of a cycle: {exc!r}")
        sends, deliveries, ends = wl.snapshot()
        for name, topic, url in [("source", TOPIC, cl.url("source"))] + [
                (f"shadow-{s[-1]}", s, cl.url("shadow")) for s in SHADOWS]:
            try:
                msgs = read_compacted(url, topic, timeout=60)
                for f in checks.check_compacted(f"compacted {name}", sends, msgs, horizon):
                    self.fail(f)
            except Exception as exc:
                self.fail(f"compacted read of {name}: {exc!r}")
        out["subs"] = []
        for name in wl.subscribers:
            rep = checks.check_subscriber(name, sends, deliveries[name], ends[name],
                                          self.a.dup_window, self.disruptions)
            for f in rep.failures():
                self.fail(f)
            out["subs"].append(rep)
        out["acked"] = sum(1 for s in sends if s.status == "acked")
        out["unknown"] = sum(1 for s in sends if s.status == "unknown")
        return out

    # ---- the run -------------------------------------------------------------------------

    def main(self) -> int:
        a = self.a
        seed = a.seed if a.seed is not None else random.randrange(1 << 30)
        a.seed = seed
        rng = random.Random(seed)
        kinds = [(t, act) for t in TARGETS for act in ("kill", "pause")]
        if a.s3:  # the machine-lost fault first of all: half of every block
            kinds = LOST_KINDS
        plan = []
        while len(plan) < a.cycles:
            block = list(kinds)
            rng.shuffle(block)
            plan += block
        root = tempfile.mkdtemp(prefix="shadowtopic-chaos-")
        print(f"chaos: seed {seed}, {a.cycles} cycles, at most {a.max_minutes:g} min, "
              f"data root {root}", flush=True)
        t_begin, started = time.monotonic(), time.time()
        # Ctrl-C and SIGTERM unwind through the ExitStack (every process killed), even when
        # started in the background with SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _interrupted)
        # the hard bound: a cycle is bounded, but never run far past --max-minutes
        signal.signal(signal.SIGALRM, _too_long)
        signal.alarm(int(a.max_minutes * 60 + 300))
        last: dict = {}
        with contextlib.ExitStack() as stack:
            cl = Cluster(root, lease_ttl=a.lease_ttl, spark_master=a.spark_master, s3=a.s3)
            stack.callback(cl.close)
            cl.start()
            with Client(cl.url("source"), timeout=10) as c:
                c.admin.create_topic(TOPIC)
                for s in SHADOWS:
                    c.admin.create_shadow_topic(s, TOPIC)
            subs = {"source": (TOPIC, cl.url("source"))}
            subs.update({f"shadow-{s[-1]}": (s, cl.url("shadow")) for s in SHADOWS})
            wl = Workload(TOPIC, cl.url("source"), subs, producers=a.producers, keys=a.keys,
                          interval=a.interval, seed=seed)
            stack.callback(wl.stop)
            stack.callback(lambda: report.dump(os.path.join(root, "records.json"), wl))
            wl.start()
            print(f"cluster up in {time.monotonic() - t_begin:.0f} s "
                  f"(logs in {cl.logs})", flush=True)
            for i, (target, action) in enumerate(plan[:a.cycles], 1):
                if time.monotonic() - t_begin > a.max_minutes * 60:
                    print(f"time bound reached after {i - 1} cycles", flush=True)
                    break
                self.cycle = i
                t_cycle = time.monotonic()
                wl.resume_producers()
                pre = rng.uniform(1.0, 4.0)
                # a compaction 0-0.5 s before the fault (so a kill of the worker or the source
                # broker lands mid-job): always for those, in half of the other cycles
                lead = rng.uniform(0.0, 0.5)
                compact = target in ("worker", "source") or rng.random() < 0.5
                time.sleep(pre - lead if compact else pre)
                job = None
                if compact:
                    with contextlib.suppress(Exception):
                        job = request_compaction(cl.url("source"), TOPIC, timeout=2)
                    time.sleep(lead)
                down, rec = self.fault(cl, wl, rng, target, action)
                if rec is not None:
                    self.recovery.setdefault(f"{action} {target}", []).append(rec)
                time.sleep(rng.uniform(1.0, 2.0))
                if not wl.pause_producers(timeout=15):
                    self.fail("producers still sending 15 s after they were told to stop")
                for t in TARGETS:
                    code = cl.exited(t)
                    if code is not None:
                        self.fail(f"{t} exited by itself ({code}): {cl.log_tail(t, 10)}")
                        with contextlib.suppress(Exception):
                            cl.restart(t)
                mid_job = "-"
                if job is not None:
                    try:
                        st = wait_compaction(cl.url("source"), TOPIC, job, timeout=240)
                        mid_job = st.phase
                        self.mid_jobs.append(st.phase)
                    except Exception as exc:
                        self.fail(f"compaction job {job}, requested before the {action} of "
                                  f"{target}: {exc!r}")
                last = self.check(cl, wl)
                reps = last["subs"]
                print(f"cycle {i}/{a.cycles}: {action} {target} (down {down:.1f} s) "
                      f"recovery {'-' if rec is None else f'{rec:.1f} s'}; acked {last['acked']}"
                      f" unknown {last['unknown']}; delivered "
                      f"{'/'.join(str(r.delivered) for r in reps)}; lost "
                      f"{sum(len(r.lost) for r in reps)}; dups "
                      f"{sum(r.dup_ok + len(r.dup_bad) for r in reps)}; "
                      f"job before the fault {mid_job}; "
                      f"{time.monotonic() - t_cycle:.0f} s", flush=True)
            wl.stop()
            stalls, errs = list(wl.stalls), len(wl.errors)
        elapsed = time.monotonic() - t_begin
        summary = report.summarize(self, last, stalls, errs, seed, started, elapsed, a)
        print(report.text(summary), flush=True)
        if a.docs:
            report.write_docs(a.docs, summary, s3=a.s3)
            print(f"figures written to {a.docs}")
        if self.failures:
            print(f"\nchaos: {len(self.failures)} check(s) FAILED (seed {seed}):", file=sys.stderr)
            for f, c in self.failures.items():
                print(f"  cycle {c}: {f}", file=sys.stderr)
            print(f"data root and logs kept in {root}", file=sys.stderr)
            return 1
        if a.keep:
            print(f"data root kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
        print("chaos: all checks passed")
        return 0


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _too_long(signum, frame):
    raise TimeoutError("the chaos run went 5 minutes past --max-minutes; stopping")


def main(argv=None) -> int:
    return Run(parse_args(argv)).main()


if __name__ == "__main__":
    sys.exit(main())
