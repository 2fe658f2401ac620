"""The README's examples run as written: its quickstart's `shadowtopic` commands and every
```python block, in order, against real processes as `make run` starts them: the session's
etcd, a source broker and a shadow broker (one storage root, free loopback ports) of the
cluster of the test process's compaction worker (conftest's `worker`: its Spark JVM is
shared with the compaction tests, see SHARED_WORKER_FILES). The examples name no server: the
CLI and `Client()` take `$SHADOWTOPIC_URL`, which the test points at the source broker.

Not `shadowtopic standalone` itself: it gives its worker 120 s to warm Spark up, which a
loaded 2-core machine may not meet; the worker here has 180 s (the processes are the same)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.etcd_support import etcd_prefix
from support.waiting import wait_for

from shadowtopic.broker.server import free_port
from shadowtopic.metadata import keys
from shadowtopic.pb.storage.v1 import metadata_pb2 as mpb
from shadowtopic.standalone import BrokerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(text: str, lang: str) -> list[tuple[int, str]]:
    """(line, code) of each fenced block of `lang` in a markdown text."""
    return [(text.count("\n", 0, m.start()) + 2, m.group(2))
            for m in FENCE.finditer(text) if m.group(1) == lang]


def quickstart_commands(readme: str) -> list[tuple[int, str]]:
    """(line, command) of each `shadowtopic ...` line of the quickstart's shell block, its
    comment cut."""
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    first = readme.count("\n", 0, readme.index("## Quickstart")) + 1
    out = []
    for line, code in blocks(section, "sh"):
        for i, text in enumerate(code.splitlines()):
            if text.startswith("shadowtopic "):
                out.append((first + line - 1 + i, text.split("  #", 1)[0].strip()))
    return out


@pytest.fixture(scope="module")
def source_url(etcd_server, tmp_path_factory, cluster, worker):
    """The source broker's URL, with a shadow broker beside it, of the worker's cluster.
    The brokers start once no other shadow broker of that cluster is registered (one an
    earlier test killed is until its lease lapses): the README's shadow goes to ours; and
    the fixture ends once ours is not, for the cluster's next tests."""
    root = tmp_path_factory.mktemp("readme")
    brokers = ["--lease-ttl", "3", "--cluster", cluster, "--storage-root", str(root / "storage")]
    wait_for(lambda: not shadow_brokers(etcd_server, cluster), 30,
             "the registrations of the cluster's earlier shadow brokers to lapse", interval=0.2)
    roles = [
        BrokerProcess(etcd_server.endpoint, str(root / "src"), free_port(), extra_args=brokers),
        BrokerProcess(etcd_server.endpoint, str(root / "sh"), free_port(), extra_args=brokers,
                      module="shadowtopic.shadow.broker"),
    ]
    try:
        with ThreadPoolExecutor(len(roles)) as pool:
            starts = [pool.submit(role.start, timeout=60) for role in roles]
        for start in starts:
            start.result()
        yield roles[0].url
    finally:
        for role in roles:
            role.kill()
    wait_for(lambda: not shadow_brokers(etcd_server, cluster), 30,
             "the registration of the README's shadow broker to lapse", interval=0.2)


def shadow_brokers(etcd_server, cluster: str) -> list[str]:
    """The ids of the shadow brokers registered in `cluster`."""
    found = []
    for kv in etcd_prefix(etcd_server, keys.brokers_prefix(cluster)).values():
        info = mpb.BrokerInfo.FromString(kv.value)
        if "shadow" in info.roles:
            found.append(info.broker_id)
    return found


def run(args: list[str], url: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, SHADOWTOPIC_URL=url, COLUMNS="200")
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=ROOT)


def test_the_readme_has_its_examples():
    readme = (ROOT / "README.md").read_text()
    assert len(quickstart_commands(readme)) >= 8
    assert len(blocks(readme, "python")) == 6  # produce, consume, shadow, compacted, table, ...
    assert any("table_view" in code for _, code in blocks(readme, "python"))
    assert all("from shadowtopic import Client" in code for _, code in blocks(readme, "python"))


def test_quickstart_commands_run_as_written(source_url):
    readme = (ROOT / "README.md").read_text()
    outputs = {}
    for line, command in quickstart_commands(readme):
        args = shlex.split(command)
        done = run([EXE, *args[1:]], source_url)
        assert done.returncode == 0, f"README.md:{line}: {command}\n{done.stdout}{done.stderr}"
        outputs[command] = done.stdout
    compacted = next(out for cmd, out in outputs.items() if "--compacted" in cmd)
    # 10 x user-1 "hello" then user-2 "world": the compacted view keeps one of each
    assert compacted.count("user-1") == 1 and compacted.count("user-2") == 1, compacted
    shadow = next(out for cmd, out in outputs.items()
                  if cmd.startswith("shadowtopic read my-topic-shadow"))
    assert shadow.count("hello") == 5, shadow


def test_python_examples_run_as_written(source_url):
    readme = (ROOT / "README.md").read_text()
    for line, code in blocks(readme, "python"):
        done = run([sys.executable, "-c", code], source_url)
        assert done.returncode == 0, \
            f"README.md:{line}: the example failed\n{done.stdout}{done.stderr}"
        assert done.stdout.strip(), f"README.md:{line}: the example printed nothing"
