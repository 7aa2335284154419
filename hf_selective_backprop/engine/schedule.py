"""When selection runs: the ``sb_start`` / ``sb_end`` window and ``sb_interrupt`` plain steps.

Pure functions of the optimizer step, so every process of a distributed run makes the same
decision without communicating.

Semantics (Composer's ``should_selective_backprop``, on the global optimizer step):

- ``step`` is the 0-based index of the optimizer step about to run, ``total_steps`` the
  planned number of optimizer steps (> 0).
- The window holds the steps with ``start <= step / total_steps < end``. The comparison is
  made on ``step / total_steps`` (not ``step < end * total_steps``), so a boundary such as
  0.3 of 10 steps lands exactly on step 3 despite 0.3 * 10 == 3.0000000000000004.
- With ``interrupt = k > 0``, every step with ``step % k == k - 1`` (the k-th, 2k-th, ...
  step, counted from step 0 of training, not from the window's start) is a plain full batch.
  k = 2 alternates selected and plain steps starting with a selected one; k = 1 makes every
  step plain; k = 0 never interrupts.
"""

from __future__ import annotations


def _check(total_steps: int, start: float, end: float) -> None:
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if not 0.0 <= start <= end:
        raise ValueError(f"need 0 <= start <= end, got start={start}, end={end}")


def in_selection_window(step: int, total_steps: int, start: float = 0.0, end: float = 1.0) -> bool:
    """True for steps with ``start <= step / total_steps < end``."""
    _check(total_steps, start, end)
    return start <= step / total_steps < end


def is_interrupt_step(step: int, interrupt: int) -> bool:
    """True for the steps that train a plain batch: ``step % interrupt == interrupt - 1``."""
    return interrupt > 0 and step % interrupt == interrupt - 1
