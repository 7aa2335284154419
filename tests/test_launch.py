"""The launch helper's hang detection (tests/launch.py): a hang is silence, not a long run.

Quiet periods and ceilings of a second or two here; the multi-process tests use minutes.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import launch
import pytest
from launch import watched


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


@pytest.fixture
def factors(monkeypatch):
    """Every slowness factor the helper measured, so that a test can bound the time a kill took."""
    measured, measure = [], launch.slowness
    monkeypatch.setattr(launch, "slowness", lambda: measured.append(measure()) or measured[-1])
    return measured


def _gone(pid: int, wait: float = 10.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        stat = launch._stat(pid)
        if stat is None or stat[0] == "Z":  # a zombie has stopped; reaping it is its new parent's business
            return True
        time.sleep(0.05)
    return False


def test_a_child_printing_steadily_for_longer_than_the_quiet_period_is_not_killed(factors):
    code, output = watched(python("""
        import time
        for i in range(16):
            print("step", i)
            time.sleep(0.25)
    """), quiet=1)
    assert code == 0, output
    assert output.split() == [word for i in range(16) for word in ("step", str(i))]
    assert len(factors) == 1  # no limit was reached: measured at the start only


def test_a_silent_child_is_killed_after_about_the_quiet_period_with_what_it_started(tmp_path, factors):
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    # As torchrun does, the child starts its worker in a session of its own, out of reach of a signal to its group.
    code, output = watched(python(f"""
        import subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(worker.pid))
        print("started", flush=True)
        time.sleep(600)
    """), quiet=1)
    elapsed = time.monotonic() - start
    assert code is None
    assert output.startswith("started\n")
    reason = output.splitlines()[-1]
    test = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]
    named = f"{test}: {Path(sys.executable).name} killed with every process it started, no progress for "
    assert reason.startswith(named), reason
    assert f"(quiet period 1 s x slowness {max(factors):.1f}): a hang" in reason
    assert 1 <= elapsed < 1 * max(factors) + 10, (elapsed, factors)
    assert _gone(int(pid_file.read_text())), "the child's worker outlived the kill"


def test_a_child_that_keeps_printing_is_killed_at_the_ceiling(factors):
    start = time.monotonic()
    code, output = watched(python("""
        import time
        while True:
            print("busy", flush=True)
            time.sleep(0.05)
    """), quiet=60, ceiling=1.5)
    elapsed = time.monotonic() - start
    assert code is None
    assert f"(ceiling 1.5 s x slowness {max(factors):.1f})" in output.splitlines()[-1]
    assert 1.5 <= elapsed < 1.5 * max(factors) + 10, (elapsed, factors)


def test_the_test_s_alarm_waits_while_a_launch_makes_progress():
    """pytest-timeout's limit is a SIGALRM timer: it must not end a launch that is still printing."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set in the main thread only")
    rang = []
    handler = signal.signal(signal.SIGALRM, lambda *_: rang.append(time.monotonic()))
    outer = signal.setitimer(signal.ITIMER_REAL, 0.5)  # pytest-timeout's own alarm for this test, put back below
    try:
        code, output = watched(python("""
            import time
            for _ in range(10):
                print("step", flush=True)
                time.sleep(0.15)
        """), quiet=5)
        left = signal.getitimer(signal.ITIMER_REAL)[0]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if outer[0]:
            signal.setitimer(signal.ITIMER_REAL, *outer)
    assert code == 0, output
    assert rang == [] and 0 < left <= 0.5  # held over the launch (1.5 s), then what was left of it restored
