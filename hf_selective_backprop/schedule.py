"""When selection runs: the ``sb_start`` / ``sb_end`` window and ``sb_interrupt`` plain steps.

Pure functions of the optimizer step, so every process of a distributed run makes the same
decision without communicating, and the trainer can count selection steps up front to size
the learning-rate schedule.

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


def _check(total_steps: int, start: float, end: float, interrupt: int) -> None:
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if not 0.0 <= start <= end:
        raise ValueError(f"need 0 <= start <= end, got start={start}, end={end}")
    if interrupt < 0:
        raise ValueError(f"interrupt must be >= 0, got {interrupt}")


def in_selection_window(step: int, total_steps: int, start: float = 0.0, end: float = 1.0) -> bool:
    """True for steps with ``start <= step / total_steps < end``."""
    _check(total_steps, start, end, 0)
    return start <= step / total_steps < end


def is_interrupt_step(step: int, interrupt: int) -> bool:
    """True for the steps that train a plain batch: ``step % interrupt == interrupt - 1``."""
    return interrupt > 0 and step % interrupt == interrupt - 1


def selection_active(step: int, total_steps: int, start: float = 0.0, end: float = 1.0, interrupt: int = 0) -> bool:
    """Whether optimizer step ``step`` (0-based) trains on a selected batch."""
    _check(total_steps, start, end, interrupt)
    return in_selection_window(step, total_steps, start, end) and not is_interrupt_step(step, interrupt)


def _first_step_at(fraction: float, total_steps: int) -> int:
    """Smallest step s >= 0 with ``s / total_steps >= fraction``."""
    s = max(0, int(fraction * total_steps))
    while s > 0 and (s - 1) / total_steps >= fraction:
        s -= 1
    while s / total_steps < fraction:
        s += 1
    return s


def selection_window(total_steps: int, start: float = 0.0, end: float = 1.0) -> range:
    """The steps of ``[0, total_steps)`` inside the window, as a range."""
    _check(total_steps, start, end, 0)
    return range(
        min(_first_step_at(start, total_steps), total_steps), min(_first_step_at(end, total_steps), total_steps)
    )


def count_selection_steps(total_steps: int, start: float = 0.0, end: float = 1.0, interrupt: int = 0) -> int:
    """Number of steps in ``[0, total_steps)`` for which ``selection_active`` is True (O(1))."""
    _check(total_steps, start, end, interrupt)
    window = selection_window(total_steps, start, end)
    if interrupt == 0:
        return len(window)
    # Steps s < m with s % k == k - 1 number m // k.
    plain = window.stop // interrupt - window.start // interrupt
    return len(window) - plain
