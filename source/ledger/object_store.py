"""Opening a storage root: the one place a root URI becomes a pyarrow filesystem.

Every role opens its storage root here (the brokers through `Storage`, source/ledger/storage.py;
the compaction worker through the same `Storage`; the compaction job's Spark tasks through
`open_root` on the URI `Storage.root_uri` gives them), so all of them open the same root the
same way.

- A plain path, or `file://...`: the local filesystem.
- `s3://bucket/prefix`: pyarrow's `S3FileSystem`, configured by `S3Options`:
  `endpoint` (`--s3-endpoint`, a URL such as `http://127.0.0.1:9000` for MinIO or another
  S3-compatible server; its scheme, http or https, is the connection's; none: AWS itself),
  `region` (`--s3-region`; none: `AWS_REGION` / `AWS_DEFAULT_REGION` / the AWS config, else
  us-east-1). Credentials are never flags (they would show in `ps`): the standard AWS
  environment variables `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and
  `AWS_SESSION_TOKEN`) when set, else the AWS SDK's default chain (profile, instance role).
- An S3 URI that carries its own query (`s3://b/p?endpoint_override=h:p&scheme=http&region=r`,
  pyarrow's URI options) is opened by pyarrow as it is, credentials again from the
  environment. `S3Options.task_uri` writes that form for the Spark tasks, which run in other
  processes (the worker's environment, credentials included, is theirs).
- Any other scheme pyarrow knows (`gs://`, `hdfs://`, ...) is opened by pyarrow's
  `FileSystem.from_uri`.
"""
from __future__ import annotations

import argparse
import os
import urllib.parse
from dataclasses import dataclass

import pyarrow.fs as pafs


@dataclass(frozen=True)
class S3Options:
    endpoint: str | None = None   # URL of an S3-compatible server; None: AWS
    region: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint is not None:
            _split_endpoint(self.endpoint)  # ValueError on a malformed one

    def filesystem(self) -> pafs.S3FileSystem:
        # allow_delayed_open: an object smaller than a part is one PutObject when its stream
        # closes, not a multipart upload of three requests opened at `open_output_stream`
        # (a WAL object's PUT took 25 ms on the local S3 server, 9 ms this way). An error
        # (no such bucket, denied) is raised by the close, which every writer here awaits.
        kw: dict[str, str | bool | None] = {"allow_delayed_open": True}
        if self.endpoint:
            scheme, host = _split_endpoint(self.endpoint)
            kw.update(endpoint_override=host, scheme=scheme)
        if self.region:
            kw["region"] = self.region
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            kw.update(access_key=key, secret_key=secret,
                      session_token=os.environ.get("AWS_SESSION_TOKEN") or None)
        return pafs.S3FileSystem(**kw)

    def task_uri(self, uri: str) -> str:
        """`uri` (`s3://bucket/prefix`) with these options as pyarrow URI query options."""
        q: dict[str, str] = {}
        if self.endpoint:
            scheme, host = _split_endpoint(self.endpoint)
            q.update(endpoint_override=host, scheme=scheme)
        if self.region:
            q["region"] = self.region
        return uri + ("?" + urllib.parse.urlencode(q) if q else "")


def _split_endpoint(endpoint: str) -> tuple[str, str]:
    """`http://host:port` -> ("http", "host:port"); a bare `host:port` means https."""
    if "://" not in endpoint:
        endpoint = "https://" + endpoint
    u = urllib.parse.urlsplit(endpoint)
    if u.scheme not in ("http", "https") or not u.netloc or u.path not in ("", "/") \
            or u.query:
        raise ValueError(f"S3 endpoint {endpoint!r}: expected http(s)://HOST[:PORT]")
    return u.scheme, u.netloc


def is_s3(root: str) -> bool:
    return root.startswith("s3://")


def open_root(root: str, s3: S3Options | None = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem of storage root `root` and the root's path in it (no trailing `/`)."""
    if "://" not in root:
        return pafs.LocalFileSystem(), os.path.abspath(root).rstrip("/")
    if is_s3(root) and "?" not in root:
        u = urllib.parse.urlsplit(root)
        if not u.netloc:
            raise ValueError(f"storage root {root!r}: no bucket (expected s3://BUCKET/PREFIX)")
        base = (u.netloc + u.path).rstrip("/")
        return (s3 or S3Options()).filesystem(), base
    fs, base = pafs.FileSystem.from_uri(root)
    return fs, base.rstrip("/")


class RootUnavailable(Exception):
    """The storage root cannot be used (no such bucket, the server does not answer, ...)."""


def check_root(fs: pafs.FileSystem, base: str, uri: str) -> None:
    """Raise `RootUnavailable` with a one-line reason when an object-store root's bucket is
    missing or its server cannot be reached (a local root is created by its broker)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return
    bucket = base.split("/", 1)[0]
    try:
        info = fs.get_file_info(bucket)
    except OSError as exc:
        reason = " ".join(str(exc).split())
        raise RootUnavailable(f"storage root {uri}: cannot reach it: {reason}") from None
    if info.type == pafs.FileType.NotFound:
        raise RootUnavailable(f"storage root {uri}: no bucket {bucket!r} "
                              "(create it first, and check --s3-endpoint)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`--s3-endpoint`, `--s3-region` (every role that opens a storage root takes them)."""
    p.add_argument("--s3-endpoint", default=None, metavar="URL",
                   help="an s3:// storage root's S3-compatible server, e.g. "
                        "http://127.0.0.1:9000 (MinIO); default: AWS. Credentials come from "
                        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the environment (or the "
                        "AWS SDK's default chain), never from a flag")
    p.add_argument("--s3-region", default=None, metavar="REGION",
                   help="an s3:// storage root's region (default: AWS_REGION / "
                        "AWS_DEFAULT_REGION / the AWS config, else us-east-1)")


def options_from(p: argparse.ArgumentParser, a: argparse.Namespace) -> S3Options:
    """The S3 options of parsed flags; a malformed endpoint ends with `p.error`."""
    try:
        return S3Options(endpoint=a.s3_endpoint or None, region=a.s3_region or None)
    except ValueError as exc:
        p.error(f"--s3-endpoint: {exc}")
        raise  # not reached
