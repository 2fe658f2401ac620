"""shadowtopic.testing as its users meet it: a project's own test suite that enables the
plugin (`pytest_plugins = ["shadowtopic.testing"]`) produces and consumes through the
fixtures' real standalone, and a script that uses `standalone()` without pytest."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

USER_CONFTEST = 'pytest_plugins = ["shadowtopic.testing"]\n'

USER_TEST = textwrap.dedent('''
    def test_what_i_produce_i_consume(shadowtopic_client, shadowtopic_topic):
        with shadowtopic_client.subscribe(shadowtopic_topic, "mine",
                                          initial_position="earliest") as consumer:
            with shadowtopic_client.create_producer(shadowtopic_topic) as producer:
                for i in range(3):
                    producer.send(f"m{i}".encode())
            got = [consumer.receive(timeout=20) for _ in range(3)]
            for msg in got:
                consumer.acknowledge(msg)
        assert [m.payload for m in got] == [b"m0", b"m1", b"m2"]


    def test_the_standalone_has_a_shadow_broker(shadowtopic_standalone):
        assert shadowtopic_standalone.shadow is not None
        assert shadowtopic_standalone.shadow.ready()
''')

USER_SCRIPT = textwrap.dedent('''
    import sys
    from shadowtopic.testing import fresh_topic, standalone

    assert "pytest" not in sys.modules
    topic = fresh_topic()
    with standalone(shadow=False) as st:
        with st.client() as client:
            client.admin.create_topic(topic)
            with client.create_producer(topic) as producer:
                producer.send(b"hello")
            with client.create_reader(topic, start="earliest") as reader:
                print(reader.read_next(timeout=20).payload.decode())
        pid = st.broker.proc.pid
    print(pid)
''')


def run_user(tmp_path, *args, timeout=300):
    # the user's project directory, not ours: their conftest, their tests
    return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env=dict(os.environ))


def test_a_users_suite_produces_and_consumes_through_the_plugin_fixtures(tmp_path):
    (tmp_path / "conftest.py").write_text(USER_CONFTEST)
    (tmp_path / "test_mine.py").write_text(USER_TEST)
    res = run_user(tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                   "no:xdist", "test_mine.py")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed" in res.stdout, res.stdout


def test_standalone_works_without_pytest_and_leaves_no_broker_behind(tmp_path):
    (tmp_path / "script.py").write_text(USER_SCRIPT)
    res = run_user(tmp_path, "script.py")
    assert res.returncode == 0, res.stdout + res.stderr
    payload, pid = res.stdout.split()
    assert payload == "hello"
    assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
