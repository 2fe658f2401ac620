"""The compaction worker's SparkSession: built once and kept warm between jobs.

`local[*]` by default; any `spark.master` (a standalone cluster, `local-cluster[...]`) with
Spark settings passed as `conf`. The job (spark_job.py) uses Spark's core only (RDD tasks
that compute with Arrow, a broadcast, a treeReduce), so the defaults are few: no UI or
console progress (the job record carries progress), Python workers reused between tasks and
jobs and reached over a Unix domain socket (over TCP each Spark job with Python tasks took
~40 ms longer on a 2-core machine: a small topic's whole compaction is a few such jobs),
memory for the driver's merge of per-task tables, and the driver bound to loopback unless
`conf` says otherwise.

Spark's own output (log4j, the JVM's and its Python workers' stderr) goes to a file of its
own (`log_path`, the worker's `--spark-log`) at `log_level` (WARN unless asked): the JVM is
started with that file as its stdout and stderr and a log4j2 configuration (written beside
the file) that logs at that level to stderr. Without `log_path` it shares the worker's.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "2g",
    "spark.executor.memory": "1g",
    "spark.python.unix.domain.socket.enabled": "true",
}


LOG4J2 = """\
# written by the shadowtopic compaction worker: Spark's log4j2 output, on the JVM's stderr
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def build_session(master: str = "local[*]", conf: dict[str, str] | None = None,
                  app_name: str = "shadowtopic-compaction", log_path: str | None = None,
                  log_level: str = "WARN"):
    """A SparkSession for compaction jobs (`conf` overrides the defaults); Spark logs to
    `log_path` at `log_level` (see the module's docstring)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local-cluster"):  # executors are launched from SPARK_HOME
        import pyspark
        os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    from pyspark.sql import SparkSession
    settings = {**DEFAULTS, **(conf or {})}
    if log_path is not None:
        props = _log4j2_file(log_path, log_level)
        opts = settings.get("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = \
            f"{opts} -Dlog4j2.configurationFile=file:{props}".strip()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _output_to(log_path):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level.upper())
    return spark


def _log4j2_file(log_path: str, level: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    props = os.path.join(os.path.dirname(os.path.abspath(log_path)), "spark-log4j2.properties")
    with open(props, "w") as f:
        f.write(LOG4J2.format(level=level.lower()))
    return props


@contextlib.contextmanager
def _output_to(log_path: str | None) -> Iterator[None]:
    """While the JVM starts (it inherits them), this process's stdout and stderr are
    `log_path`; they are put back before anything else runs here."""
    if log_path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)
