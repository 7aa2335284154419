# Two entry points for a fresh machine: `make demo` (set up, run the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The low end of the supported range (pyproject.toml): the suite runs against it too (make test-oldest).
OLDEST_VENV := .venv-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_STAMP := $(OLDEST_VENV)/.installed
# The oldest releases the requirements admit together: TRL 1.16 itself needs accelerate>=1.10.1.
OLDEST_PINS := transformers==5.23.0 accelerate==1.10.1 trl==1.16.0

# DeepSpeed (the deepspeed extra) is built from its source release, whose setup imports torch: it is installed
# without build isolation, after torch and what its setup needs. scripts/build_deepspeed_ops.py then compiles its
# CPU communication op once, so that test processes only load it.
DEEPSPEED_BUILD_DEPS := hjson ninja py-cpuinfo msgpack einops

.PHONY: venv demo test test-oldest lint benchmark gpu-check

# Every extra: the suite tests the workflows and the harness too (pyproject.toml says which extra is what).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The exact PyTorch build is pinned here, not in the package's requirements.
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install --quiet $(DEEPSPEED_BUILD_DEPS)
	$(PY) -m pip install --quiet --no-build-isolation deepspeed
	$(PY) -m pip install --quiet -e ".[dev,vision,metrics,benchmarks,trl,deepspeed]"
	$(PY) scripts/build_deepspeed_ops.py
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@$(PY) scripts/compare.py

test: $(STAMP)
	$(PY) -m pytest -q

$(OLDEST_STAMP): pyproject.toml
	test -x $(OLDEST_PY) || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_PY) -m pip install --quiet --upgrade pip
	$(OLDEST_PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(OLDEST_PY) -m pip install --quiet $(DEEPSPEED_BUILD_DEPS)
	$(OLDEST_PY) -m pip install --quiet --no-build-isolation deepspeed
	$(OLDEST_PY) -m pip install --quiet -e ".[dev,vision,metrics,benchmarks,trl,deepspeed]" $(OLDEST_PINS)
	$(OLDEST_PY) scripts/build_deepspeed_ops.py
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	$(OLDEST_PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

benchmark: $(STAMP)
	$(PY) scripts/benchmark.py

# On a machine with a CUDA device: pytest -m gpu, mixed precision, host syncs and CIFAR-10 throughput, reported in
# benchmarks/results/gpu-check/ (docs/gpu.md). Elsewhere it says there is no CUDA device and exits 0.
gpu-check:
	bash benchmarks/gpu_check.sh $(GPU_CHECK_ARGS)
