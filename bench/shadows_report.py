"""RESULTS.md sections of bench/shadows.py (`shadows_lines`) and bench/shadows_scale.py
(`scale_lines`), from their result documents."""
from __future__ import annotations


def ok(good: bool | None) -> str:
    return "-" if good is None else ("yes" if good else "**no**")


def _n(v, fmt: str = ",") -> str:
    return "-" if v is None else format(v, fmt)


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1%}"


def load(res: dict) -> str:
    a, b = res.get("load_start"), res.get("load_end")
    if not a:
        return ""
    f = lambda v: " / ".join(f"{x:.2f}" for x in v)  # noqa: E731
    return (f" Load average (1 / 5 / 15 min) when this section started: {f(a)}"
            + (f"; when it ended: {f(b)}" if b else "") + " (2 cores).")


def shadows_lines(res: dict) -> list[str]:
    lines = ["## Shadow topics (bench/shadows.py)", "",
             "One real etcd, a source broker and a shadow broker "
             "(`python -m shadowtopic.shadow.broker`) on "
             "one shared storage root, as `make run` runs them: every shadow is served by the "
             "one shadow broker process. The client names the source broker; Lookup routes "
             "shadows to the shadow broker. 100-byte payloads. CPU from /proc/<pid>/stat."
             + load(res), ""]
    summary = ["| measure | result | target | met |", "|---|---|---|---|"]
    body: list[str] = []
    cr, lat, cu, cpu = (res.get(k) for k in ("create", "latency", "catchup", "cpu"))
    if cr:
        clean = not cr["new_files"]
        summary.append(f"| create a shadow of a source holding {cr['messages']:,} messages "
                       f"(median / max of {cr['reps']}) | {cr['ms_median']} / {cr['ms_max']} ms"
                       f" | < 50 ms | {ok(cr['ms_max'] < 50)} |")
        summary.append(f"| files written by creating the shadows | {len(cr['new_files'])} "
                       f"({len(cr['shadow_files'])} under a shadow's name) | none | "
                       f"{ok(clean)} |")
        body += ["### Create a shadow of a large source", "",
                 f"The source was filled by 4 producer processes ({cr['messages']:,} messages, "
                 f"{cr['fill_msgs_per_s']:,} msgs/s; {cr['stats_internal_ledgers']} ledger(s) "
                 f"after the fill); then `admin.create_shadow_topic` {cr['reps']} times with "
                 f"fresh names, timed around the call: {', '.join(map(str, cr['ms']))} ms. "
                 + (f"The source's `replicator_auto_reset_backlog_entries` was "
                    f"{cr['auto_reset']:,}: a new shadow's replicator starts at the tail (the "
                    "shadow reads the history from the ledgers anyway) instead of replaying "
                    "the ids of the whole history (see the notes below). "
                    if cr.get("auto_reset") else "")
                 + f"The storage root and the shadow broker's data dir ({cr['files_before']} "
                 "files) were listed before the first create and 2 s after the last (the "
                 "replicators had started and the shadow broker had loaded the shadows): "
                 + ("no new file." if clean else f"new files: {cr['new_files'][:5]}."), ""]
    if lat:
        p1, p4, p0 = (lat.get(f"median_p99_ms_{n}") for n in (1, 4, 0))
        for n, p in ((1, p1), (4, p4)):
            if p is not None:
                summary.append(f"| produce -> shadow reader p50 / p99, {n} shadow{'s' * (n > 1)}"
                               f" at {lat['rate']:,} msgs/s (median round) | "
                               f"{lat.get(f'median_p50_ms_{n}')} / {p} ms | p99 < 10 ms | "
                               f"{ok(p < 10)} |")
        if p0 is not None:
            summary.append(f"| the same on a reader of the source itself (baseline) | "
                           f"{lat.get('median_p50_ms_0')} / {p0} ms | | |")
        body += ["### Produce -> shadow reader latency", "",
                 f"A paced producer process sends {lat['rate']:,} msgs/s for {lat['seconds']:g} "
                 f"s per case: every {lat['tick_ms']:g} ms one batch (`send_async`, "
                 "`batch_max_messages` = the batch, so nothing lingers), payload = sequence + "
                 "send time. One reader per shadow \"from latest\" in one client process (a "
                 "thread each); latency = when `read_next` returned - send time, every message "
                 "of every reader after the first second. Each case is a source of its own "
                 "with that many shadows; cases alternate within each round. `ack` is the "
                 "producer's receipt (after fsync) of the first message of each batch.", "",
                 "| round | case | p50 ms | p99 ms | p99.9 ms | max ms | ack p50 / p99 ms | "
                 "sent msgs/s | missing | source broker cores | shadow broker cores |",
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for i, row in enumerate(lat["rounds"], 1):
            for n in sorted(row, key=int):
                x = row[n]
                case = "source reader" if int(n) == 0 else f"{n} shadow(s)"
                body.append(f"| {i} | {case} | {x['p50_ms']} | {x['p99_ms']} | {x['p999_ms']} "
                            f"| {x['max_ms']} | {x['ack_p50_ms']} / {x['ack_p99_ms']} | "
                            f"{x['rate']:,} | {x['missing']} | {x['src_cores']} | "
                            f"{x['sh_cores']} |")
        body += ["", "- median of the paired p99 ratios shadow / source reader: 1 shadow "
                 f"{lat.get('median_p99_over_source_1')}x, 4 shadows "
                 f"{lat.get('median_p99_over_source_4')}x", ""]
    if cu:
        r = cu.get("median_nats_ratio")
        summary.append(f"| a new shadow reads {cu['messages']:,} historic messages (create -> "
                       f"last read, median) | {cu['median_s']} s, {_n(r)}x NATS's mirror "
                       "catch-up | >= 2x faster than NATS | "
                       f"{ok(r >= 2 if r is not None else None)} |")
        summary.append(f"| ... of which: the shadow serves the whole history (create -> its "
                       f"last id = the source's) | {round(cu['median_serving_s'] * 1000, 1)} ms"
                       f", {_n(cu.get('median_nats_serving_ratio'))}x faster than NATS's "
                       "mirror | | |")
        body += ["### A new shadow reads the history", "",
                 f"The source holds {cu['messages']:,} messages. Each round: "
                 "`create_shadow_topic` of a fresh shadow, poll the shadow's last message id "
                 "(`admin.last_message_id`) until it is the source's (`serving`), then a reader "
                 f"\"from earliest\" (receiver queue {cu['receiver_queue']}, in this process) "
                 "reads to the last message; `total` = create -> last read. Then the same "
                 "reader on the source itself (`source read`, the client's own speed). NATS: "
                 f"nats_jetstream.py `--messages {cu['messages']} --subs 0`, "
                 "`mirror_catch_up_s` (a mirror stream created on a stream of that many "
                 "messages, until it holds them all), alternating with ours.", "",
                 "| round | create ms | serving ms | read s | total s | source read s | "
                 "client us/msg | NATS mirror s | NATS / total | NATS / serving |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for i, x in enumerate(cu["rounds"], 1):
            body.append(f"| {i} | {x['create_s'] * 1000:.1f} | {x['serving_s'] * 1000:.1f} | "
                        f"{x['read_s']} | {x['seconds']} | {x['source_read_s']} | "
                        f"{x['client_us_per_msg_source_read']} | {_n(x['nats_s'])} | "
                        f"{_n(x['nats_ratio'])} | {_n(x['nats_serving_ratio'])} |")
        body.append("")
    if cpu:
        counts = cpu["counts"]
        per = {n: cpu[f"median_src_us_per_msg_{n}"] for n in counts}
        base = per.get(counts[0])
        extra = {n: cpu.get(f"median_src_extra_us_{n}") for n in counts[1:]}
        ns = [n for n in counts[1:] if extra.get(n) is not None]
        # sub-linear: doubling the shadows (the last two cases, 4 -> 8) adds clearly less
        # than double the source's extra CPU (at most 1.6x)
        sub = growth = None
        if len(ns) >= 2 and extra[ns[-2]]:
            growth = extra[ns[-1]] / extra[ns[-2]]
            sub = growth <= 0.8 * ns[-1] / ns[-2]
        summary.append("| source broker CPU per produced message, " + " / ".join(
            f"{n}" for n in counts) + " shadows (median) | " + " / ".join(
            f"{per[n]}" for n in counts) + " us" + (
            f"; its extra over no shadows grows {growth:.2f}x from {ns[-2]} to {ns[-1]} "
            "shadows" if growth else "") + " | sub-linear growth (from 4 to 8 shadows the "
            "extra grows <= 1.6x) | " + ok(sub) + " |")
        summary.append("| shadow broker CPU per produced message, same cases | " + " / ".join(
            f"{cpu[f'median_sh_us_per_msg_{n}']}" for n in counts) + " us | | |")
        body += ["### Source broker CPU per message with 0 - 8 shadows", "",
                 f"Each case: a fresh source with N shadows, each with one reader following the "
                 f"tail (one client process, a thread per reader); this process produces "
                 f"{cpu['messages']:,} messages at full speed (`send_async`, default batching). "
                 "CPU of each broker from the first send until every reader had the last "
                 "message, minus its idle rate (measured for 2 s just before) over that "
                 "window. Cases alternate within each round.", "",
                 "| round | shadows | produce s | window s | source us/msg | shadow broker "
                 "us/msg | source extra over 0 shadows, us/msg per shadow |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for i, row in enumerate(cpu["rounds"], 1):
            zero = row.get(counts[0], row.get(str(counts[0])))
            for n in counts:
                x = row.get(n, row.get(str(n)))
                each = round((x["src_us_per_msg"] - zero["src_us_per_msg"]) / n, 2) if n \
                    else "-"
                body.append(f"| {i} | {n} | {x['produce_s']} | {x['window_s']} | "
                            f"{x['src_us_per_msg']} | {x['sh_us_per_msg']} | {each} |")
        if base is not None and ns:
            body += ["", "- the source's extra CPU per message over no shadows (median of the "
                     "paired differences): " + ", ".join(
                         f"{n} shadows +{extra[n]} us ({extra[n] / n:.2f} us per shadow)"
                         for n in ns)]
        body.append("")
    remote_lines(res, summary, body)
    return lines + summary + [""] + body


def remote_lines(res: dict, summary: list[str], body: list[str]) -> None:
    """Issue 21's cases: latency with the shadow broker on its own data dir and WAL dir (the
    unsealed tail over gRPC) and a catch-up from sealed ledgers in an s3:// root."""
    lat, cu = res.get("latency_remote"), res.get("catchup_s3")
    if lat:
        for n in (1, 4):
            r = lat.get(f"median_p99_over_beside_{n}")
            if r is not None:
                summary.append(
                    f"| tail over gRPC (own WAL dir): produce -> reader p50 / p99, {n} "
                    f"shadow{'s' * (n > 1)} / a reader of the source beside them, "
                    f"{lat['rate']:,} msgs/s (median of {len(lat['rounds'])} rounds) | "
                    f"{lat.get(f'median_p50_ms_{n}')} / {lat.get(f'median_p99_ms_{n}')} ms / "
                    f"{lat.get(f'median_beside_p50_ms_{n}')} / "
                    f"{lat.get(f'median_beside_p99_ms_{n}')} ms: p99 {r}x (to the source "
                    f"reader alone, {lat.get('median_p99_ms_0')} ms: "
                    f"{lat.get(f'median_p99_over_source_{n}')}x) | p99 <= 1.5x the source "
                    f"reader's | {ok(r <= 1.5)} |")
        body += ["### Latency with the shadow broker as another machine (the tail over gRPC)",
                 "", "As the latency cases above, on a cluster of its own where the source "
                 "broker and the shadow broker each have their own data dir and `--wal-dir` "
                 "(sealed ledgers in one storage root): the shadow broker reads no file of the "
                 "source's WAL and gets the unsealed tail from the replicator's `raw` entries "
                 "(one tail cache per source) and `Storage.ReadEntries` on the source broker. "
                 "In each shadow case a reader of the source itself runs beside the shadows' "
                 "readers, in the same client process: \"beside\" is its p99 under the same "
                 "load, the target's reference; \"alone\" is the source reader's own case.",
                 "", "| round | case | p50 ms | p99 ms | p99.9 ms | max ms | source reader "
                 "beside: p50 / p99 ms | p99 / beside | p99 / alone | sent msgs/s | late ticks "
                 "| missing | source broker cores | shadow broker cores |",
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for i, row in enumerate(lat["rounds"], 1):
            base = row.get(0, row.get("0"))
            for n in sorted(row, key=int):
                x = row[n]
                case = "source reader alone" if int(n) == 0 else f"{n} shadow(s)"
                alone = round(x["p99_ms"] / base["p99_ms"], 2) if int(n) and base else "-"
                near = f"{x['beside_p50_ms']} / {x['beside_p99_ms']}" \
                    if "beside_p99_ms" in x else "-"
                ratio = round(x["p99_ms"] / x["beside_p99_ms"], 2) \
                    if x.get("beside_p99_ms") else "-"
                body.append(f"| {i} | {case} | {x['p50_ms']} | {x['p99_ms']} | "
                            f"{x['p999_ms']} | {x['max_ms']} | {near} | {ratio} | {alone} | "
                            f"{x['rate']:,} | {x['late_ticks']} | {x['missing']} | "
                            f"{x['src_cores']} | {x['sh_cores']} |")
        body.append("")
    if cu:
        summary.append(f"| a new shadow reads {cu['messages']:,} messages from sealed ledgers "
                       f"in an s3:// root (moto's server; create -> last read, median) | "
                       f"{cu['median_s']} s (serving after "
                       f"{round(cu['median_serving_s'] * 1000, 1)} ms) | | |")
        body += ["### A new shadow reads the history from the object store", "",
                 f"As the catch-up above (no NATS), on a cluster of its own whose storage root "
                 f"is `s3://` on moto's S3 server (a process on a loopback port), every broker "
                 f"with its own data dir and `--wal-dir`; the source's `ledger_max_bytes` is "
                 f"{_n(cu.get('ledger_max_bytes'))} so the history is in "
                 f"{_n(cu.get('ledgers'))} ledgers, all but the last sealed into the bucket.",
                 "", "| round | create ms | serving ms | read s | total s | msgs/s | source "
                 "read s |", "|---|---:|---:|---:|---:|---:|---:|"]
        for i, x in enumerate(cu["rounds"], 1):
            body.append(f"| {i} | {x['create_s'] * 1000:.1f} | {x['serving_s'] * 1000:.1f} | "
                        f"{x['read_s']} | {x['seconds']} | {x['msgs_per_s']:,} | "
                        f"{x['source_read_s']} |")
        body.append("")


def scale_lines(res: dict) -> list[str]:
    lines = ["## Fan-out and broadcast over shadow topics (bench/shadows_scale.py)", "",
             "The broadcast issue's figures with the subscriptions on shadows: one real etcd, "
             "a source broker and ONE shadow broker process serving every shadow (as "
             "`make run`), one storage root." + load(res), ""]
    fan, bc = res.get("fanout"), res.get("broadcast")
    if fan:
        r = fan["median_ratio"]
        lines += [f"### (a) {fan['subs']} durable subscriptions: 1 source -> {fan['shadows']} "
                  f"shadows x {fan['subs'] // fan['shadows']}", "",
                  f"The source holds {fan['messages']:,} messages of {fan['payload']} bytes. "
                  f"Each round {fan['subs'] // fan['shadows']} fresh Exclusive subscriptions at "
                  f"\"earliest\" on each shadow, over {fan['procs']} client processes (each "
                  "serves whole shadows), `batch_receive(500)` and a cumulative ack of the "
                  "last (bench/consume.py's exclusive case); only decoded and acknowledged "
                  "messages count, and every shadow's stats must then show no backlog. "
                  f"Alternating: limits.py `--only fanout --subs {fan['subs']}` "
                  f"(`grpc_decoded_fanout_msgs_per_s`), ours over the shadows, then the same "
                  f"{fan['subs']} subscriptions on the source itself (fanout100's layout).", "",
                  "| round | ceiling msgs/s | over shadows msgs/s | of ceiling | on the source "
                  "msgs/s | shadows / source | client us/msg | shadow broker us/msg | source "
                  "broker us/msg |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for i, x in enumerate(fan["rounds"], 1):
            lines.append(f"| {i} | {_n(x['ceiling'])} | {x['msgs_per_s']:,} | "
                         f"{_pct(x['ratio'])} | "
                         f"{x['source_msgs_per_s']:,} | {x['source_ratio']:.2f} | "
                         f"{x['client_cpu_us_per_msg']} | {x['sh_cpu_us_per_msg']} | "
                         f"{x['src_cpu_us_per_msg']} |")
        lines += ["", f"- median round: {fan['median_msgs_per_s']:,.0f} msgs/s delivered and "
                  "acked over the shadows"]
        if r is not None:
            lines.append(f"- median of the paired ratios to the decoded fan-out ceiling: "
                         f"**{r:.1%}** (target 50%: {ok(r >= 0.5)})")
        lines += [f"- median of the paired ratios to the same subscriptions on the source: "
                  f"**{fan['median_source_ratio']:.2f}x**", ""]
    if bc:
        s, sh = bc["source"], bc["on_shadows"]
        mem = bc["bytes_per_idle_sub"]
        p99 = bc["latency_ms_p99"]
        cpu = bc["cpu_ms_per_msg"]
        lines += [f"### (b) {bc['subscriptions']:,} subscriptions over the source and "
                  f"{bc['shadows']} shadows ({bc['per_topic']:,} each)", "",
                  f"One client process per topic ({bc['processes']}), each `subscribe_many` "
                  f"(Exclusive, \"latest\", receiver queue {bc['receiver_queue_size']}) for its "
                  f"{bc['per_topic']:,} names with the grouped `message_listener(message, "
                  "recipients)` and `recipients.acknowledge(message)` (bench/broadcast.py's "
                  "subscriber), all at one barrier time. Memory: each broker's VmRSS before "
                  f"attaching and after {bc['settle_s']:g} s idle. Then {bc['messages']} "
                  f"messages to the source, one every {1 / bc['rate_per_s']:g} s (a batch each); "
                  "latency = listener time - send time, every delivery.", "",
                  "| measure | result | target | met |", "|---|---|---|---|",
                  f"| attach {bc['subscriptions']:,} subscriptions | {bc['attach_s']} s (per "
                  f"topic, source first: {bc['attach_s_per_topic']}) | < 60 s | "
                  f"{ok(bc['attach_s'] < 60)} |",
                  f"| memory per idle subscription: source broker / shadow broker | "
                  f"{mem['source']:,} / {mem['shadow']:,} B (RSS {bc['rss_before_mb']['source']}"
                  f" -> {bc['rss_idle_mb']['source']} / {bc['rss_before_mb']['shadow']} -> "
                  f"{bc['rss_idle_mb']['shadow']} MiB) | < 2 KB | "
                  f"{ok(max(mem.values()) < 2048)} |",
                  f"| latency p50 / p99 / max, all deliveries | {bc['latency_ms_p50']} / {p99} "
                  f"/ {bc['latency_ms_max']} ms | p99 < 1 s | "
                  f"{ok(p99 is not None and p99 < 1000)} |",
                  f"| ... on the source's subscriptions | {s['latency_ms_p50']} / "
                  f"{s['latency_ms_p99']} / {s['latency_ms_max']} ms | | |",
                  f"| ... on the shadows' subscriptions | {sh['latency_ms_p50']} / "
                  f"{sh['latency_ms_p99']} / {sh['latency_ms_max']} ms | | |",
                  f"| delivered (decoded, acked) | {bc['delivered']:,} of {bc['expected']:,} "
                  f"({bc['missing']:,} missing, {bc['duplicates']:,} duplicates) | all | "
                  f"{ok(bc['delivered'] == bc['expected'] and not bc['missing'])} |",
                  f"| CPU per message during the traffic: source / shadow broker / etcd | "
                  f"{cpu['source']} / {cpu['shadow']} / {cpu['etcd']} ms | | |", "",
                  f"- per message, until the last subscription had it: median "
                  f"{bc['all_subs_ms_median']} ms, max {bc['all_subs_ms_max']} ms (source's "
                  f"subscriptions {s['all_subs_ms_median']} / {s['all_subs_ms_max']} ms); "
                  f"producer receipts {bc['send_ack_ms_p50']} ms (median)",
                  f"- attach CPU: {bc['attach_cpu_s']} s; idle cores after attach: "
                  f"{bc['idle_cores']}; traffic cores: {bc['traffic_cores']}; clients "
                  f"{bc['client_traffic_cpu_s']} CPU s during the traffic", ""]
    fb = res.get("fanout_brokers")
    if fb:
        per = fb["subs"] // fb["shadows"]
        lines += [f"### (c) {fb['shadows']} shadows x {per} subscriptions on 1 shadow broker "
                  "and on 2", "",
                  f"Two clusters side by side, each a source of {fb['messages']:,} messages and "
                  f"{fb['shadows']} shadows, every broker with its own data dir and "
                  "`--wal-dir`: one with 1 shadow broker, one with 2 (the cluster places the "
                  "shadows). Each round the fan-out of (a) (fresh Exclusive subscriptions at "
                  f"\"earliest\", {fb['procs']} client processes) on each, alternating. Shadow "
                  "broker us/msg sums the shadow brokers' CPU.", "",
                  "| round | shadow brokers | msgs/s | seconds | client us/msg | shadow "
                  "broker(s) us/msg | source broker us/msg |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for i, row in enumerate(fb["rounds"], 1):
            for n in sorted(row, key=int):
                x = row[n]
                lines.append(f"| {i} | {n} | {x['msgs_per_s']:,} | {x['seconds']} | "
                             f"{x['client_cpu_us_per_msg']} | {x['sh_cpu_us_per_msg']} | "
                             f"{x['src_cpu_us_per_msg']} |")
        lines += ["", "- median msgs/s: " + ", ".join(
            f"{n} shadow broker(s) {fb[f'median_msgs_per_s_{n}']:,.0f}"
            for n in (1, 2) if f"median_msgs_per_s_{n}" in fb),
            "- shadows per serving broker: " + "; ".join(
                f"{n} broker(s): {len(set(v))} broker(s) serve them"
                for n, v in fb["placement"].items()), ""]
    return lines
