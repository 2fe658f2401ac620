"""docs/EXAMPLES.md runs as written: each ```python block, in order, each under 25 lines,
against a real source broker and shadow broker (one storage root, a cluster of this module's
own; no compaction worker: a compacted reader of a topic never compacted reads it all). The
examples name no server: `AsyncClient()` and `Client()` take `$SHADOWTOPIC_URL`, which the
test points at the source broker. Each prints what it did; the test checks those lines."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shadowtopic.broker.server import free_port
from shadowtopic.standalone import BrokerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
#: what each example prints, in order (a regular expression per example)
PRINTS = [
    r"^sent 1000 orders, (\d+):0 to \1:999$",
    r"^billed 1000 orders$",
    r"^the replica holds 1000 orders$",
    r"^1000 orders, order-7 is \{\"id\": 7, \"state\": \"shipped\"\}$",
    r"^1000 orders; order-7: \{\"id\": 7, \"state\": \"shipped\"\}\n"
    r"changed: order-7 None\norder-7 after the delete: None$",
    r"^1000 deliveries in 10 listener calls$",
]


def examples() -> list[tuple[int, str]]:
    text = (ROOT / "docs" / "EXAMPLES.md").read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(2))
            for m in FENCE.finditer(text) if m.group(1) == "python"]


@pytest.fixture(scope="module")
def source_url(etcd_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("examples")
    args = ["--lease-ttl", "3", "--cluster", f"examples-{uuid.uuid4().hex[:8]}",
            "--storage-root", str(root / "storage")]
    roles = [BrokerProcess(etcd_server.endpoint, str(root / "src"), free_port(),
                           extra_args=args),
             BrokerProcess(etcd_server.endpoint, str(root / "sh"), free_port(),
                           extra_args=args, module="shadowtopic.shadow.broker")]
    try:
        for role in roles:
            role.start(timeout=60)
        yield roles[0].url
    finally:
        for role in roles:
            role.kill()


def test_there_is_one_short_example_per_use():
    found = examples()
    assert len(found) == len(PRINTS) == 6
    for line, code in found:
        assert len(code.splitlines()) <= 25, f"EXAMPLES.md:{line} is over 25 lines"
    uses = [code for _, code in found]
    assert "AsyncClient" in uses[0] and "create_producer" in uses[0]
    assert "AsyncClient" in uses[1] and "acknowledge" in uses[1]
    assert "create_shadow_topic" in uses[2]
    assert "read_compacted=True" in uses[3]
    assert "table_view" in uses[4]
    assert "subscribe_many" in uses[5] and "message_listener" in uses[5]


def test_every_example_runs_as_written(source_url):
    for (line, code), want in zip(examples(), PRINTS, strict=True):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL, cwd=ROOT,
                              env={**os.environ, "SHADOWTOPIC_URL": source_url})
        assert done.returncode == 0, \
            f"EXAMPLES.md:{line}: the example failed\n{done.stdout}{done.stderr}"
        assert re.search(want, done.stdout.strip(), re.M | re.S), \
            f"EXAMPLES.md:{line}: printed {done.stdout!r}, not {want!r}"
