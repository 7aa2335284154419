"""The paper's cost model, the one copy every benchmark script uses (benchmarks/harness/cost_model.py)."""

import pytest

from harness.cost_model import (
    PAPER_R,
    forward_from_step,
    ideal_speedup,
    phi_from_times,
    r_from_times,
)


def test_traditional_is_the_unit_and_a_subset_without_scoring_is_one_over_its_size():
    assert ideal_speedup(PAPER_R, phi=0.7, kept=1.0, scored=0.0) == 1.0
    assert ideal_speedup(PAPER_R, phi=0.7, kept=0.25, scored=0.0) == pytest.approx(4.0)


def test_sb_and_stale_sb_as_the_paper_writes_them():
    # SB: (1+r) / (phi + s(1+r)); Stale-SB with staleness n: (1+r) / (phi/n + s(1+r)).
    assert ideal_speedup(2.0, phi=1.0, kept=1 / 3) == pytest.approx(3 / 2)
    assert ideal_speedup(2.0, phi=1.0, kept=1 / 3, scored=1 / 3) == pytest.approx(3 / (1 / 3 + 1))
    # A selection forward dearer than training the kept rows costs more than it saves.
    assert ideal_speedup(2.0, phi=2.5, kept=1 / 3) < 1


def test_phi_and_r_from_measured_times():
    step, forward = 0.3, 0.1  # seconds per batch
    r = r_from_times(step, forward)
    assert r == pytest.approx(2.0) and forward_from_step(step, r) == pytest.approx(forward)
    # 64 rows scored in 0.032 s, against a training forward of 1 ms per row: phi = 0.5.
    assert phi_from_times(0.032, 64, 0.001) == pytest.approx(0.5)
