# Two set-up commands: `make demo` and `make test`. Everything they need is installed here.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
FLINK_VENV := .venv-flink
STAMP := $(VENV)/.installed
FLINK_STAMP := $(FLINK_VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export TIDEMARK_FLINK_PYTHON := $(abspath $(FLINK_VENV)/bin/python)

.PHONY: install install-flink test docs-check conformance conformance-rest demo bench bench-quick bench-nexmark-quick clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,profile]'
	touch $(STAMP)

# Flink 2.3 is the conformance oracle. Its pinned dependencies (py4j, pyarrow, beam)
# clash with pyspark's, so it lives in a venv of its own and is driven as a subprocess.
$(FLINK_STAMP):
	test -x $(FLINK_VENV)/bin/python || $(PYTHON) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/python -m pip install -q apache-flink==2.3.0 psutil==7.2.2
	touch $(FLINK_STAMP)

install: $(STAMP)
install-flink: $(FLINK_STAMP)

test: $(STAMP) $(FLINK_STAMP)
	$(PY) -m pytest -m "not slow" tests

# every runnable command block of README.md and docs/, the Spark-heavy ones too (make test
# runs the fast ones); see tests/docs/test_runnable_blocks.py for the marker convention
docs-check: $(STAMP)
	$(PY) -m pytest tests/docs

# The full suites in three parts at once, each a pytest process with its own Flink JVM: the
# generated workloads' seeds 1-75 and 76-150, and every other conformance file with the Nexmark
# queries. Each line is prefixed with its part; a seeds part prints nothing while its oracle runs.
# Other splits: make conformance CONFORMANCE_SEEDS="1-50 51-100 101-150"
CONFORMANCE_SEEDS ?= 1-75 76-150
CONFORMANCE_PARTS := $(addprefix conformance-seeds-,$(CONFORMANCE_SEEDS)) conformance-rest
CONFORMANCE_TMP := $${TMPDIR:-/tmp}/tidemark

conformance: $(STAMP) $(FLINK_STAMP)
	$(MAKE) --no-print-directory -j$(words $(CONFORMANCE_PARTS)) --output-sync=line $(CONFORMANCE_PARTS)

conformance-seeds-% conformance-rest: SHELL := /bin/bash
conformance-seeds-% conformance-rest: .SHELLFLAGS := -o pipefail -c

conformance-seeds-%: $(STAMP) $(FLINK_STAMP)
	TIDEMARK_CONFORMANCE=full TIDEMARK_CONFORMANCE_SEEDS=$* $(PY) -m pytest -m conformance \
	  --basetemp=$(CONFORMANCE_TMP)-$@ tests/conformance/test_flink_conformance.py 2>&1 | sed -u 's/^/[$@] /'

conformance-rest: $(STAMP) $(FLINK_STAMP)
	TIDEMARK_CONFORMANCE=full $(PY) -m pytest -m conformance --basetemp=$(CONFORMANCE_TMP)-$@ \
	  tests/conformance tests/nexmark --ignore=tests/conformance/test_flink_conformance.py 2>&1 | sed -u 's/^/[$@] /'

# Tidemark and Flink 2.3 side by side: sizes live in tests/bench/suite.py (FULL, QUICK). make bench is
# the sustained mode (>= 200,000 records per workload drained in ~5 micro-batches, steady-state clock,
# then the latency phase at 10,000 rows/s); make bench-quick the harness's one-minute smoke run.
bench: $(STAMP) $(FLINK_STAMP)
	$(PY) tests/bench/suite.py --out docs/benchmarks.md --json tests/bench/results.json

bench-quick: $(STAMP) $(FLINK_STAMP)
	$(PY) tests/bench/suite.py --quick --json $${TMPDIR:-/tmp}/tidemark-bench-quick.json

# the Nexmark queries alone (tests/bench/nexmark_bench.py), at the smoke run's size
bench-nexmark-quick: $(STAMP) $(FLINK_STAMP)
	$(PY) tests/bench/suite.py --quick --only nexmark --json $${TMPDIR:-/tmp}/tidemark-bench-nexmark-quick.json

demo: $(STAMP)
	$(PY) -m tidemark.control.demo

clean:
	rm -rf $(VENV) $(FLINK_VENV) build *.egg-info
