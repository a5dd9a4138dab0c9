# Set-up on a fresh machine: `make demo` runs the embedded default, `make test` runs the tests.
# Both create .venv from the committed lock file (uv.lock) first; nothing else is needed.
PYTHON ?= python3
UV_VERSION := 0.13.9
TOOLS := .cache/tools
UV := $(TOOLS)/bin/uv
VENV := .venv
EXTRAS := --extra dev --extra bio --extra real-model --extra ray
export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))
export UV_LINK_MODE := copy
# Every module compiled to bytecode once, at install: where PYTHONDONTWRITEBYTECODE is set (CI
# machines often set it) each process would otherwise compile torch, transformers, prefect and ray
# from source, 2-3x their import time in every test subprocess, worker and candidate.
export UV_COMPILE_BYTECODE := 1

.PHONY: setup demo test typecheck lint format lock clean-venv images test-images sandbox-tools test-services gpu-check

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) pyproject.toml uv.lock Makefile
	$(UV) sync --frozen $(EXTRAS)
	touch $@

setup: $(VENV)/.synced

demo: setup
	$(VENV)/bin/discover run configs/toy.yaml
	$(VENV)/bin/discover status runs/toy

# Evaluator images (images/): `make images` builds python-math, cpp20 and bio (gpu: add
# IMAGES=gpu, several GB from PyPI); the base is public when a registry answers, else the offline
# Debian base bootstrapped here (cached in .cache/images). Unchanged images are skipped.
IMAGES ?=
images: setup
	$(VENV)/bin/python images/build.py $(IMAGES)

# The images the tests run in; a note and no failure when no Docker engine answers. An image whose
# content hash is unchanged is skipped in seconds; bio's first build downloads its wheels on the
# host and takes several minutes, gpu's first (5.3 GB: CUDA's PyTorch wheels) about 6 minutes
# (benchmarks/results/trimul_gpu_image.md): TriMul's Docker path is checked in it on CPU.
test-images: setup
	$(VENV)/bin/python images/build.py --if-docker python-math cpp20 bio gpu

# The sandbox's tools from Debian's packages (docs/sandbox.md): bubblewrap for the process backend;
# in CI (CI set) also gVisor's runsc, registered with the Docker engine (it edits daemon.json).
sandbox-tools:
	$(PYTHON) images/sandbox_tools.py $(if $(CI),--gvisor)

# PostgreSQL's server from Debian's packages: tests/test_prefect_server.py runs Prefect on it.
test-services:
	$(PYTHON) images/postgres_server.py

# Static type checking of the seams between the floors (files listed in pyproject.toml [tool.mypy]).
typecheck: setup
	$(VENV)/bin/mypy

# Formatting and lint ([tool.ruff] in pyproject.toml): `make lint` checks, `make format` rewrites.
lint: setup
	$(VENV)/bin/ruff format --check --diff .
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The sandbox's tools, PostgreSQL, the images, lint and the type check, then every test
# (tests/test_imports.py runs import-linter's floor contracts; tests/test_gpu_rehearsal.py runs the GPU
# check's rehearsal, `make gpu-check REHEARSE=1`), on TEST_WORKERS pytest-xdist workers: most of the
# suite's time is spent waiting on servers, subprocesses and restarts, which workers overlap. The tests
# marked `exclusive` (they load every CPU, or are judged by the CPU they get) run after, alone.
# Then, when root, the isolation tests again as a normal user (tests/as_normal_user.py).
TEST_WORKERS ?= 3
test: setup sandbox-tools test-services test-images lint typecheck
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=30 -m "not exclusive"
	$(VENV)/bin/python -m pytest -q -m exclusive
	$(VENV)/bin/python tests/as_normal_user.py

# Every GPU test and benchmark in one go, one results file: benchmarks/results/gpu-<date>-<gpu>.json
# and .md (benchmarks/gpu_check.py; docs/gpu-check.md). Without a CUDA device it says "no CUDA
# device" and exits with 2. PARTS=train-fp32,one-gpu runs some parts; WHEELS=DIR installs carried
# wheels first (.whl/first-call for the first call); GPU_CHECK_OUT=DIR writes elsewhere; MAX_SECONDS
# (default 540: one 10-minute call, which the parts that need no vLLM fill) bounds all parts
# together; SHAPE=small runs the benchmarks on a small random model (a quick first pass).
# No `setup`: a lent GPU machine has no uv, its Python (python3) is used there.
# REHEARSE=1: the first call rehearsed on this CPU machine (benchmarks/gpu_rehearsal.py): an
# environment of the lent machine's image's packages, every part run to its first CUDA call and past
# it on CPU, the report in GPU_CHECK_OUT (default benchmarks/results/gpu-rehearsal.md); it also
# downloads the wheels the first call carries into .whl/first-call.
GPU_PYTHON ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(PYTHON))
gpu-check: $(if $(REHEARSE),setup)
ifdef REHEARSE
	$(VENV)/bin/python benchmarks/gpu_rehearsal.py $(if $(PARTS),--parts $(PARTS)) $(if $(GPU_CHECK_OUT),--out $(GPU_CHECK_OUT))
else
	$(GPU_PYTHON) benchmarks/gpu_check.py $(if $(PARTS),--parts $(PARTS)) $(if $(WHEELS),--wheels $(WHEELS)) \
		$(if $(GPU_CHECK_OUT),--out $(GPU_CHECK_OUT)) $(if $(MAX_SECONDS),--max-seconds $(MAX_SECONDS)) $(if $(SHAPE),--shape $(SHAPE))
endif

lock: $(UV)
	$(UV) lock

clean-venv:
	rm -rf $(VENV) $(TOOLS)
