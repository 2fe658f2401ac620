"""How processes are told to reach etcd (source/metadata/etcd_options.py): the flags, their
config-file keys and variables, `$SHADOWTOPIC_ETCD_PASSWORD`, the password file's rules, what
a child process is passed; the roles' grants (source/metadata/etcd_auth.py); the CLI's copy
of the flags (source/cli/etcd_auth_cmd.py)."""
from __future__ import annotations

import argparse

import pytest

from shadowtopic import config_file
from shadowtopic.broker.config import parse_config
from shadowtopic.cli import etcd_auth_cmd
from shadowtopic.metadata import etcd_auth, etcd_options
from shadowtopic.metadata.etcd_options import PASSWORD_ENV, EtcdOptions, read_password_file


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    etcd_options.add_arguments(p)
    config_file.add_arguments(p)
    return p


def parsed(argv: list[str], environ: dict[str, str] | None = None,
           section: str = "broker") -> EtcdOptions:
    environ = environ or {}
    p = parser()
    a = config_file.parse(p, section, argv, environ=environ)
    return etcd_options.options_from(p, a, environ)


@pytest.fixture
def files(tmp_path):
    out = {}
    for name, text in (("pw", "s3cret\n"), ("ca", "CA"), ("cert", "CERT"), ("key", "KEY")):
        (tmp_path / name).write_text(text)
        out[name] = str(tmp_path / name)
    return out


def test_without_flags_etcd_is_reached_anonymously_in_plaintext():
    opts = parsed([])
    assert opts == EtcdOptions() and not opts.tls and opts.flags() == [] and opts.env() == {}
    assert opts.channel_credentials() is None


def test_the_flags(files):
    opts = parsed(["--etcd-user", "broker", "--etcd-password-file", files["pw"],
                   "--etcd-ca-file", files["ca"], "--etcd-cert-file", files["cert"],
                   "--etcd-key-file", files["key"]])
    assert (opts.user, opts.password_file, opts.ca_file, opts.cert_file, opts.key_file) == (
        "broker", files["pw"], files["ca"], files["cert"], files["key"])
    assert opts.tls and opts.read_password() == "s3cret"
    # what a child process gets: the same flags, never the password
    assert opts.flags() == ["--etcd-user", "broker", "--etcd-password-file", files["pw"],
                            "--etcd-ca-file", files["ca"], "--etcd-cert-file", files["cert"],
                            "--etcd-key-file", files["key"]]
    assert opts.env() == {}
    assert parsed(opts.flags()) == opts


def test_config_file_keys_and_variables(files, tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text(f'[worker]\netcd_user = "compaction"\netcd_password_file = "{files["pw"]}"\n'
                    f'etcd_ca_file = "{files["ca"]}"\n')
    opts = parsed(["--config", str(conf)], section="worker")
    assert (opts.user, opts.password_file, opts.ca_file) == ("compaction", files["pw"],
                                                             files["ca"])
    env = {"SHADOWTOPIC_CFG__WORKER__ETCD_USER": "other"}  # the variable over the file
    assert parsed(["--config", str(conf)], env, section="worker").user == "other"
    assert parsed(["--config", str(conf), "--etcd-user", "x"], env,
                  section="worker").user == "x"  # the flag over both


def test_the_password_from_the_environment_for_a_user_without_a_file(files):
    opts = parsed(["--etcd-user", "broker"], {PASSWORD_ENV: "from-env"})
    assert opts.read_password() == "from-env" and "from-env" not in repr(opts)
    assert opts.flags() == ["--etcd-user", "broker"]  # never on a command line ...
    assert opts.env() == {PASSWORD_ENV: "from-env"}  # ... but in the child's environment
    # a file wins over the variable; without a user the variable is not used
    assert parsed(["--etcd-user", "broker", "--etcd-password-file", files["pw"]],
                  {PASSWORD_ENV: "from-env"}).read_password() == "s3cret"
    assert parsed([], {PASSWORD_ENV: "from-env"}) == EtcdOptions()


@pytest.mark.parametrize("argv, message", [
    (["--etcd-user", "broker"], "needs its password"),
    (["--etcd-password-file", "PW"], "needs --etcd-user"),
    (["--etcd-user", " ", "--etcd-password-file", "PW"], "--etcd-user is empty"),
    (["--etcd-ca-file", "CA", "--etcd-cert-file", "CERT"], "go together"),
    (["--etcd-cert-file", "CERT", "--etcd-key-file", "KEY"], "needs --etcd-ca-file"),
    (["--etcd-ca-file", "/nowhere/ca.pem"], "cannot read /nowhere/ca.pem"),
])
def test_a_bad_combination_is_a_usage_error(files, capsys, argv, message):
    argv = [{"PW": files["pw"], "CA": files["ca"], "CERT": files["cert"],
             "KEY": files["key"]}.get(a, a) for a in argv]
    with pytest.raises(SystemExit) as info:
        parsed(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_the_password_file_rules(tmp_path):
    def read(data: bytes) -> str:
        path = tmp_path / "pw"
        path.write_bytes(data)
        return read_password_file(str(path))
    assert read(b"pass word\n") == "pass word"  # one trailing newline less, nothing else
    assert read(b"pw\r\n") == "pw" and read(b"pw\n\n") == "pw\n" and read(b" pw ") == " pw "
    for bad, why in ((b"", "empty"), (b"\n", "empty"), (b"\xff\xfe", "not UTF-8"),
                     (b"x" * 5000, "larger than")):
        with pytest.raises(ValueError, match=why):
            read(bad)
    with pytest.raises(OSError):
        read_password_file(str(tmp_path / "missing"))


def test_a_broker_takes_the_flags_into_its_config(files, tmp_path):
    cfg = parse_config(["--data-dir", str(tmp_path), "--etcd-user", "broker",
                        "--etcd-password-file", files["pw"]], "t", "t")
    assert cfg.etcd_options == EtcdOptions(user="broker", password_file=files["pw"])


def test_the_compaction_worker_takes_the_flags(files):
    from shadowtopic.compaction.worker import parse_args
    a = parse_args(["--etcd-user", "compaction", "--etcd-password-file", files["pw"],
                    "--etcd-ca-file", files["ca"]])
    assert a.etcd_options == EtcdOptions(user="compaction", password_file=files["pw"],
                                         ca_file=files["ca"])


def test_the_config_printout_hides_the_password_file_key(files, capsys):
    p = parser()
    with pytest.raises(SystemExit):
        config_file.parse(p, "broker", ["--etcd-user", "b", "--etcd-password-file",
                                        files["pw"], "--print-config"], environ={})
    out = capsys.readouterr().out
    assert 'etcd_user = "b"' in out and files["pw"] not in out


def test_the_cli_flags_are_the_processes_flags():
    """`brokers list|health` take the same etcd flags as every process (a copy, so that the
    CLI loads etcd3 only when it reads etcd)."""
    def flags(p: argparse.ArgumentParser) -> set[str]:
        return {s for a in p._actions for s in a.option_strings if s.startswith("--etcd-")}
    ours = argparse.ArgumentParser()
    etcd_auth_cmd.add_etcd_flags(ours)
    assert flags(ours) == flags(parser())
    tls_only = argparse.ArgumentParser()
    etcd_auth_cmd.add_etcd_flags(tls_only, user=False)
    assert flags(tls_only) == {"--etcd-ca-file", "--etcd-cert-file", "--etcd-key-file"}


def test_the_roles_grants():
    """The broker role writes everything of the schema; the compaction role reads it all
    and writes only its clusters' compaction keys, the topics' keys and the migration marks:
    never a broker registration, an ownership, the ledger id counter, tenants or grants."""
    assert etcd_auth.grants("broker") == [etcd_auth.Grant("/shadowtopic/", "readwrite")]
    compaction = etcd_auth.grants("compaction", ["prod", "lab"])
    writes = [g.prefix for g in compaction if "write" in g.permission]
    assert writes == ["/shadowtopic/clusters/prod/compaction/",
                      "/shadowtopic/clusters/lab/compaction/", "/shadowtopic/topics/",
                      "/shadowtopic/migrations/"]
    assert [g.prefix for g in compaction if g.permission == "read"] == ["/shadowtopic/"]
    for key in ("/shadowtopic/clusters/prod/brokers/b1", "/shadowtopic/clusters/prod/ownership/t",
                "/shadowtopic/counters/ledger-id", "/shadowtopic/tenants/public",
                "/shadowtopic/permissions/topics/t", "/shadowtopic/clusters/other/compaction/x"):
        assert not any(key.startswith(w) for w in writes), key
    with pytest.raises(ValueError, match="unknown role"):
        etcd_auth.grants("root")


def test_generated_passwords_differ():
    auth = etcd_auth.EtcdAuth.generated(["c"])
    secrets = [auth.root_password, *auth.users.values()]
    assert sorted(auth.users) == ["broker", "compaction"] and len(set(secrets)) == 3
    assert all(len(s) >= 32 for s in secrets) and auth.root_password not in repr(auth)


def test_files_are_readable_only_when_they_exist(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        EtcdOptions(user="u", password_file=str(tmp_path / "missing"))
