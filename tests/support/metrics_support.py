"""Helpers of the metrics and health tests: a process's metrics URL (from its etcd
registration or its log), a scrape parsed into samples, and GETs of `/healthz` and
`/readyz` (polled, bounded)."""
from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from support.etcd_support import etcd_get

DEADLINE = 20.0  # seconds any awaited state may take (polled, never slept out)


def registered_metrics_url(etcd_server, broker, cluster: str = "standalone") -> str:
    """The metrics URL `broker` (a BrokerProcess) registered in etcd."""
    with open(os.path.join(broker.data_dir, "broker.id")) as f:
        broker_id = f.read().strip()
    deadline = time.monotonic() + DEADLINE
    while True:
        kv = etcd_get(etcd_server, keys.broker(cluster, broker_id))
        if kv is not None:
            return mpb.BrokerInfo.FromString(kv.value).metrics_url
        assert time.monotonic() < deadline, f"broker {broker_id} is not registered"
        time.sleep(0.1)


def logged_metrics_url(proc) -> str:
    """The metrics URL a process logged when it started (a BrokerProcess)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        with open(proc.log_path, errors="replace") as f:
            found = re.search(r"metrics on (http://[^\s\"]+/metrics)", f.read())
        if found:
            return found.group(1)
        assert time.monotonic() < deadline, f"no metrics URL in {proc.log_path}"
        time.sleep(0.1)


def get(url: str, timeout: float = 10.0) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of a GET (an HTTP error status is returned, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


Samples = dict[tuple[str, frozenset], float]


def scrape(url: str) -> Samples:
    """Every sample of `url`: (name, frozenset of label items) -> value."""
    status, text, headers = get(url)
    assert status == 200, (status, text)
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of `name` with exactly `labels` (None: absent)."""
    return samples.get((name, frozenset(labels.items())))


def series(samples: Samples, name: str, **labels: str) -> dict[frozenset, float]:
    """The samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return {k[1]: v for k, v in samples.items() if k[0] == name and want <= k[1]}


def wait_value(url: str, name: str, want: float, **labels: str) -> Samples:
    """Scrape until `name{labels}` is `want`; the last scrape."""
    deadline = time.monotonic() + DEADLINE
    while True:
        s = scrape(url)
        got = value(s, name, **labels)
        if got == want:
            return s
        assert time.monotonic() < deadline, f"{name}{labels} stays {got}, not {want}"
        time.sleep(0.2)


def wait_ready(base: str, status: int, timeout: float = DEADLINE) -> str:
    """GET `base`/readyz until it answers `status`; its body."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, body, _ = get(base + "/readyz", timeout=5)
        except OSError as exc:  # the process is not listening yet
            got, body = None, str(exc)
        if got == status:
            return body
        assert time.monotonic() < deadline, f"/readyz stays {got}: {body!r}"
        time.sleep(0.2)


def base_of(metrics_url: str) -> str:
    return metrics_url.rsplit("/metrics", 1)[0]
