# Two entry points for a newcomer: `make demo` (the main job) and `make test`.
# Both create .venv when it is missing and install the toolkit into it, with the versions pinned in
# constraints.txt (refresh them with `make constraints`; `make test-latest` tries the newest releases).
PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed-dev
CONSTRAINTS := constraints.txt
LATEST      := .venv-latest

.PHONY: test test-slow test-gpu test-latest lint demo install constraints clean bench

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-install when the package metadata or the pins change.
$(STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# ruff: pyflakes, pycodestyle, import order and bugbear, configured in pyproject.toml.
lint: $(STAMP)
	$(PY) -m ruff check .

# pyproject's addopts deselect the tests marked slow.
test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# The whole suite with the pipelines on CUDA (REPALIGN_TEST_DEVICE), gpu-marked tests included; needs a GPU.
test-gpu: $(STAMP)
	REPALIGN_TEST_DEVICE=cuda $(PY) -m pytest -q

# The suite against the newest release of every dependency, in a virtual environment of its own; the packages
# that differ from constraints.txt are listed first, so an upstream release that breaks a test is named.
test-latest:
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[dev]"
	$(LATEST)/bin/python .ci/newer_than_constraints.py $(CONSTRAINTS)
	$(LATEST)/bin/python -m pytest -q

# Pin what .venv holds now (run after a green `make test-latest`, then `make test`).
constraints: $(STAMP)
	$(PY) .ci/newer_than_constraints.py --write $(CONSTRAINTS)

demo: $(STAMP)
	$(PY) -m perceptual demo

bench: $(STAMP)
	$(PY) benchmarks/bench_inversion.py
	$(PY) benchmarks/bench_training.py
	$(PY) benchmarks/bench_observer.py

clean:
	rm -rf $(VENV) $(LATEST) build *.egg-info .pytest_cache
