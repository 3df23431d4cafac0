# One entry point for developers and CI. Every target uses the project's own virtual environment,
# installed from the locks in locks/ (docs/development.md): pip takes exactly the pinned files,
# checked against their SHA-256 (--require-hashes), whatever day it runs.

PYTHON ?= python3
export PYTHON
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# A new environment holding exactly one lock, nothing unpinned, nothing unhashed (uv, itself from
# locks/installer.txt): INSTALL_LOCK <venv> <lock>.
INSTALL_LOCK := tools/install_lock.sh
# This checkout, editable and without dependencies (they are the lock's), into environment $(1).
INSTALL_PROJECT = UV_NO_CONFIG=1 $(1)/bin/uv pip install --quiet --python $(1)/bin/python --no-deps --no-build-isolation -e .

.PHONY: help venv run test test-deps test-fast bytecode collector-release check system-deps mitm-deps lint protos protos-check proto-lint vectors vectors-check openapi unit integration e2e e2e-durations bench bench-deps bench-envelope bench-latency bench-enroll bench-tunnel bench-idle bench-storm bench-throughput bench-bridge-calls bench-salt salt-deps bench-collector-dist chaos failover-drill fuzz console-screenshots axe-deps clean lock lock-upgrade lock-check licenses licenses-core audit

help:
	@echo "make run      - bring up the whole control plane (embedded PostgreSQL and Redis by default)"
	@echo "make test     - lint, stale-stub and proto checks, then every test"
	@echo "make test-fast - unit and integration tests on two workers: the edit loop (about 2.5 minutes)"
	@echo "make protos   - regenerate gen/ from protos/"
	@echo "make lint     - ruff and mypy --strict on hand-written code"
	@echo "make vectors  - regenerate vectors/envelope/ and vectors/protocol/client_contract.json"
	@echo "make openapi  - regenerate docs/openapi.json from the gateway app"
	@echo "make bench    - run every benchmark (results belong in docs/benchmarks.md)"
	@echo "make chaos    - five minutes of injected faults, then check every promise (SEED=n)"
	@echo "make failover-drill - the chaos workload on Patroni + etcd + Sentinel: primary, etcd member and Redis lost; 3 runs (SEED=n)"
	@echo "make collector-release - build the collector wheel and its release artifact (a PEX file) into dist/"
	@echo "make fuzz     - schemathesis against the gateway's OpenAPI document (EXAMPLES=n per operation)"
	@echo "make lock     - resolve locks/ again after a change to pyproject.toml or locks/*.in (pins kept)"
	@echo "make lock-upgrade [PACKAGES='a b'] - take the newest versions the inputs allow (all, or the named)"
	@echo "make licenses - list every locked dependency's licence; fail on one outside licenses/allowed.toml"
	@echo "make audit    - look the locks up in the vulnerability advisories (pip-audit; needs the network)"

venv: $(STAMP)

# A new environment each time the lock changes (an install over the old one would keep what the
# lock dropped). The project itself goes in editable, without its dependencies: they are the lock's.
$(STAMP): locks/dev.txt locks/installer.txt pyproject.toml
	$(INSTALL_LOCK) $(VENV) locks/dev.txt
	$(call INSTALL_PROJECT,$(VENV))
	@touch $(STAMP)

lock: $(STAMP)
	$(BIN)/python -m tools.locks refresh

lock-upgrade: $(STAMP)
	$(BIN)/python -m tools.locks refresh $(if $(PACKAGES),$(foreach p,$(PACKAGES),--upgrade-package $(p)),--upgrade)

lock-check: $(STAMP)
	$(BIN)/python -m tools.locks check

run: $(STAMP)
	$(BIN)/versus-cp up

# The end-to-end tests run on $(E2E_WORKERS) pytest-xdist workers, test by test as workers come free
# (--dist worksteal; each worker picks ports from its own range: tests/conftest.py). Most share
# one control plane per worker (tests/e2e/conftest.py), so a test's cost is its own work. Three
# workers: with two, the cores idled a third of the time while both waited out long tests.
E2E_WORKERS ?= 3
# Schemathesis gives every generated test the same node id, which xdist cannot tell apart (all
# but one would silently not run): the fuzz test runs in a process of its own.
SERIAL_E2E := tests/e2e/test_fuzz_gateway.py

# Four processes at once, each pytest in its own temporary directory (under /tmp: embedded
# servers' socket paths stay short) so none prunes another's: the static checks, unit and
# integration tests on two workers, the fuzz test, and the end-to-end suite, which is the longest
# and prints as it goes; the others' output follows once all have finished. The checks and the
# shorter suites fill the cores the end-to-end workers leave idle while they wait on processes.
# The static checks run niced: nothing waits on them, so they take what the tests leave idle (the
# end-to-end suite's waits, its last long tests) rather than CPU the critical path needs.
# Any failure fails the target. Where the time goes: docs/development.md. What the tests need
# is made first, side by side: the environments install one package at a time, each on one core.
test:
	@$(MAKE) --no-print-directory -j3 test-deps
	@tmp=$$(mktemp -d /tmp/versus-test.XXXXXX); \
	nice -n 10 $(MAKE) --no-print-directory check > $$tmp/check.log 2>&1 & check=$$!; \
	$(BIN)/pytest tests/unit tests/integration -n 2 --dist worksteal --basetemp=$$tmp/fast > $$tmp/fast.log 2>&1 & \
	fast=$$!; \
	$(BIN)/pytest $(SERIAL_E2E) --basetemp=$$tmp/serial > $$tmp/serial.log 2>&1 & serial=$$!; \
	$(BIN)/pytest tests/e2e $(addprefix --ignore=,$(SERIAL_E2E)) -n $(E2E_WORKERS) --dist worksteal --basetemp=$$tmp/e2e; \
	e2e=$$?; \
	wait $$check; check=$$?; wait $$fast; fast=$$?; wait $$serial; serial=$$?; \
	echo "--- make check ---"; cat $$tmp/check.log; \
	echo "--- tests/unit and tests/integration ---"; cat $$tmp/fast.log; \
	echo "--- $(SERIAL_E2E) ---"; cat $$tmp/serial.log; \
	rm -rf $$tmp; \
	exit $$(( check || fast || serial || e2e ))

test-deps: system-deps mitm-deps axe-deps $(STAMP) bytecode

# The tree's own modules compiled once, up front. The machines this runs on set
# PYTHONDONTWRITEBYTECODE, so no process writes a cache: without this, each of a run's ~1,000
# Python processes compiled every module of the tree it imported anew (about 0.4 CPU-s of a
# service's start). The dependencies are compiled at install (tools/install_lock.sh). A module
# edited since is compiled again when imported, as before, so a stale file costs nothing.
TREE := bench chaos collector common console enrollment gateway gen router tests tools versus_cp
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 $(TREE)

check: lock-check lint proto-lint protos-check licenses-core

# The console's pages as the browser tests see them, into docs/console/ (docs/console.md).
console-screenshots: system-deps axe-deps $(STAMP)
	VERSUS_CONSOLE_SCREENSHOTS=docs/console $(BIN)/pytest tests/e2e/test_console_browser.py \
		tests/e2e/test_console_fleet.py tests/e2e/test_console_layout.py tests/e2e/test_release_sbom.py -q

# Debian packages the tests run for real: OpenSSH (client and the server the ssh driver's tests
# start in a network namespace), iproute2 (the namespaces), squid (the forward proxy a
# collector is tested behind), Chromium (the console's browser tests, driven by Playwright) and
# Node.js (npm installs axe-core; a control-socket client in another language, tests/support),
# stunnel4 (the TLS-terminating relay make bench-tunnel measures beside the tunnel), Prometheus
# (promtool checks and unit-tests the shipped rules; the server scrapes a control plane in e2e) and
# rsyslog with its TLS driver (the syslog receiver of the audit export drill), and the highly
# available data tier of deploy/: PostgreSQL 15 under Patroni with etcd as its consensus store
# (the failover drill). Debian's Patroni 3.0 predates PostgreSQL 16, so this tier runs 15; Patroni
# takes any of several store clients as its dependency, so python3-etcd is named here.
# Installed once, as root, with apt. "Installed" means dpkg's status says so: a package removed
# but not purged is still known to `dpkg -s`, which succeeds for it.
SYSTEM_PACKAGES := openssh-client openssh-server iproute2 squid systemd chromium haproxy redis-sentinel nodejs stunnel4 prometheus rsyslog rsyslog-gnutls \
	postgresql-15 patroni python3-etcd etcd-server etcd-client

# mitmproxy, the TLS-inspecting proxy the collector is tested through (tests/support/mitm.py). It
# pins its own dependencies, so it gets its own virtual environment and lock (locks/mitmproxy.in),
# as Salt does for the benchmarks.
MITM_VENV := .venv-mitm
# SaltStack, the peer of the latency and throughput benchmarks (bench/salt.py), in its own environment.
SALT_VENV := .venv-salt

mitm-deps: $(MITM_VENV)/.installed

# axe-core (npm), the accessibility engine the console's browser tests run in Chromium; the
# version and its integrity hash are locked in tools/axe/package-lock.json.
AXE_DIR := tools/axe
axe-deps: $(AXE_DIR)/node_modules/.installed

$(AXE_DIR)/node_modules/.installed: $(AXE_DIR)/package-lock.json
	npm ci --prefix $(AXE_DIR) --no-audit --no-fund --silent
	@touch $@

$(MITM_VENV)/.installed: locks/mitmproxy.txt locks/installer.txt
	$(INSTALL_LOCK) $(MITM_VENV) locks/mitmproxy.txt
	@touch $@

system-deps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

proto-lint: $(STAMP)
	$(BIN)/buf lint
	$(BIN)/buf format --diff --exit-code

protos: $(STAMP)
	$(BIN)/python -m tools.protos generate

protos-check: $(STAMP)
	$(BIN)/python -m tools.protos check

vectors: $(STAMP)
	$(BIN)/python -m tools.gen_envelope_vectors
	$(BIN)/python -m tools.gen_contract_vectors

vectors-check: $(STAMP)
	$(BIN)/python -m tools.gen_envelope_vectors --check
	$(BIN)/python -m tools.gen_contract_vectors --check

openapi: $(STAMP)
	$(BIN)/python -m tools.openapi

# Benchmarks run in their own environment (the dev lock plus the bench extra), so .venv stays
# exactly the dev lock.
BENCH_VENV  := .venv-bench
BENCH_BIN   := $(BENCH_VENV)/bin
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): locks/bench.txt locks/installer.txt pyproject.toml
	$(INSTALL_LOCK) $(BENCH_VENV) locks/bench.txt
	$(call INSTALL_PROJECT,$(BENCH_VENV))
	@touch $(BENCH_STAMP)

bench-deps: $(BENCH_STAMP)

bench: bench-envelope bench-latency bench-throughput bench-salt bench-enroll bench-tunnel bench-idle bench-storm bench-bridge-calls bench-collector-dist bench-console

bench-envelope: $(STAMP)
	$(BIN)/python -m bench.envelope

# The edit loop: unit and integration tests, no lint, on two workers (each with its own embedded
# PostgreSQL and Redis: tests/conftest.py), test by test as workers come free.
test-fast: $(STAMP) system-deps bytecode
	$(BIN)/pytest tests/unit tests/integration -n 2 --dist worksteal

unit: $(STAMP)
	$(BIN)/pytest tests/unit

integration: $(STAMP) system-deps
	$(BIN)/pytest tests/integration

e2e: $(STAMP) system-deps
	$(BIN)/pytest tests/e2e

# Record how long each end-to-end test takes on this machine (tests/e2e/durations.json): the test
# command's workers are handed the slowest first and end together (tests/support/schedule.py).
e2e-durations: $(STAMP) system-deps bytecode
	VERSUS_RECORD_DURATIONS=tests/e2e/durations.json $(BIN)/pytest tests/e2e \
		$(addprefix --ignore=,$(SERIAL_E2E)) -n $(E2E_WORKERS) --dist worksteal -q

# Faults against real processes for five minutes; a short smoke run is part of `make test`.
chaos: $(STAMP)
	$(BIN)/python -m chaos.run --seed $${SEED:-1} --seconds 300 --rate 4 --fault-every 8 --json chaos-report.json

# The data tier's failover drill (chaos/ha.py), three runs in a row on seeds SEED, SEED+1, SEED+2;
# each prints its write-unavailability window and its violation count.
failover-drill: system-deps $(STAMP)
	@seed=$${SEED:-1}; for run in 1 2 3; do \
		echo "== failover drill, run $$run of 3, seed $$seed"; \
		$(BIN)/python -m chaos.run --drill --seed $$seed --seconds 100 --rate 4 --fault-every 15 \
			--json failover-drill-$$run.json || exit 1; \
		seed=$$((seed + 1)); \
	done

# Schemathesis against docs/openapi.json with fresh random draws (the test command runs 30 examples each).
fuzz: $(STAMP)
	VERSUS_FUZZ_EXAMPLES=$${EXAMPLES:-1000} HYPOTHESIS_PROFILE=explore $(BIN)/python -m pytest -q \
		tests/e2e/test_fuzz_gateway.py

collector-release: $(STAMP)
	$(BIN)/python -m tools.collector_dist --out dist --pex

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(MITM_VENV) $(SALT_VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache

bench-collector-dist: $(STAMP)
	$(BIN)/python -m bench.collector_dist --json bench/results/collector_dist.json

bench-latency: $(BENCH_STAMP)
	$(BENCH_BIN)/python -m bench.latency

bench-enroll: $(BENCH_STAMP)
	$(BENCH_BIN)/python -m bench.enroll

bench-tunnel: $(BENCH_STAMP) system-deps
	$(BENCH_BIN)/python -m bench.tunnel

bench-idle: $(BENCH_STAMP)
	$(BENCH_BIN)/python -m bench.idle

# A gateway SIGKILLed under 1,000 and 10,000 idle collectors: how long until all are back.
bench-storm: $(BENCH_STAMP)
	$(BENCH_BIN)/python -m bench.storm
	$(BENCH_BIN)/python -m bench.storm --fleet 1000 --transport https --anonymous-per-source 256 \
		--json bench/results/storm_nat_1k.json
	$(BENCH_BIN)/python -m bench.overload --fleet 3000 --rate 120 --json bench/results/overload_3k.json
	$(BENCH_BIN)/python -m bench.overload --fleet 10000 --rate 400 --json bench/results/overload_10k.json

bench-console: $(BENCH_STAMP) system-deps
	$(BENCH_BIN)/python -m bench.console

salt-deps: $(SALT_VENV)/.installed

$(SALT_VENV)/.installed: locks/salt.txt locks/installer.txt
	$(INSTALL_LOCK) $(SALT_VENV) locks/salt.txt
	touch $@

bench-salt: $(STAMP) salt-deps
	$(BIN)/python -m bench.salt

bench-throughput: $(BENCH_STAMP)
	$(BENCH_BIN)/python -m bench.throughput

bench-bridge-calls: $(BENCH_STAMP)
	$(BENCH_BIN)/python -m bench.bridge_calls

# The licence of every locked dependency against locks/licenses.toml (tools/licenses.py), in the
# environment each lock is installed in. licenses-core, part of `make check`, reads .venv, which holds
# the control-plane, collector and dev locks; `make licenses` builds and reads the others too.
licenses: $(STAMP) bench-deps mitm-deps salt-deps
	$(BIN)/python -m tools.licenses

licenses-core: $(STAMP)
	$(BIN)/python -m tools.licenses --lock control-plane --lock collector --lock dev --quiet

# Known vulnerabilities in every lock (pip-audit against PyPI's advisories; SERVICE=osv for OSV).
# Needs the advisory source on the network: exits 2, not 0, when it could not look everything up.
audit: $(STAMP)
	$(BIN)/python -m tools.audit --service $${SERVICE:-pypi}
