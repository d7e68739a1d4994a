# The two set-up commands of the README: `make reproduce` and `make test`.
# Each creates .venv if missing and installs the pinned dependencies (constraints.txt) first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.iclab-installed
PRESET ?= quick
OUT    ?= runs

.PHONY: install test test-all verify-paper lint format reproduce bench docs clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt --no-build-isolation -e ".[dev,docs,ray,slurm]"
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts docs/hooks.py docs/tutorials
	$(VENV)/bin/ruff format --check src tests benchmarks scripts docs/hooks.py docs/tutorials
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n 2
	ICLAB_NATIVE=0 $(PY) -m pytest -q -n 0 tests/test_kernel_fast.py tests/test_categorical_fast.py tests/test_bilinear_fast.py tests/test_query_fast.py tests/test_moment_fast.py tests/test_symabs.py tests/test_native.py tests/test_lbfgs.py tests/test_second_derivatives.py

test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "slow or not slow"

# every paper preset that runs in about two minutes here, claims asserted (tests/test_paper_presets.py)
verify-paper: $(STAMP)
	$(PY) -m pytest -q -n 2 -m slow tests/test_paper_presets.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts docs/hooks.py docs/tutorials

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

# every experiment at PRESET, as many at a time as this machine has cores (the default --workers), longest first
reproduce: $(STAMP)
	$(VENV)/bin/iclab reproduce --preset $(PRESET) --out $(OUT)

bench: $(STAMP)
	$(VENV)/bin/iclab bench --out benchmarks/results

# the documentation site (mkdocs.yml) into site/; warnings, e.g. a broken cross-reference, fail the build
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
