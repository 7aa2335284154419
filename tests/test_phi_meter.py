"""phi measured on a budget run's first steps (`engine.phi_meter`), on a clock the test drives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hf_selective_backprop.engine import phi_meter
from hf_selective_backprop.engine.accounting import SelectionStats
from hf_selective_backprop.engine.phi_meter import SKIPPED_STEPS, TIMED_STEPS, PhiMeter

ONE_PROCESS = SimpleNamespace(num_processes=1)
TRAINED, SCORED = 8, 24  # rows per step: a third of the rows scored is kept


class _Run:
    """Steps of a run on a fake clock: each reads data, scores (or not) and trains, and counts as the engine
    does (the step about to run is counted when the meter is asked)."""

    def __init__(self, monkeypatch, meter_synchronize=None):
        self.now = 0.0
        monkeypatch.setattr(phi_meter, "perf_counter", lambda: self.now)
        self.stats = SelectionStats()
        self.meter = PhiMeter(self.stats, meter_synchronize)
        self.scored_rows = 0

    def step(self, scoring: bool = True, selection_s: float = 0.024, training_s: float = 0.064,
             data_s: float = 0.5):
        if scoring:
            self.stats.selection_forward_seconds += selection_s * 3 / 4
            self.stats.selection_overhead_seconds += selection_s / 4
            self.stats.selection_forwards += SCORED
            self.scored_rows += SCORED
            self.now += selection_s
        self.stats.data_seconds += data_s  # counts in neither side
        self.now += data_s
        self.stats.backwards += TRAINED
        self.stats.optimizer_steps += 1
        measured = self.meter.at_step(ONE_PROCESS, self.scored_rows)
        self.now += training_s  # the step runs after it was counted
        return measured


def test_phi_is_a_scored_rows_selection_time_over_a_trained_rows_step_time(monkeypatch):
    run = _Run(monkeypatch)
    results = [run.step(training_s=1.0 if i < SKIPPED_STEPS else 0.064) for i in range(SKIPPED_STEPS + TIMED_STEPS)]
    assert results == [None] * (SKIPPED_STEPS + TIMED_STEPS)
    measured = run.step()
    # (0.024 s / 24 rows) / (0.064 s / 8 rows): the slow first steps and the data loading count in neither.
    assert measured.phi == pytest.approx(0.125)
    assert (measured.selection_ms, measured.training_ms) == pytest.approx((1.0, 8.0))
    assert (measured.first_step, measured.last_step) == (SKIPPED_STEPS + 1, SKIPPED_STEPS + TIMED_STEPS)


def test_the_timing_goes_on_until_a_selection_forward_was_timed(monkeypatch):
    """Warm-up epochs (or a stale epoch) score nothing: phi waits for the first selection forward."""
    run = _Run(monkeypatch)
    for _ in range(SKIPPED_STEPS + 3 * TIMED_STEPS):
        assert run.step(scoring=False) is None
    measured = run.step(selection_s=0.048)
    assert measured.phi == pytest.approx((0.048 / 24) / (0.064 / 8))
    assert measured.last_step == SKIPPED_STEPS + 3 * TIMED_STEPS


def test_the_accelerator_is_waited_for_while_timing_and_not_after(monkeypatch):
    waits = []
    run = _Run(monkeypatch, meter_synchronize=lambda: waits.append(run.now))
    for _ in range(SKIPPED_STEPS):
        run.step()
    assert waits == [] and run.stats.synchronize is None
    run.step()
    assert len(waits) == 1 and run.stats.synchronize is not None  # the stats' timers wait too
    while run.step() is None:
        pass
    assert len(waits) == 2 and run.stats.synchronize is None


def test_a_given_timer_synchronisation_is_kept(monkeypatch):
    """--sb_sync_timers set the stats' synchronize before the meter: it stays after the measurement."""
    own = object()
    run = _Run(monkeypatch)
    run.stats.synchronize = own
    run.meter = PhiMeter(run.stats, lambda: None)
    while run.step() is None:
        pass
    assert run.stats.synchronize is own
