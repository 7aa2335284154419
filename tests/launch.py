"""Launch a worker script on 2 CPU processes (torchrun, accelerate launch) or one, and fail a hang, not a slow run.

A launch is killed, with every process it started, when it goes ``quiet`` seconds without progress (its output for
a launch; what the caller names for ``watch``), or past an overall ``ceiling``; both limits are multiplied by how
slow the machine is when the launch starts and again before a kill (``slowness``). A fixed wall-clock limit failed
DeepSpeed launches that were only slow, on 2 cores at load 15 (issue 76). Each rank of the worker writes
``<out>/rank{r}.pt``, which the test compares.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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
# Seconds on an idle 2-core machine. The longest silence of a passing launch there is DeepSpeed loading its CPU op
# (27 s, 2026-12-07); the longest launch takes 40 s.
QUIET = 180
CEILING = 900
# Once the launcher is asked to stop: torchrun gives its workers 30 s before it kills them itself.
GRACE = 60
# Seconds that _work takes on the idle 2-core machine the limits above were measured on.
REFERENCE_WORK = 0.05


def _work() -> int:
    total = 0
    for i in range(1_000_000):
        total += i * i % 7
    return total


def slowness() -> float:
    """How many times longer than on the reference machine a fixed CPU-bound loop takes here now, at least 1.

    Timed rather than read from the load average: it counts what this process actually gets of the CPU (a cgroup's
    quota, other containers, a slower CPU), which is what stretches a launch.
    """
    start = time.perf_counter()
    _work()
    return max(1.0, (time.perf_counter() - start) / REFERENCE_WORK)


def _family(pid: int) -> list[tuple[int, str]]:
    """The processes ``pid`` started, at any depth, each with its start time (so that a reused pid is never killed).

    Listed before a kill: torchrun starts each worker in a session of its own, out of reach of a signal to the
    launcher's group, and a worker whose launcher died is re-parented out of the tree.
    """
    children: dict[int, list[tuple[int, str]]] = {}
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:  # no /proc: the process group alone is killed
        return []
    for entry in entries:
        stat = _stat(int(entry))
        if stat is not None:
            children.setdefault(int(stat[1]), []).append((int(entry), stat[19]))
    family, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            family.append(child)
            pending.append(child[0])
    return family


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from the state field on (state, ppid, ..., [19] the start time), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stop(process: subprocess.Popen) -> None:
    """End ``process`` and every process it started: SIGTERM first, so that torchrun stops its workers itself."""
    family = _family(process.pid)
    try:  # not yet waited for, so the pid is still this process's, if only as a zombie
        own_group = os.getpgid(process.pid) == process.pid
    except ProcessLookupError:
        own_group = False
    try:
        if own_group:
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.terminate()
    except ProcessLookupError:
        pass
    try:
        process.wait(GRACE)
    except subprocess.TimeoutExpired:
        pass
    for pid, started in family:
        stat = _stat(pid)
        if stat is not None and stat[19] == started and stat[0] != "Z":
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if own_group:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.kill()
    process.wait()


def watch(process: subprocess.Popen, progress: Callable[[], object], name: str, quiet: float = QUIET,
          ceiling: float = CEILING, until: Callable[[], bool] | None = None, interval: float = 0.5) -> str | None:
    """Wait until ``process`` exits or ``until()`` holds, and return None; or kill it (all it started too) once
    ``progress()`` has returned the same value for ``quiet`` seconds, or after ``ceiling`` seconds, each times
    ``slowness()``, and return why."""
    # A launch that makes progress is not a hung test: pytest-timeout's alarm (a fixed 600 s, pyproject.toml) is held
    # while it is watched here, and what was left of it restored after.
    alarm = signal.getitimer(signal.ITIMER_REAL)[0]
    if alarm:
        signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        factor = slowness()
        start = last = time.monotonic()
        seen = progress()
        while until is None or not until():
            try:
                process.wait(interval)
                return None
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            current = progress()
            if current != seen:
                seen, last = current, now
            if now - last <= quiet * factor and now - start <= ceiling * factor:
                continue
            factor = max(factor, slowness())  # the machine may have slowed down since the launch started
            if now - last > quiet * factor:
                why = (f"no progress for {now - last:.0f} s (quiet period {quiet} s x slowness {factor:.1f}): "
                       "a hang")
            elif now - start > ceiling * factor:
                why = f"still running after {now - start:.0f} s (ceiling {ceiling} s x slowness {factor:.1f})"
            else:
                continue
            _stop(process)
            test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0] or "(no test)"
            return f"{test}: {name} killed with every process it started, {why}"
        return None
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, alarm)


def watched(cmd: list[str], quiet: float = QUIET, ceiling: float = CEILING) -> tuple[int | None, str]:
    """Run ``cmd`` from the repository, its output the progress watched: its exit code (None once killed, the reason
    then at the end of the output) and its output (stdout and stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    # Unbuffered, so that a worker's prints reach the pipe as they are made: they are the progress watched.
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    chunks: list[bytes] = []
    read = 0

    def reader():
        nonlocal read
        while chunk := os.read(process.stdout.fileno(), 65536):
            chunks.append(chunk)
            read += len(chunk)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    name = next((Path(part).name for part in cmd if part.endswith(".py")), Path(cmd[0]).name)
    why = watch(process, lambda: read, name, quiet, ceiling)
    thread.join(GRACE)  # what the last processes printed
    process.stdout.close()
    output = b"".join(chunks).decode(errors="replace")
    return (None, f"{output}\n{why}") if why else (process.returncode, output)


def run(out: Path, args: list[str], launcher: str = "torchrun", worker: Path = DIST_WORKER,
        quiet: float = QUIET, processes: int = 2) -> tuple[int | None, str]:
    """The launch's exit code (None after a hang, its processes killed) and its output."""
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    elif launcher == "accelerate":
        accelerate = Path(sys.executable).parent / "accelerate"
        cmd = [str(accelerate), "launch", "--config_file", str(ACCELERATE_CONFIG)]
    else:  # one plain process
        cmd = [sys.executable]
    return watched([*cmd, str(worker), "--out", str(out), *args], quiet)


def launch(out: Path, args: list[str], launcher: str = "torchrun", worker: Path = DIST_WORKER,
           processes: int = 2) -> list[dict]:
    """Run the worker and return each rank's results; fail on error or on a hang."""
    code, output = run(out, args, launcher, worker, processes=processes)
    command = f"{worker.name} {' '.join(args)} ({launcher})"
    if code is None:
        pytest.fail(f"{command} was stopped:\n{output[-4000:]}")
    if code != 0:
        pytest.fail(f"{command} exited with {code}:\n{output[-4000:]}")
    return [torch.load(path, weights_only=False) for path in sorted(out.glob("rank*.pt"))]
