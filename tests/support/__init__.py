"""The test kit shared by the test modules (pyproject's pytest `pythonpath = ["tests"]` makes
it `support.*`): fakes (fakes.py), waiting helpers (waiting.py), harnesses of the unit suites
(ledger_env.py, read_harness.py, subscriptions_harness.py, fake_broker.py) and process
helpers of the integration suites (etcd_support.py, s3_support.py, metrics_support.py,
compaction_support.py, compacted_read.py, standalone.py, brokers.py, outage.py). A test
module imports from here, never from another test module."""
