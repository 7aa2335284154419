"""`make gpu-check` on a machine without CUDA; its driver's orchestration of sections; its report and the
cost-model arithmetic of its throughput table."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.gpu_report import render, throughput_rows

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "benchmarks" / "gpu_check.py"


def load_driver():
    spec = importlib.util.spec_from_file_location("gpu_check", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, str(DRIVER), "--output_dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("gpu-check: no CUDA device") and len(result.stdout.splitlines()) == 1
    assert not out.exists()


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_gpu" name="test_a" time="1.5"/>
<testcase classname="tests.test_gpu" name="test_b" time="0.2"><failure message="assert 1 == 2">trace</failure>
</testcase>
<testcase classname="tests.test_gpu" name="test_c" time="0"><skipped message="needs two devices"/></testcase>
</testsuite></testsuites>"""


def test_the_driver_runs_each_section_in_its_own_process_and_reports_each_outcome(tmp_path, monkeypatch):
    driver = load_driver()
    out = tmp_path / "check"
    out.mkdir()
    (out / "pytest.xml").write_text("<testsuites/>")  # an earlier run's report must not be read as this one's
    children = {
        # pytest: tests that failed still make a report; the section holds each outcome
        "pytest": f"import pathlib; pathlib.Path({str(out / 'pytest.xml')!r}).write_text({JUNIT!r}); "
                  "print('1 failed, 1 passed, 1 skipped'); raise SystemExit(1)",
        "precision": f"import json, pathlib; pathlib.Path({str(out / 'precision.json')!r}).write_text(json.dumps("
                     "{'train_examples': 8, 'runs': [dict(precision='bf16', strategy='sb', logged_losses=2, "
                     "losses_finite=True, last_loss=0.5, skipped_steps=0, loss_scale=None, examples_seen=8, "
                     "selection_forwards=8, kept=3, backwards=3, optimizer_steps=1, nonfinite_losses=0)]}))",
        "syncs": "print('CUDA error: out of memory'); raise SystemExit(3)",
    }
    monkeypatch.setattr(driver, "command", lambda name, options, out: [sys.executable, "-c", children[name]])
    monkeypatch.setattr(driver, "environment", lambda: {
        "devices": ["Test GPU"], "torch": "2", "cuda": "12", "cudnn": 9, "transformers": "5", "accelerate": "1",
        "commit": "0123456789abcdef"})
    options = driver.argparse.Namespace(sections="pytest,precision,syncs", budget_seconds=120.0, data="unused")
    assert driver.orchestrate(options, out) == 1  # syncs failed

    report = json.loads((out / "report.json").read_text())
    sections = report["sections"]
    assert [sections[n]["status"] for n in ("pytest", "precision", "syncs")] == ["ok", "ok", "failed (exit 3)"]
    tests = {t["test"].split("::")[1]: t for t in sections["pytest"]["tests"]}
    assert {name: t["outcome"] for name, t in tests.items()} == {"test_a": "passed", "test_b": "failure",
                                                                 "test_c": "skipped"}
    assert tests["test_b"]["message"] == "assert 1 == 2" and sections["pytest"]["exit_code"] == 1
    assert "out of memory" in sections["syncs"]["output_tail"]
    text = (out / "report.md").read_text()
    assert text == render(report)
    assert "Devices: Test GPU" in text and "| syncs | failed (exit 3) |" in text and "## pytest -m gpu" in text
    assert "| bf16 | sb | 2 | True | 0.5 | 0 | None | 8 | 8 | 3 | 3 | 1 | 0 |" in text
    assert "## syncs: output tail" in text

    # A section that would start with too little of the budget left is reported as not run.
    options.budget_seconds, options.sections = 5.0, "throughput"
    assert driver.orchestrate(options, out) == 1
    assert json.loads((out / "report.json").read_text())["sections"]["throughput"]["status"].startswith("not run")


def _log(seen, backwards, seconds, selection_forwards=0, selection_seconds=0.0):
    stats = {"examples_seen": seen, "backwards": backwards, "selection_forwards": selection_forwards,
             "selection_forward_seconds": selection_seconds, "data_seconds": 0.1, "selection_overhead_seconds": 0.0}
    return {"stats": stats, "train_wall_seconds": seconds, "epochs_trained": 1.0, "evals": [{"error": 0.5}]}


COSTS = {"batch": 128, "forward_ms": 128.0, "step_ms": 384.0, "r": 2.0, "phi": {"fp32": 0.5, "bf16": 0.4}}


def test_throughput_rows_put_the_cost_models_ideal_beside_the_measured_speedup():
    # F = 1 ms per example, (1+r)F = 3 ms: r = 2; a selection forward costs half a training forward.
    logs = {
        "traditional": _log(300, 300, 3.0),
        "sb": _log(300, 100, 2.0, selection_forwards=300, selection_seconds=0.15),
        "stale-sb": _log(300, 100, 1.8, selection_forwards=100, selection_seconds=0.05),
        "uniform": _log(300, 100, 1.5),
    }
    rows = {row["strategy"]: row for row in throughput_rows(logs, COSTS)}
    assert rows["traditional"]["speedup"] == rows["traditional"]["ideal"] == 1.0
    sb = rows["sb"]
    assert sb["speedup"] == pytest.approx(1.5) and sb["s"] == pytest.approx(1 / 3)
    assert sb["ideal"] == pytest.approx(3 / (0.5 + 1.0))  # (1+r) / (phi + s(1+r))
    assert sb["measured_over_ideal"] == pytest.approx(0.75)
    assert sb["phi_in_run"] == pytest.approx(0.5)  # 0.5 ms per selected example over 1 ms per training forward
    # Stale-SB scores a third of what it reads: (1+r) / (phi/3 + s(1+r))
    assert rows["stale-sb"]["ideal"] == pytest.approx(3 / (0.5 / 3 + 1.0))
    assert rows["uniform"]["ideal"] == pytest.approx(3.0) and rows["uniform"]["phi_in_run"] is None


def test_the_throughput_table_renders_each_row():
    rows = throughput_rows({"traditional": _log(300, 300, 3.0), "uniform": _log(300, 100, 1.5)}, COSTS)
    report = {"environment": {"devices": ["G"], "torch": "2", "cuda": "12", "cudnn": 9, "transformers": "5",
                              "accelerate": "1", "commit": "abc"},
              "sections": {"throughput": {"status": "ok", "seconds": 1.0, "train_examples": 300, "costs": COSTS,
                                          "rows": rows}}}
    text = render(report)
    assert "## Throughput, all 300 CIFAR-10 training images" in text
    assert "r = 2.00; selection forward phi = 0.50" in text
    assert "| uniform | 1 | 200 | 2.00 | 3.00 | 0.67 | 0.333 | - |" in text
