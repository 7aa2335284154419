"""The sb_start / sb_end window and sb_interrupt plain steps switch at exactly the right steps."""

from __future__ import annotations

import pytest

from hf_selective_backprop.engine.schedule import in_selection_window, is_interrupt_step


def active_steps(total: int, start: float, end: float, interrupt: int) -> list[int]:
    return [
        s for s in range(total) if in_selection_window(s, total, start, end) and not is_interrupt_step(s, interrupt)
    ]


def test_defaults_select_every_step():
    assert active_steps(7, 0.0, 1.0, 0) == list(range(7))
    assert in_selection_window(0, 1)


def test_window_is_half_open_on_fractions():
    # Composer's recommended 0.5 .. 0.9 of 10 steps: steps 5, 6, 7, 8.
    assert active_steps(10, 0.5, 0.9, 0) == [5, 6, 7, 8]
    # 0.3 * 10 == 3.0000000000000004 and 0.7 * 10 == 7.000000000000001: still steps 3 .. 6.
    assert active_steps(10, 0.3, 0.7, 0) == [3, 4, 5, 6]
    assert active_steps(3, 1 / 3, 2 / 3, 0) == [1]
    # Fractions that fall between steps round up to the next step.
    assert active_steps(10, 0.25, 0.55, 0) == [3, 4, 5]
    assert not in_selection_window(10, 10, 0.0, 1.0)  # past the planned end


def test_interrupt_makes_every_kth_step_plain():
    assert [s for s in range(8) if is_interrupt_step(s, 2)] == [1, 3, 5, 7]
    assert [s for s in range(9) if is_interrupt_step(s, 3)] == [2, 5, 8]
    assert not any(is_interrupt_step(s, 0) for s in range(10))
    # Composer's default (0.5, 0.9, interrupt 2) on 20 steps: window 10 .. 17, odd steps plain.
    assert active_steps(20, 0.5, 0.9, 2) == [10, 12, 14, 16]
    assert active_steps(10, 0.0, 1.0, 3) == [0, 1, 3, 4, 6, 7, 9]
    assert active_steps(10, 0.0, 1.0, 1) == []  # k = 1: every step plain


def test_interrupt_counts_from_step_zero_not_from_window_start():
    assert active_steps(10, 0.3, 1.0, 2) == [4, 6, 8]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"total_steps": 0},
        {"total_steps": 10, "start": -0.1},
        {"total_steps": 10, "start": 0.6, "end": 0.5},
    ],
)
def test_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        in_selection_window(0, **kwargs)
