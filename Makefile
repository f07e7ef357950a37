# The README's two commands: `make demo` (main job on an embedded default) and `make test`.
# Each does the set-up it needs; set-up is a no-op when already done.
VENV ?= .venv
PY := $(VENV)/bin/python
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup demo test ops lint clean

setup:
	@bash scripts/setup.sh

ops:
	@$(MAKE) -s -j"$$(nproc)" -C ops PYTHON=$(abspath $(PY))

# The main job: generate users -> horovodrun -np 2 meta-training -> cold-start eval against
# the baseline -> SavedModel export -> serve it in a fresh process -> summary table.
demo: setup
	@$(PY) -m gmeta_tf.demo $(DEMO_ARGS)

# Two test processes (pytest-xdist), each taking whole files so a module's fixture (a
# trained run) is made once; TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2
test: setup
	@$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# The linter is pinned and installed on first use (the rules are in pyproject.toml).
RUFF_VERSION := 0.16.9
lint: setup
	@$(PY) -m ruff --version 2>/dev/null | grep -qx "ruff $(RUFF_VERSION)" \
	  || $(PY) -m pip install --quiet "ruff==$(RUFF_VERSION)"
	@$(PY) -m ruff check gmeta_tf tests benchmarks

clean:
	@$(MAKE) -s -C ops clean
