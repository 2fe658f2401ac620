"""The compaction worker's SparkSession: built once and kept warm between jobs.

`local[*]` by default; any `spark.master` (a standalone cluster, `local-cluster[...]`) with
Spark settings passed as `conf`. The job (spark_job.py) uses Spark's core only (RDD tasks
that compute with Arrow, a broadcast, a treeReduce), so the defaults are few: no UI or
console progress (the job record carries progress), Python workers reused between tasks and
jobs, memory for the driver's merge of per-task tables, and the driver bound to loopback
unless `conf` says otherwise.
"""
from __future__ import annotations

import os
import sys

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "2g",
    "spark.executor.memory": "1g",
}


def build_session(master: str = "local[*]", conf: dict[str, str] | None = None,
                  app_name: str = "shadowtopic-compaction"):
    """A SparkSession for compaction jobs (`conf` overrides the defaults)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local-cluster"):  # executors are launched from SPARK_HOME
        import pyspark
        os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
