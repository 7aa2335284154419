# Two entry points for a fresh machine: `make demo` (set up, run the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint benchmark gpu-check

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The exact PyTorch build is pinned here, not in the package's requirements.
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install --quiet -e ".[dev,benchmarks,trl]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@$(PY) scripts/compare.py

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

benchmark: $(STAMP)
	$(PY) scripts/benchmark.py

# On a machine with a CUDA device: pytest -m gpu, mixed precision, host syncs and CIFAR-10 throughput, reported in
# benchmarks/results/gpu-check/ (docs/gpu.md). Elsewhere it says there is no CUDA device and exits 0.
gpu-check:
	bash benchmarks/gpu_check.sh $(GPU_CHECK_ARGS)
