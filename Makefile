# Two commands do all the set-up: `make train` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup train test test-fast lint bench parity-report preflight docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[torch,pretrained,tpu,dev,wandb]'
	@touch $(STAMP)

train: $(STAMP)
	$(PY) -m jaxtpu.train $(ARGS)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest $(ARGS)

# The fast tier: no subprocess, no TPU or cross-framework compile, no torch_xla side, no real
# JAX model run (conftest.py enforces the marks). `make test` runs everything.
test-fast: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -m "not e2e and not compile and not torch and not model" $(ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks.compare $(ARGS)

parity-report: $(STAMP)
	$(PY) -m parity_tests.report $(ARGS)

preflight: $(STAMP)
	$(PY) -m jaxtpu.preflight $(ARGS)

clean:
	rm -rf $(VENV)

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
