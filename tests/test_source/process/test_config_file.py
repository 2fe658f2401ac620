"""The config file (source/config_file.py): flag > environment > file > default, key by key;
unknown sections and keys rejected with the file, key and line; values converted by the
flag's type; the printed TOML parses back and hides secrets."""
from __future__ import annotations

import argparse
import tomllib

import pytest

from shadowtopic import config_file
from shadowtopic.core.argtypes import size


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="role")
    p.add_argument("--port", type=int, default=6650)
    p.add_argument("--cache-bytes", type=size, default=1 << 20)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--features", default=None)
    p.add_argument("--wipe", action="store_true")
    p.add_argument("--conf", action="append", default=[])
    p.add_argument("--api-token", default=None)
    p.add_argument("--mode", choices=["a", "b"], default="a")
    config_file.add_arguments(p)
    return p


def write(tmp_path, text: str) -> str:
    path = tmp_path / "shadowtopic.toml"
    path.write_text(text)
    return str(path)


def test_each_level_wins_over_the_ones_below(tmp_path):
    path = write(tmp_path, "[broker]\nport = 7001\ninterval = 2.5\nhost = '10.0.0.1'\n")
    env = {"SHADOWTOPIC_CFG__BROKER__PORT": "7002",
           "SHADOWTOPIC_CFG__BROKER__INTERVAL": "3.5"}
    a = config_file.parse(parser(), "broker", ["--config", path, "--port", "7003"], env)
    assert a.port == 7003                  # flag over env and file
    assert a.interval == 3.5               # env over file
    assert a.host == "10.0.0.1"            # file over default
    assert a.cache_bytes == 1 << 20        # default
    a = config_file.parse(parser(), "broker", ["--config", path], env)
    assert a.port == 7002
    a = config_file.parse(parser(), "broker", ["--config", path], {})
    assert (a.port, a.interval) == (7001, 2.5)
    assert config_file.parse(parser(), "broker", [], {}).port == 6650


def test_other_sections_and_variables_are_left_to_their_roles(tmp_path):
    path = write(tmp_path, "[broker]\nport = 7001\n[worker]\nanything = 1\n")
    env = {"SHADOWTOPIC_CFG__WORKER__PORT": "9", "SHADOWTOPIC_URL": "x:1",
           "SHADOWTOPIC_FAILPOINTS": "", "SHADOWTOPIC_CFGX": "not ours"}
    assert config_file.parse(parser(), "broker", ["--config", path], env).port == 7001


def test_values_take_toml_types_or_the_flags_text(tmp_path):
    path = write(tmp_path, '[shadow]\ncache-bytes = "2G"\nwipe = true\nconf = ["a=1", "b=2"]\n'
                           'features = ["shadow", "compaction"]\nport = 7001\n')
    a = config_file.parse(parser(), "shadow", ["--config", path], {})
    assert a.cache_bytes == 2 << 30 and a.wipe is True and a.conf == ["a=1", "b=2"]
    assert a.features == "shadow,compaction" and a.port == 7001
    env = {"SHADOWTOPIC_CFG__SHADOW__CACHE_BYTES": "64M", "SHADOWTOPIC_CFG__SHADOW__WIPE": "no",
           "SHADOWTOPIC_CFG__SHADOW__CONF": '["c=3"]'}
    a = config_file.parse(parser(), "shadow", ["--config", path], env)
    assert (a.cache_bytes, a.wipe, a.conf) == (64 << 20, False, ["c=3"])


@pytest.mark.parametrize("text, expected", [
    ("[broker]\nport = 1\n\nprot = 2\n", ":4: [broker] prot: unknown key"),
    ("[broker]\nport = 'x'\n", ":2: [broker] port: invalid literal for int()"),
    ("[broker]\nwipe = 3\n", ":2: [broker] wipe: expected true or false"),
    ("[broker]\nmode = 'c'\n", ":2: [broker] mode: 'c' is not one of a, b"),
    ("[broker]\ncache_bytes = 'lots'\n", "[broker] cache_bytes: 'lots' is not a size"),
    ("port = 1\n", ":1: key 'port' is outside a section"),
    ("[broker]\n[brokers]\nport = 1\n", ":2: unknown section [brokers]"),
    ("[broker\n", "not valid TOML"),
])
def test_a_bad_file_is_one_line_naming_file_key_and_line(tmp_path, capsys, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(SystemExit) as e:
        config_file.parse(parser(), "broker", ["--config", path], {})
    message = str(e.value.code)
    assert message.startswith(f"error: {path}") and expected in message, message
    assert "\n" not in message


@pytest.mark.parametrize("env, expected", [
    ({"SHADOWTOPIC_CFG__BROKER__PROT": "1"}, "SHADOWTOPIC_CFG__BROKER__PROT: unknown key 'prot'"),
    ({"SHADOWTOPIC_CFG__BROKR__PORT": "1"}, "SHADOWTOPIC_CFG__BROKR__PORT: expected"),
    ({"SHADOWTOPIC_CFG__BROKER__PORT": "x"}, "SHADOWTOPIC_CFG__BROKER__PORT: invalid literal"),
])
def test_a_bad_variable_is_one_line_naming_it(env, expected):
    with pytest.raises(SystemExit) as e:
        config_file.parse(parser(), "broker", [], env)
    assert str(e.value.code).startswith(f"error: {expected}"), e.value.code


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        config_file.parse(parser(), "broker", ["--config", str(tmp_path / "none.toml")], {})
    assert str(e.value.code).startswith("error: cannot read config file")


def test_legacy_etcd_variable_sits_between_file_and_its_new_name(tmp_path):
    p = argparse.ArgumentParser()
    p.add_argument("--etcd", default="127.0.0.1:2379")
    config_file.add_arguments(p)
    path = write(tmp_path, "[worker]\netcd = 'file:1'\n")
    assert config_file.parse(p, "worker", ["--config", path], {}).etcd == "file:1"
    env = {"SHADOWTOPIC_ETCD": "legacy:2"}
    assert config_file.parse(p, "worker", ["--config", path], env).etcd == "legacy:2"
    env["SHADOWTOPIC_CFG__WORKER__ETCD"] = "new:3"
    assert config_file.parse(p, "worker", ["--config", path], env).etcd == "new:3"


def test_print_config_is_toml_that_parses_back_with_secrets_hidden(tmp_path, capsys):
    path = write(tmp_path, "[broker]\napi_token = 's3cr3t'\nconf = ['a=1']\n")
    with pytest.raises(SystemExit) as e:
        config_file.parse(parser(), "broker", ["--config", path, "--print-config",
                                               "--interval", "0.25"], {})
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "s3cr3t" not in out
    doc = tomllib.loads(out)["broker"]
    assert doc["api_token"] == config_file.REDACTED
    assert (doc["interval"], doc["port"], doc["conf"], doc["wipe"]) == (0.25, 6650, ["a=1"],
                                                                        False)
    assert "features" not in doc and "# features is not set" in out
    assert "config" not in doc and "print_config" not in doc
