"""`make gpu-check`: what the trainer does on a CUDA device, in one markdown report plus JSON (docs/gpu.md).

    python benchmarks/gpu_check.py [--output_dir benchmarks/results/gpu-check] [--data CIFAR10_FOLDER]
                                [--sections pytest,precision,syncs,throughput] [--budget_seconds 470]

Runs each section in its own process (a crash or hang costs only its own section), in this order,
within one time budget, then writes report.json and report.md (`gpu_report.render`):

- ``pytest``: ``pytest -m gpu`` (tests/test_gpu.py: transfers, one wait per selection batch, selection
  precision, bit-exact resume on CUDA, the 2-process lockstep test under NCCL with two devices);
- ``precision`` and ``syncs``: benchmarks/gpu_diagnostics.py (mixed-precision training; host synchronisations);
- ``throughput``: benchmarks/gpu_throughput.py (all of CIFAR-10, examples/s beside the cost model's ideal).

Without a CUDA device it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
SECTIONS = ("pytest", "precision", "syncs", "throughput")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", default=str(ROOT / "benchmarks" / "results" / "gpu-check"))
    parser.add_argument("--data", default=default_data(), help="CIFAR-10 in the Hub's layout (a folder or Hub id)")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--budget_seconds", type=float, default=470.0, help="all sections together")
    options = parser.parse_args()
    unknown = {s.strip() for s in options.sections.split(",") if s.strip()} - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; the sections are {', '.join(SECTIONS)}")

    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); nothing to check.")
        return 0
    out = Path(options.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    return orchestrate(options, out)


def default_data() -> str:
    """A local copy of CIFAR-10 beside or inside the checkout, else the Hub's (which needs the network)."""
    for folder in (ROOT / "shared" / "data" / "cifar10", ROOT.parent / "shared" / "data" / "cifar10"):
        if folder.is_dir():
            return str(folder)
    return "uoft-cs/cifar10"


def command(name: str, options, out: Path) -> list[str]:
    """The child process of one section."""
    if name == "pytest":
        return [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-q", "-rA", "-p", "no:cacheprovider",
                f"--junitxml={out / 'pytest.xml'}"]
    if name == "throughput":
        script = [str(HERE / "gpu_throughput.py")]
    else:  # precision, syncs
        script = [str(HERE / "gpu_diagnostics.py"), "--section", name]
    return [sys.executable, *script, "--output_dir", str(out), "--data", options.data]


def orchestrate(options, out: Path) -> int:
    from harness.gpu_report import pytest_results, render

    deadline = time.monotonic() + options.budget_seconds
    report = {"environment": environment(), "sections": {}}
    for name in [s.strip() for s in options.sections.split(",") if s.strip()]:
        left = deadline - time.monotonic()
        if left < 20:
            report["sections"][name] = {"status": "not run: the time budget was spent"}
            continue
        written = out / f"{name}.json"
        written.unlink(missing_ok=True)
        if name == "pytest":
            (out / "pytest.xml").unlink(missing_ok=True)  # a report left by an earlier run is not this one's
        start = time.monotonic()
        # The repository first, then whatever path the caller set (packages installed with --target, say).
        python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "HF_HUB_OFFLINE": "1", "PYTHONPATH": python_path}
        try:
            process = subprocess.run(command(name, options, out), cwd=ROOT, env=env, capture_output=True, text=True,
                                     timeout=left)
            status = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
            tail = (process.stdout + process.stderr)[-4000:]
            if name == "pytest":
                # The section reports each test's outcome; it fails only when pytest wrote no report (an import
                # error in conftest, say).
                if (out / "pytest.xml").exists():
                    status = "ok"
                    written.write_text(json.dumps(pytest_results(out / "pytest.xml", process.returncode,
                                                                 process.stdout), indent=1))
                else:
                    status = f"failed (exit {process.returncode}): pytest wrote no report"
        except subprocess.TimeoutExpired as error:
            status, tail = f"timed out after {left:.0f} s", str(error.stdout or "")[-4000:]
        result = json.loads(written.read_text()) if written.exists() else {}
        report["sections"][name] = {"status": status, "seconds": round(time.monotonic() - start, 1), **result}
        if status != "ok":
            report["sections"][name]["output_tail"] = tail
        print(f"gpu-check: {name}: {status} ({time.monotonic() - start:.0f} s)", flush=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(render(report))
    print(f"gpu-check: wrote {out / 'report.md'} and report.json")
    failed = [n for n, s in report["sections"].items() if s["status"] != "ok"]
    return 1 if failed else 0


def environment() -> dict:
    import accelerate
    import torch
    import transformers

    return {
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
    }


if __name__ == "__main__":
    sys.exit(main())
