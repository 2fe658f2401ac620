"""Compaction (PIP-14) with Spark: the plan (plan.py), the manifest of its output
(manifest.py), the reference semantics the tests hold the job to (reference.py), the Spark
job (spark_job.py) and what its tasks run (arrow_tasks.py), the warm session (session.py),
publishing and collecting (commit.py) and the worker process (worker.py:
`python -m shadowtopic.compaction.worker`)."""
from shadowtopic.compaction.plan import Plan, make_plan

__all__ = ["Plan", "make_plan"]
