"""`make gpu-check` on a machine without CUDA, and the cost-model arithmetic of its throughput table."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--output_dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("gpu-check: no CUDA device") and len(result.stdout.splitlines()) == 1
    assert not out.exists()


def _log(seen, backwards, seconds, selection_forwards=0, selection_seconds=0.0):
    stats = {"examples_seen": seen, "backwards": backwards, "selection_forwards": selection_forwards,
             "selection_forward_seconds": selection_seconds, "data_seconds": 0.1, "selection_overhead_seconds": 0.0}
    return {"stats": stats, "train_wall_seconds": seconds, "epochs_trained": 1.0, "evals": [{"error": 0.5}]}


def test_throughput_rows_put_the_cost_models_ideal_beside_the_measured_speedup():
    # F = 1 ms per example, (1+r)F = 3 ms: r = 2; a selection forward costs half a training forward.
    costs = {"batch": 128, "forward_ms": 128.0, "step_ms": 384.0, "r": 2.0, "phi": {"fp32": 0.5, "bf16": 0.4}}
    logs = {
        "traditional": _log(300, 300, 3.0),
        "sb": _log(300, 100, 2.0, selection_forwards=300, selection_seconds=0.15),
        "uniform": _log(300, 100, 1.5),
    }
    rows = {row["strategy"]: row for row in gpu_check.throughput_rows(logs, costs)}
    assert rows["traditional"]["speedup"] == rows["traditional"]["ideal"] == 1.0
    sb = rows["sb"]
    assert sb["speedup"] == pytest.approx(1.5) and sb["s"] == pytest.approx(1 / 3)
    assert sb["ideal"] == pytest.approx(3 / (0.5 + 1.0))  # (1+r) / (phi + s(1+r))
    assert sb["measured_over_ideal"] == pytest.approx(0.75)
    assert sb["phi_in_run"] == pytest.approx(0.5)  # 0.5 ms per selected example over 1 ms per training forward
    assert rows["uniform"]["ideal"] == pytest.approx(3.0) and rows["uniform"]["phi_in_run"] is None
