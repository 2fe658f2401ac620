"""The figures of a chaos run: `summarize` (a dict), `text` (what is printed) and
`write_docs` (the generated section of docs/CHAOS.md, between the markers below; the rest of
the file, the hand-written introduction, is kept)."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import sys

from scripts.chaos.checks import median

BEGIN = "<!-- chaos:generated:begin (scripts/chaos/report.py overwrites this section) -->"
END = "<!-- chaos:generated:end -->"


def _machine() -> str:
    ram = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(l for l in f if l.startswith("MemTotal")).split()[1])
        ram = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} CPUs (nproc), {ram} RAM, Python {sys.version.split()[0]}; "
            f"load average {load} (1/5/15 min) when the run ended")


def summarize(run, last: dict, stalls: list[str], errs: int, seed: int, started: float,
              elapsed: float, a) -> dict:
    subs = last.get("subs", [])
    return {
        "date": datetime.datetime.fromtimestamp(started).astimezone().isoformat(timespec="seconds"),
        "machine": _machine(),
        "seed": seed,
        "command": (f"make chaos CYCLES={a.cycles} SEED={seed}   "
                    f"(python -m scripts.chaos.run {shlex.join(sys.argv[1:])})"),
        "cycles": run.cycle,
        "elapsed": elapsed,
        "acked": last.get("acked", 0),
        "unknown": last.get("unknown", 0),
        "subs": [(r.name, r.delivered, len(r.lost), r.dup_ok, len(r.dup_bad),
                  r.max_redelivery_age) for r in subs],
        "lost": sum(len(r.lost) for r in subs),
        "dups": sum(r.dup_ok + len(r.dup_bad) for r in subs),
        "stored_twice": sum(len(r.stored_twice) for r in subs),
        "recovery": {k: (len(v), median(v), max(v)) for k, v in sorted(run.recovery.items())},
        "compactions": run.compactions,
        "mid_jobs": run.mid_jobs,
        "stalls": stalls,
        "client_errors": errs,
        "failures": [(c, f) for f, c in run.failures.items()],
    }


def dump(path: str, wl) -> None:
    """Everything the workload recorded, as JSON (for a failure's post-mortem)."""
    sends, deliveries, ends = wl.snapshot()
    with open(path, "w") as f:
        json.dump({"sends": [dataclasses.asdict(s) for s in sends],
                   "deliveries": {n: [dataclasses.astuple(d) for d in ds]
                                  for n, ds in deliveries.items()},
                   "session_ends": ends, "session_reasons": wl.session_reasons,
                   "stalls": wl.stalls, "errors": wl.errors}, f,
                  default=lambda o: o.decode("utf-8", "replace"))


def _table(s: dict) -> list[str]:
    lines = ["| subscriber | delivered | lost | duplicates (in window / outside) | "
             "oldest redelivery (s) |", "|---|---|---|---|---|"]
    for name, n, lost, ok, bad, age in s["subs"]:
        lines.append(f"| {name} | {n} | {lost} | {ok} / {bad} | {age:.1f} |")
    lines += ["", "| fault | n | recovery median (s) | max (s) |", "|---|---|---|---|"]
    for kind, (n, med, mx) in s["recovery"].items():
        lines.append(f"| {kind} | {n} | {med:.1f} | {mx:.1f} |")
    return lines


def text(s: dict) -> str:
    comp = s["compactions"]
    done = [t for p, t in comp if p == "done"]
    out = [f"\nchaos summary: {s['cycles']} cycles in {s['elapsed'] / 60:.1f} min, seed "
           f"{s['seed']}; acked {s['acked']}, unknown {s['unknown']}, lost {s['lost']}, "
           f"duplicates {s['dups']}, stored twice {s.get('stored_twice', 0)}; "
           f"compactions {len(done)} done of {len(comp)}"
           + (f" (median {median(done):.1f} s)" if done else "")
           + f"; jobs hit by a fault {len(s['mid_jobs'])} ({s['mid_jobs'].count('done')} done)"
           + f"; stalled subscribers reopened {len(s['stalls'])}", *_table(s)]
    out += [f"stall: {x}" for x in s["stalls"][:10]]
    return "\n".join(out)


def markers(s3: bool) -> tuple[str, str]:
    """The generated section's markers: one section for each kind of run."""
    if not s3:
        return BEGIN, END
    return BEGIN.replace("chaos:", "chaos-s3:"), END.replace("chaos:", "chaos-s3:")


def write_docs(path: str, s: dict, s3: bool = False) -> None:
    comp = s["compactions"]
    done = [t for p, t in comp if p == "done"]
    begin, end = markers(s3)
    title = ("## Last run on S3, with the machine-lost fault (generated)" if s3
             else "## Last run (generated)")
    body = [begin, "", title, "",
            f"- date: {s['date']}",
            f"- machine: {s['machine']}",
            f"- command: `{s['command']}`",
            f"- seed: {s['seed']}",
            f"- cycles: {s['cycles']} in {s['elapsed'] / 60:.1f} min",
            f"- sends acknowledged: {s['acked']}; unknown (the send raised): {s['unknown']}",
            f"- acknowledged messages lost: {s['lost']} (summed over the subscribers)",
            f"- duplicates: {s['dups']} (summed over the subscribers: redeliveries of one "
            "stored message)",
            f"- duplicates from producer retries (a send stored twice, under two ids): "
            f"{s.get('stored_twice', 0)}",
            f"- end-of-cycle compactions: {len(done)} done of {len(comp)}"
            + (f", median {median(done):.1f} s, max {max(done):.1f} s" if done else ""),
            f"- compactions requested 0-0.5 s before a fault: {len(s['mid_jobs'])}, "
            f"{s['mid_jobs'].count('done')} done, {s['mid_jobs'].count('failed')} failed",
            f"- stalled subscribers reopened by the driver: {len(s['stalls'])}",
            "- result: " + ("**all checks passed**" if not s["failures"] else
                             f"**{len(s['failures'])} check(s) failed**"),
            "", *_table(s), ""]
    if s["failures"]:
        body += ["Failures:", ""]
        body += [f"- cycle {c}: `{f.splitlines()[0]}`" for c, f in s["failures"]] + [""]
    body.append(end)
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = "# Chaos run\n\n" + begin + "\n" + end + "\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1]
    else:
        head, tail = old.rstrip("\n") + "\n\n", "\n"
    with open(path, "w") as f:
        f.write(head + "\n".join(body) + tail)
