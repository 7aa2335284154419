#!/bin/bash
# `make gpu-check`: the CUDA check of benchmarks/gpu_check.py (docs/gpu.md), in an environment with a CUDA-enabled
# torch: $PY, else .venv's, else python3's; if none has one, `make venv` installs the Makefile's pinned torch
# (PyPI's Linux wheels are CUDA builds). Arguments go to benchmarks/gpu_check.py (--output_dir, --sections, ...),
# which runs each section in its own process: pytest -m gpu, benchmarks/gpu_diagnostics.py (precision, syncs) and
# benchmarks/gpu_throughput.py (throughput), and renders the report (benchmarks/harness/gpu_report.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "gpu-check: no CUDA device on this machine (nvidia-smi finds none); nothing to check."
    exit 0
fi
has_cuda_torch() { "$1" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" >/dev/null 2>&1; }
PYTHON_FOUND=""
for candidate in ${PY:-} .venv/bin/python python3; do
    if [[ -x "$(command -v "$candidate")" ]] && has_cuda_torch "$candidate"; then
        PYTHON_FOUND=$candidate
        break
    fi
done
if [[ -z "$PYTHON_FOUND" ]]; then
    make venv
    PYTHON_FOUND=.venv/bin/python
    has_cuda_torch "$PYTHON_FOUND" || { echo "gpu-check: a CUDA device is present but torch in .venv cannot use it"; exit 1; }
fi
# The checkout's package first on the path, so that a Python with CUDA torch but without this package installed
# (python3 on a bare GPU machine) runs it too; the sections inherit the path.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON_FOUND" benchmarks/gpu_check.py "$@"
