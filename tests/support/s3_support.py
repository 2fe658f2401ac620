"""A real S3 API for the object-store tests: moto's server mode as a child process.

`MotoS3` starts `python -m moto.server` on a free loopback port (the process dies with the
test process, source/process.py), waits until it answers S3's ListBuckets, and stops it with
`close()` (or as a context manager). `create_bucket(name)` makes a bucket through boto3
(which moto brings); `env` holds the credentials every role is given through the standard
AWS environment variables (moto accepts any), `s3_args()` the flags that point a broker or
worker at it; `filesystem()` is pyarrow's view of the same server, for a test to list what
landed in a bucket.

moto keeps everything in memory: a test module gets one server (a module-scoped fixture)
and one bucket per test (`new_bucket()`), so tests never see each other's objects.
"""
from __future__ import annotations

import os
import sys
import time
import uuid

import boto3
import pyarrow.fs as pafs
from botocore.config import Config

from shadowtopic.broker.server import free_port
from shadowtopic.process import spawn

HOST = "127.0.0.1"
REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "shadowtopic-test", "AWS_SECRET_ACCESS_KEY": "not-a-secret"}


class MotoS3:
    def __init__(self, log_dir: str):
        self.port = free_port()
        self.log_path = os.path.join(log_dir, "moto.log")
        self.proc = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a role's environment gets: the credentials (never flags) and the region."""
        return {**CREDENTIALS, "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}

    def s3_args(self) -> list[str]:
        return ["--s3-endpoint", self.endpoint, "--s3-region", REGION]

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                            config=Config(retries={"max_attempts": 1}, connect_timeout=2,
                                          read_timeout=10))

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(endpoint_override=f"{HOST}:{self.port}", scheme="http",
                                 region=REGION, access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                 secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def start(self, timeout: float = 60.0) -> MotoS3:
        self.proc = spawn([sys.executable, "-m", "moto.server", "-H", HOST, "-p",
                           str(self.port)], self.log_path)
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        for _ in range(int(timeout * 10) + 1):  # bounded: every 0.1 s until the deadline
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited ({self.proc.returncode}): "
                                   f"{self._log_tail()}")
            try:
                self.client().list_buckets()
                return self
            except Exception as exc:  # noqa: BLE001 - not listening yet
                last = exc
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.close()
        raise RuntimeError(f"moto server did not answer within {timeout}s: {last}")

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def new_bucket(self) -> str:
        return self.create_bucket(f"st-{uuid.uuid4().hex[:12]}")

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key under `prefix` in `bucket` (listed through pyarrow)."""
        sel = pafs.FileSelector(f"{bucket}/{prefix}".rstrip("/"), recursive=True,
                                allow_not_found=True)
        return sorted(i.path[len(bucket) + 1:] for i in self.filesystem().get_file_info(sel)
                      if i.type == pafs.FileType.File)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
