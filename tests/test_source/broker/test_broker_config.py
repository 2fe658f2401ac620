"""The broker's id in its data dir (source/broker/config.py): kept across restarts, written
whole or not at all."""
from __future__ import annotations

from shadowtopic.broker.config import BrokerConfig, parse_config


def config(data_dir) -> BrokerConfig:
    return parse_config(["--data-dir", str(data_dir)], "test", "test")


def test_the_broker_id_survives_a_restart_on_the_same_data_dir(tmp_path):
    first = config(tmp_path).resolve_broker_id()
    assert first.startswith("broker-")
    assert config(tmp_path).resolve_broker_id() == first
    assert (tmp_path / "broker.id").read_text() == first + "\n"
    assert not (tmp_path / "broker.id.tmp").exists()


def test_an_empty_broker_id_file_counts_as_none(tmp_path):
    """What a full disk left behind before ids were written through a temp file."""
    (tmp_path / "broker.id").write_text("")
    got = config(tmp_path).resolve_broker_id()
    assert got.startswith("broker-")
    assert (tmp_path / "broker.id").read_text() == got + "\n"
