# Two entry points for a newcomer: `make demo` (the main job) and `make test`.
# Both create .venv when it is missing and install the toolkit into it.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: test test-slow demo install clean bench

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-install when the package metadata changes.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

demo: $(STAMP)
	$(PY) -m perceptual demo

bench: $(STAMP)
	$(PY) benchmarks/bench_inversion.py
	$(PY) benchmarks/bench_training.py
	$(PY) benchmarks/bench_observer.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
