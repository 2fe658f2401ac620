"""`shadowtopic brokers list` and `brokers health`: the brokers registered in etcd, as
registered (list) or asked for their gRPC health (health).

`list` prints what each broker registered: id, cluster, url, roles, metrics URL and its
load (topics loaded and their subscriptions, rewritten by the broker when they change, at
most every 5 s: source/broker/ownership.py). `-o json`: a list of objects with `broker_id`,
`cluster`, `url`, `roles`, `started_ms`, `metrics_url`, `topics`, `subscriptions` and
`load_ms` (when the load was measured, 0: not yet). Exit 0 with an empty list when no
broker is registered; one `error:` line, exit 1, when etcd does not answer or refuses the
etcd user (`--etcd-user`, `--etcd-password-file`; TLS to etcd: `--etcd-ca-file`:
cli/etcd_auth_cmd.py), or `--etcd` is not HOST:PORT[,HOST:PORT...] (the members of one
etcd cluster).

Brokers register under `keys.broker(cluster, id)` (a `BrokerInfo`: id, url, roles, start
time, load) while their etcd lease lives, so a broker that died a moment ago is still
listed (by `health` as UNREACHABLE) until its lease runs out. `health`: each broker is
asked the standard gRPC health check (`grpc.health.v1.Health/Check`) for the whole server
("") and for each of its services: Admin, Producer (NOT_SERVING while its data disk takes
no writes), Consumer, and on a shadow broker Replication. A service the broker does not
serve is left out.

etcd, gRPC health and the metadata protos are imported when the command runs (importing
`shadowtopic.metadata` loads the etcd client): other commands never load them through here.

`health` output: one row per broker (`-o json`: a list of objects with `broker_id`, `cluster`,
`url`, `roles`, `started_ms`, `metrics_url` (its HTTP /metrics, beside /healthz and
/readyz; "" when off), `status`, `services` {name: status} and, when the broker did not
answer, `error`). The exit code is 0 only when there is a broker and every broker
and every service of it is SERVING; otherwise the rows are printed and then one `error:`
line says which are not, exit 1.
"""
from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from shadowtopic.cli.output import emit, fail
from shadowtopic.client.connection import client_dial
from shadowtopic.security.dial import PLAINTEXT, Dial

if TYPE_CHECKING:
    from shadowtopic.metadata.etcd_options import EtcdOptions
    from shadowtopic.pb.storage.v1.metadata_pb2 import BrokerInfo

#: the services asked about, by the short name printed
SERVICES = {"admin": "shadowtopic.v1.Admin", "producer": "shadowtopic.v1.Producer",
            "consumer": "shadowtopic.v1.Consumer", "replication": "shadowtopic.v1.Replication"}
SERVING = "SERVING"
UNREACHABLE = "UNREACHABLE"
DEFAULT_ETCD = "127.0.0.1:2379"


def etcd_endpoints(flag: str | None) -> str:
    """The etcd endpoints asked (flag, $SHADOWTOPIC_ETCD, default), checked: HOST:PORT[,...]."""
    endpoints = flag or os.environ.get("SHADOWTOPIC_ETCD") or DEFAULT_ETCD
    items = [e.strip().removeprefix("http://") for e in endpoints.split(",") if e.strip()]
    for item in items:
        port = item.rpartition(":")[2] if ":" in item else "2379"
        if not port.isdigit() or not 0 < int(port) < 65536:
            fail(f"bad etcd endpoint {item!r} in {endpoints!r}: expected HOST:PORT[,HOST:PORT...]")
    if not items:
        fail(f"no etcd endpoint in {endpoints!r}: expected HOST:PORT[,HOST:PORT...]")
    return endpoints


def registered(endpoints: str, cluster: str | None, timeout: float,
               options: EtcdOptions | None = None) -> list[tuple[str, BrokerInfo]]:
    """(cluster, BrokerInfo) of every registered broker (of `cluster` only, if given),
    sorted by cluster and id; `options`: the etcd user and TLS to etcd."""
    from shadowtopic.metadata import keys
    from shadowtopic.metadata.base import MetadataError
    from shadowtopic.metadata.etcd import EtcdStore
    from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb

    async def read():
        store = EtcdStore(endpoints, timeout=timeout, options=options)
        try:
            prefix = keys.brokers_prefix(cluster) if cluster else f"{keys.ROOT}/clusters/"
            return (await store.get_prefix(prefix)).items
        finally:
            await store.close()

    try:
        items = asyncio.run(read())
    except MetadataError as exc:
        fail(f"etcd at {endpoints}: {exc}")
    out = []
    for kv in items:
        name, _, rest = kv.key.removeprefix(f"{keys.ROOT}/clusters/").partition("/")
        broker_id = rest.removeprefix("brokers/")
        if broker_id != rest and kv.key == keys.broker(name, broker_id):
            out.append((name, mpb.BrokerInfo.FromString(kv.value)))
    return sorted(out, key=lambda item: (item[0], item[1].broker_id))


def list_brokers(args) -> int:
    found = registered(etcd_endpoints(args.etcd), args.cluster, args.timeout,
                       _etcd_access(args))
    if args.output == "json":
        emit([{"broker_id": info.broker_id, "cluster": cluster, "url": info.url,
               "roles": list(info.roles), "started_ms": info.started_ms,
               "metrics_url": info.metrics_url, "topics": info.topics,
               "subscriptions": info.subscriptions, "load_ms": info.load_ms}
              for cluster, info in found], "json")
    else:
        emit([{"broker": info.broker_id, "cluster": cluster, "url": info.url,
               "roles": ",".join(info.roles), "topics": info.topics,
               "subscriptions": info.subscriptions, "metrics": info.metrics_url or "-"}
              for cluster, info in found],
             "table", ["broker", "cluster", "url", "roles", "topics", "subscriptions",
                       "metrics"])
    return 0


def check(brokers: list[tuple[str, BrokerInfo]], timeout: float,
          dial: Dial = PLAINTEXT) -> list[dict]:
    """Ask every broker about itself and each service, all at once; a row per broker."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    channels, asked = [], []
    try:
        for cluster, info in brokers:
            ch = dial.channel(info.url)
            channels.append(ch)
            stub = health_pb2_grpc.HealthStub(ch)
            calls = {name: stub.Check.future(health_pb2.HealthCheckRequest(service=service),
                                             timeout=timeout)
                     for name, service in [("", ""), *SERVICES.items()]}
            asked.append((cluster, info, calls))
        return [_row(cluster, info, calls) for cluster, info, calls in asked]
    finally:
        for ch in channels:
            ch.close()


def _row(cluster: str, info: BrokerInfo, calls: dict) -> dict:
    import grpc
    from grpc_health.v1 import health_pb2
    row = {"broker_id": info.broker_id, "cluster": cluster, "url": info.url,
           "roles": list(info.roles), "started_ms": info.started_ms,
           "metrics_url": info.metrics_url}
    services, error = {}, None
    for name, call in calls.items():
        try:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(call.result().status)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                continue  # not a service of this broker
            status = UNREACHABLE
            error = error or f"{exc.code().name}: {exc.details()}"
        if name == "":
            row["status"] = status
        else:
            services[name] = status
    row.setdefault("status", UNREACHABLE)
    row["services"] = services
    if error is not None:
        row["error"] = error
    return row


def _etcd_access(args) -> EtcdOptions:
    from shadowtopic.cli.etcd_auth_cmd import etcd_access  # (it imports this module)
    return etcd_access(args)


def _healthy(row: dict) -> bool:
    return row["status"] == SERVING and all(s == SERVING for s in row["services"].values())


def health(args) -> int:
    endpoints = etcd_endpoints(args.etcd)
    _, dial = client_dial(None, args.tls_trust_certs_file, args.tls_cert_file,
                          args.tls_key_file, args.auth_token)
    rows = check(registered(endpoints, args.cluster, args.timeout, _etcd_access(args)),
                 args.timeout, dial)
    if args.output == "json":
        emit(rows, "json")
    else:
        emit([{"broker": r["broker_id"], "cluster": r["cluster"], "url": r["url"],
               "roles": ",".join(r["roles"]), "status": r["status"],
               **{name: r["services"].get(name, "-") for name in SERVICES}} for r in rows],
             "table", ["broker", "cluster", "url", "roles", "status", *SERVICES])
    where = f"cluster {args.cluster}" if args.cluster else "any cluster"
    if not rows:
        fail(f"no broker is registered in etcd at {endpoints} ({where})")
    bad = [r for r in rows if not _healthy(r)]
    if bad:
        fail(f"{len(bad)} of {len(rows)} brokers not serving: " + ", ".join(
            f"{r['broker_id']} ({_problem(r)})" for r in bad))
    return 0


def _problem(row: dict) -> str:
    if row["status"] != SERVING:
        return row["status"] + (f": {row['error']}" if "error" in row else "")
    return ", ".join(f"{name} {s}" for name, s in row["services"].items() if s != SERVING)
