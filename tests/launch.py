"""Launch a worker script on 2 CPU processes (torchrun, accelerate launch) or one, under a timeout.

A launch that hangs is killed after ``timeout`` seconds and fails the test instead of blocking the suite;
each rank of the worker writes ``<out>/rank{r}.pt``, which the test compares.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_selective_backprop._compat import TRAINER_RESUMES_CPU_PROCESSES

#: A test that resumes a run of several CPU processes: transformers < 5.18 fails it in the Trainer itself.
resumes_cpu_processes = pytest.mark.skipif(
    not TRAINER_RESUMES_CPU_PROCESSES,
    reason="transformers < 5.18 reloads a multi-process CPU run's optimizer onto cpu:0, which torch.load refuses "
    "(the Trainer's own resume fails, with or without selection; _compat.TRAINER_RESUMES_CPU_PROCESSES)",
)

ROOT = Path(__file__).resolve().parents[1]
DIST_WORKER = ROOT / "tests" / "dist_worker.py"
ACCELERATE_CONFIG = ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"
TIMEOUT = 240


def run(out: Path, args: list[str], launcher: str = "torchrun", worker: Path = DIST_WORKER,
        timeout: int = TIMEOUT, processes: int = 2) -> tuple[int | None, str]:
    """The launch's exit code (None after a timeout, its processes killed) and its output."""
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    elif launcher == "accelerate":
        accelerate = Path(sys.executable).parent / "accelerate"
        cmd = [str(accelerate), "launch", "--config_file", str(ACCELERATE_CONFIG)]
    else:  # one plain process
        cmd = [sys.executable]
    cmd += [str(worker), "--out", str(out), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    # A new session, so that a hung launch can be killed with all the workers it started.
    process = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        # torchrun starts each worker in a session of its own: SIGTERM lets it stop them before it exits.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        return None, output


def launch(out: Path, args: list[str], launcher: str = "torchrun", worker: Path = DIST_WORKER,
           processes: int = 2) -> list[dict]:
    """Run the worker and return each rank's results; fail on error or timeout (a hang)."""
    code, output = run(out, args, launcher, worker, processes=processes)
    command = f"{worker.name} {' '.join(args)} ({launcher})"
    if code is None:
        pytest.fail(f"{command} did not finish in {TIMEOUT} s (hang?):\n{output[-4000:]}")
    if code != 0:
        pytest.fail(f"{command} exited with {code}:\n{output[-4000:]}")
    return [torch.load(path, weights_only=False) for path in sorted(out.glob("rank*.pt"))]
