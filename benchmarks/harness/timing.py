"""The benchmarks' one timer: seconds a call takes, with the device's queue drained before and after on CUDA.

On CUDA a kernel launch returns before the kernel has run, so a clock read around the call alone times
the launches; `timed` waits for the device before starting the clock and before reading it. On the CPU
the work is done when the call returns and nothing waits.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def _synchronize(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device | str | None = None) -> float:
    """Wall seconds of one call of ``fn`` whose work runs on ``device`` (synchronised when it is a CUDA device)."""
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - start


def median_seconds(
    fn: Callable[[], object], repeats: int, device: torch.device | str | None = None, warmup: int = 3
) -> float:
    """The median of ``repeats`` `timed` calls after ``warmup`` untimed ones (cuDNN autotuning, the allocator)."""
    for _ in range(warmup):
        timed(fn, device)
    return statistics.median(timed(fn, device) for _ in range(repeats))
