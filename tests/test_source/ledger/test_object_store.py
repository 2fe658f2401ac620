"""source/ledger/object_store.py: how each kind of storage root opens (no server needed: an
S3 filesystem connects on first use; test_integration/test_s3_storage.py uses a real one)."""
from __future__ import annotations

import pickle

import pyarrow.fs as pafs
import pytest

from shadowtopic.ledger.object_store import S3Options, open_root
from shadowtopic.ledger.storage import Storage


def test_a_plain_path_and_a_file_uri_are_the_local_filesystem(tmp_path):
    fs, base = open_root(str(tmp_path) + "/")
    assert isinstance(fs, pafs.LocalFileSystem) and base == str(tmp_path)
    fs, base = open_root(f"file://{tmp_path}")
    assert isinstance(fs, pafs.LocalFileSystem) and base == str(tmp_path)


def test_an_s3_root_opens_with_its_options_and_hands_tasks_the_same():
    opts = S3Options(endpoint="http://127.0.0.1:9000", region="eu-west-3")
    fs, base = open_root("s3://bucket/some/prefix/", opts)
    assert isinstance(fs, pafs.S3FileSystem) and base == "bucket/some/prefix"
    assert fs.region == "eu-west-3"
    st = Storage("s3://bucket/some/prefix", wal_dir="/tmp/wal-unused", s3=opts)
    assert st.uri == "s3://bucket/some/prefix"  # what compaction requests name
    assert st.root_uri == ("s3://bucket/some/prefix?endpoint_override=127.0.0.1%3A9000"
                           "&scheme=http&region=eu-west-3")
    fs2, base2 = open_root(st.root_uri)  # what a Spark task opens, alone
    assert isinstance(fs2, pafs.S3FileSystem) and base2 == base and fs2.region == "eu-west-3"


def test_an_object_store_root_needs_a_local_wal_dir():
    with pytest.raises(ValueError, match="wal_dir"):
        Storage("s3://bucket/p", s3=S3Options(endpoint="http://127.0.0.1:9000"))


@pytest.mark.parametrize("endpoint", ["ftp://h:1", "http://", "http://h:1/path", "http://h?x=1"])
def test_a_malformed_endpoint_is_refused(endpoint):
    with pytest.raises(ValueError, match="expected http"):
        S3Options(endpoint=endpoint)


def test_a_bare_host_port_endpoint_means_https():
    assert S3Options(endpoint="s3.example.com:443").task_uri("s3://b") == \
        "s3://b?endpoint_override=s3.example.com%3A443&scheme=https"


def test_an_s3_root_needs_a_bucket():
    with pytest.raises(ValueError, match="no bucket"):
        open_root("s3:///prefix")


def test_credentials_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    fs, _ = open_root("s3://b/p", S3Options(endpoint="http://127.0.0.1:9", region="us-east-1"))
    # the key id is part of the filesystem's pickled state (what Spark would ship)
    assert b"AKIDEXAMPLE" in pickle.dumps(fs)
