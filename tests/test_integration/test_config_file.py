"""The config file as a user meets it: a broker runs with the values of its section under
the environment and its flags; `shadowtopic config print [--effective]` shows the merged
config as TOML; an unknown key is one `error:` line naming the file, line and key, from the
CLI, a role and the standalone alike."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import uuid

from support.etcd_support import etcd_prefix

from shadowtopic.broker.server import free_port
from shadowtopic.client import Client
from shadowtopic.standalone import BrokerProcess

EXE = os.path.join(os.path.dirname(sys.executable), "shadowtopic")


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120
        ) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SHADOWTOPIC_CFG__")}
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                          env={**full, **(env or {})}, stdin=subprocess.DEVNULL)


def test_a_broker_runs_with_its_section_under_env_and_flags(etcd_server, tmp_path, topic):
    cluster = f"cfg-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "shadowtopic.toml"
    # port 1 would fail to bind: the flag's port must win; broker_id: the variable's
    path.write_text(f'[broker]\ncluster = "{cluster}"\nbroker_id = "from-file"\nport = 1\n'
                    f'entry_cache_bytes = "64M"\n[worker]\ngrace = 5\n')
    b = BrokerProcess(etcd_server.endpoint, str(tmp_path / "data"), free_port(),
                      extra_args=["--lease-ttl", "3", "--config", str(path)],
                      env={"SHADOWTOPIC_CFG__BROKER__BROKER_ID": "from-env"})
    b.start(timeout=60)
    try:
        with Client(b.url, timeout=20) as c:
            c.admin.create_topic(topic)
        registered = etcd_prefix(etcd_server, f"/shadowtopic/clusters/{cluster}/brokers/")
        assert list(registered) == [f"/shadowtopic/clusters/{cluster}/brokers/from-env"]
    finally:
        assert b.terminate() == 0


def test_config_print_shows_the_merged_config(tmp_path):
    path = tmp_path / "shadowtopic.toml"
    path.write_text('[broker]\nport = 7001\nlease_ttl = 20\n[worker]\ngrace = 5.0\n'
                    '[standalone]\ndata_dir = "/srv/st"\n')
    env = {"SHADOWTOPIC_CFG__BROKER__LEASE_TTL": "30",
           "SHADOWTOPIC_CFG__SHADOW__CLIENT_MEMORY_BYTES": "2G"}
    r = run(EXE, "config", "print", "--config", str(path), env=env)
    assert r.returncode == 0, r.stderr
    assert tomllib.loads(r.stdout) == {
        "broker": {"port": 7001, "lease_ttl": "30"}, "worker": {"grace": 5.0},
        "shadow": {"client_memory_bytes": "2G"}, "standalone": {"data_dir": "/srv/st"}}
    r = run(EXE, "config", "print", "--effective", "--config", str(path), env=env)
    assert r.returncode == 0, r.stderr
    doc = tomllib.loads(r.stdout)
    assert list(doc) == ["broker", "shadow", "worker", "standalone"]
    assert (doc["broker"]["port"], doc["broker"]["lease_ttl"]) == (7001, 30)   # file, env
    assert doc["broker"]["entry_cache_bytes"] == 256 << 20                     # default
    assert doc["shadow"]["client_memory_bytes"] == 2 << 30 and doc["shadow"]["port"] == 6650
    assert doc["worker"]["grace"] == 5.0 and doc["worker"]["spark_log_level"] == "WARN"
    assert doc["standalone"]["data_dir"] == "/srv/st" and doc["standalone"]["port"] == 6650
    assert all("config" not in section for section in doc.values())


def test_an_unknown_key_is_one_line_everywhere(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[worker]\ngrace = 5\n\nspark_mastr = "local[2]"\n[standalone]\n')
    expected = f"error: {path}:4: [worker] spark_mastr: unknown key (known: "
    r = run(EXE, "config", "print", "--effective", "--config", str(path))
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith(expected) and r.stderr.count("\n") == 1, r.stderr
    r = run(sys.executable, "-m", "shadowtopic.compaction.worker", "--config", str(path))
    assert r.returncode == 1 and r.stderr.startswith(expected) and r.stderr.count("\n") == 1
    path.write_text('[standalone]\nport = 7000\nwipe = true\n')
    data = tmp_path / "data"
    r = run(EXE, "standalone", "--data-dir", str(data), "--config", str(path))
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith(f"error: {path}:3: [standalone] wipe: unknown key"), r.stderr
    assert r.stderr.count("\n") == 1 and not data.exists()
    # a role's section is checked by the role before the standalone starts anything
    path.write_text('[standalone]\nport = 7000\n[shadow]\nport = 1\nlease-tll = 3\n')
    r = run(EXE, "standalone", "--data-dir", str(data), "--config", str(path))
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith(f"error: {path}:5: [shadow] lease-tll: unknown key"), r.stderr
    assert r.stderr.count("\n") == 1 and not data.exists()
