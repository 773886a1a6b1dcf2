# Two commands do all the set-up: `make train` and `make test`.
#
# They use the newest supported stack (requirements/newest.txt: jax 0.12, Python 3.12, what
# Colab and Kaggle run) when the machine has Python 3.12, else the oldest (requirements/
# oldest.txt: jax 0.10.2 on Python 3.11). `make test-oldest` runs CI's second leg: the oldest
# stack in .venv-oldest on a representative subset of the tests.
NEWEST := $(shell requirements/find-python 3.12)
ifneq ($(NEWEST),)
PYTHON ?= $(NEWEST)
LOCK   ?= requirements/newest.txt
else
PYTHON ?= $(shell requirements/find-python 3.11)
LOCK   ?= requirements/oldest.txt
endif
# ACCEL=cuda: NVIDIA GPUs (Kaggle's T4 x2 and P100, Colab's T4, L4, A100; docs/gpu.md): jax's
# CUDA 12 plugin instead of the TPU compiler, from requirements/cuda.txt (newest.txt's versions).
ACCEL  ?= tpu
ifeq ($(filter $(ACCEL),tpu cuda),)
$(error ACCEL=$(ACCEL): expected tpu (the default: TPUs and CPUs) or cuda (NVIDIA GPUs))
endif
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ifeq ($(ACCEL),cuda)
LOCK   := requirements/cuda.txt
PYTHON := $(NEWEST)
STAMP  := $(VENV)/.installed-cuda
endif
EXTRAS := jax,torch,pretrained,$(ACCEL),dev,wandb,onnx,gcs,serve
# The installer: uv (from PyPI, into each venv by the venv's own pip), which resolves and
# downloads in parallel and links each package from one cache (~/.cache/uv) into every venv
# that wants it, so CI's three environments of ~9 GB download the big wheels once and cost
# seconds after the first (measured here, cold caches: pip 252 s, uv 35 s for the newest lock).
# --compile-bytecode writes every module's .pyc at install, as pip does and uv by default does
# not: with PYTHONDONTWRITEBYTECODE set (as on this machine) nothing writes them later, and
# every process compiled torch, transformers and JAX from source again: 4-6 s more per
# training process (a tiny jaxtpu run 10.7 s -> 6.6 s, a torch_xla one 20.8 s -> 14.9 s), of
# which the suite starts hundreds. It costs about 25 s per install.
UV_VERSION := 0.13.9
# The project's own modules, compiled before the tests for the same reason (a second or two).
COMPILE := $(PY) -m compileall -q -j 0 jaxtpu torchxla_ref parity_tests benchmarks devtools tests

.PHONY: setup setup-archive train serve test test-fast test-oldest test-py313 lint bench parity-report preflight docs compile clean

setup: $(STAMP)

# A venv of another Python (or none) is made again; the lock's exact versions are installed.
$(STAMP): pyproject.toml $(LOCK)
	@test -n "$(PYTHON)" || { echo "make: needs Python 3.12 or 3.11 (python3.12 or python3.11 on PATH, or pyenv)"; exit 1; }
	@if [ -x $(PY) ] && [ "$$($(PY) -c 'import sys; print(sys.version_info[:2])')" != "$$($(PYTHON) -c 'import sys; print(sys.version_info[:2])')" ]; then \
		echo "$(VENV) is another Python's: made again with $(PYTHON)"; rm -rf $(VENV); fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@start=$$(date +%s); \
	$(PY) -m pip install --quiet 'uv==$(UV_VERSION)' && \
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -c $(LOCK) \
		-e '.[$(EXTRAS)]' && \
	echo "make: installed $(LOCK) into $(VENV) in $$(( $$(date +%s) - start )) s"
	@touch $(STAMP)

train: $(STAMP)
	$(PY) -m jaxtpu.train $(ARGS)

# Perspective API's endpoint at 127.0.0.1:8080 for the newest run under runs/ (what `make train`
# just wrote), or WORKDIR=DIR: `jaxtpu serve` (docs/perspective.md).
WORKDIR ?= $(shell ls -td runs/*/config.json 2>/dev/null | head -1 | xargs -r dirname)
serve: $(STAMP)
	@test -n "$(WORKDIR)" || { echo "make serve: no run under runs/ (make train first, or WORKDIR=DIR)"; exit 2; }
	$(PY) -m jaxtpu.serve --workdir $(WORKDIR) $(ARGS)

# The whole suite on TEST_WORKERS pytest-xdist workers (default 2, one a core on the 2-core
# machine it is budgeted on; each test file stays on one worker, so its module fixtures are
# made once, and files are handed out in collection order, so the longest, parity_tests/
# test_parity.py, collected first, starts at once rather than last); TEST_WORKERS=0 runs it
# in this process, one test after another. Three workers were measured here on 2026-12-07
# (pytest's time; 1,506.8 s on two at ddc2a83): 1,402.9 s at ddc2a83, 1,820.8 s at 9d6980b
# (the same tests) and 1,565.2 s with the longest files handed out first. The tests' summed
# time grew 1.4x, 1.8x and 1.6x over two workers' 2,914 s where sharing two cores three ways
# alone costs 1.5x: their processes run several threads each, and when CPU-bound files meet
# they lose more to contention than the waiting tests give back. Not a gain to count on.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile
FAST  := -m "not e2e and not compile and not torch and not model"
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(COMPILE)
	$(PY) -m pytest $(XDIST) --no-loadscope-reorder $(ARGS)

# The fast tier: no subprocess, no TPU or cross-framework compile, no torch_xla side, no real
# JAX model run (conftest.py enforces the marks), on the same workers as `make test`, which
# runs everything.
test-fast: $(STAMP)
	$(PY) -m ruff check .
	$(COMPILE)
	$(PY) -m pytest $(XDIST) $(FAST) $(ARGS)

# CI's second leg: the oldest supported stack (Python 3.11, jax 0.10.2, flax 0.12.8) on a
# representative subset: every strategy and task, the BERT layer kind, the torch side, a TPU
# target's compile, installing beside an existing JAX, JAX's preemption sync point on two
# processes writing a bucket run, and the fast tier.
OLDEST_TESTS := tests/test_train.py tests/test_multilabel.py tests/test_torchxla_ref.py \
	tests/test_packaging.py tests/test_notebook.py \
	"tests/test_preflight.py::test_tpu_readiness_every_code_path_compiles_for_a_tpu_v3_slice" \
	"tests/test_bucket.py::test_two_processes_write_one_bucket_run_and_stop_together_on_sigterm"
test-oldest:
	$(MAKE) --no-print-directory setup VENV=.venv-oldest LOCK=requirements/oldest.txt \
		PYTHON=$(shell requirements/find-python 3.11)
	$(MAKE) --no-print-directory compile PY=.venv-oldest/bin/python
	.venv-oldest/bin/python -m pytest -p no:cacheprovider $(XDIST) $(OLDEST_TESTS) $(ARGS)
	.venv-oldest/bin/python -m pytest -p no:cacheprovider $(XDIST) $(FAST) $(ARGS)

# The other end of the Python range: 3.13 (when the machine has it) on the newest lock, for
# the fast tier, packaging and the notebook.
test-py313:
	@test -n "$(shell requirements/find-python 3.13)" || { echo "make: no Python 3.13 here; skipped"; exit 0; }; \
	$(MAKE) --no-print-directory setup VENV=.venv-py313 LOCK=requirements/newest.txt \
		PYTHON=$(shell requirements/find-python 3.13) && \
	$(MAKE) --no-print-directory compile PY=.venv-py313/bin/python && \
	.venv-py313/bin/python -m pytest -p no:cacheprovider $(XDIST) \
		tests/test_packaging.py tests/test_notebook.py $(ARGS) && \
	.venv-py313/bin/python -m pytest -p no:cacheprovider $(XDIST) $(FAST) $(ARGS)

# `jaxtpu archive` (Apache Beam): an environment of its own, .venv-archive, from
# requirements/archive.txt, since Beam 2.77 pins older numpy, protobuf and pyarrow than the
# newest lock's; the run's model (jax) and an export's (onnxruntime), no torch. tests/
# test_archive.py makes it when missing and drives its `jaxtpu archive` from the main suite.
setup-archive:
	$(MAKE) --no-print-directory setup VENV=.venv-archive LOCK=requirements/archive.txt \
		PYTHON=$(NEWEST) EXTRAS=jax,serve-onnx,archive

bench: $(STAMP)
	$(PY) -m benchmarks.training.compare $(ARGS)

parity-report: $(STAMP)
	$(PY) -m parity_tests.report $(ARGS)

preflight: $(STAMP)
	$(PY) -m jaxtpu.preflight $(ARGS)

compile:
	$(COMPILE)

clean:
	rm -rf $(VENV) .venv-oldest .venv-py313 .venv-archive

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
