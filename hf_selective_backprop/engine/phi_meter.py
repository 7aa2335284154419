"""phi, the cost model's price of a selection forward, measured on a budget run's first optimizer steps
(``--sb_budget`` without ``--sb_cost_phi``).

phi is the time one example's selection costs (its forward and the selection's bookkeeping) over the time one
example's training step costs (forward, backward and its share of the optimizer step), as Jiang et al. (2019,
section 3) define it. Both are timed over the same steps of the run itself, so the budget follows what this
model costs on this hardware; data loading, evaluation and saving count in neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

from . import distributed
from .accounting import SelectionStats

#: Steps left untimed after the run starts (or resumes): they pay one-off costs (allocation, lazy
#: initialisation, kernel selection) that later steps do not.
SKIPPED_STEPS = 2
#: Steps timed, at the least: the timing ends at the first step after them that follows a selection forward.
TIMED_STEPS = 10

#: Seconds a step spends outside both the selection and the training step.
_ELSEWHERE = ("data_seconds", "eval_seconds", "save_seconds", "reference_seconds")
_SELECTION = ("selection_forward_seconds", "selection_overhead_seconds")


@dataclass(frozen=True)
class PhiMeasurement:
    phi: float
    first_step: int  # the optimizer steps timed (1-based, as the Trainer counts them)
    last_step: int
    selection_ms: float  # per scored example
    training_ms: float  # per trained example


class PhiMeter:
    """Times the selection and the training steps of one process from the step after ``SKIPPED_STEPS`` on, and
    returns phi, the same on every process (their times and rows summed), once ``TIMED_STEPS`` steps with at
    least one selection forward among them are timed.

    ``synchronize`` (an accelerator's) is called around each timed phase while the meter runs: kernels run
    asynchronously, and unsynchronised timers would measure their launch. Nothing of the meter is saved: a run
    resumed before the measurement ended measures again.
    """

    def __init__(self, stats: SelectionStats, synchronize=None):
        self.stats, self.synchronize = stats, synchronize
        self.calls = 0  # steps since the run (or the resumed run) started
        self._begun_at = 0
        #: When the timing began: wall clock, this process's counters, the selection forwards of all processes.
        self._start: tuple[float, dict, int] | None = None
        self._stats_synchronize = stats.synchronize

    def at_step(self, accelerator, scored_rows: int) -> PhiMeasurement | None:
        """Called by every process as each optimizer step is about to run, with the selection forwards summed
        over processes so far (a collective when it returns a measurement)."""
        self.calls += 1
        if self.calls == SKIPPED_STEPS + 1:
            self._begin(scored_rows)
            return None
        if self._start is None or self.calls - self._begun_at < TIMED_STEPS or scored_rows == self._start[2]:
            return None
        measured = self._end(accelerator)
        if measured is None:  # no time measured (a clock too coarse): time the next steps instead
            self._begin(scored_rows)
        return measured

    def _begin(self, scored_rows: int) -> None:
        if self.synchronize is not None:
            self.stats.synchronize = self.synchronize
            self.synchronize()
        self._start = (perf_counter(), self.stats.state_dict(), scored_rows)
        self._begun_at = self.calls

    def _end(self, accelerator) -> PhiMeasurement | None:
        if self.synchronize is not None:
            self.synchronize()
        wall, before, _ = self._start
        now = self.stats.state_dict()
        counted = (*_SELECTION, *_ELSEWHERE, "selection_forwards", "backwards")
        change = {name: now[name] - before[name] for name in counted}
        selection = sum(change[name] for name in _SELECTION)
        training = perf_counter() - wall - selection - sum(change[name] for name in _ELSEWHERE)
        summed = distributed.sum_over_processes(accelerator, {
            "selection_seconds": selection, "training_seconds": max(training, 0.0),
            "scored": change["selection_forwards"], "trained": change["backwards"],
        })
        self.stats.synchronize = self._stats_synchronize
        if not (summed["selection_seconds"] > 0 and summed["training_seconds"] > 0):
            return None
        per_scored = summed["selection_seconds"] / summed["scored"]
        per_trained = summed["training_seconds"] / summed["trained"]
        # The step about to run was counted as the timing began and as it ended: the timed ones lie between.
        return PhiMeasurement(per_scored / per_trained, before["optimizer_steps"], now["optimizer_steps"] - 1,
                              1000 * per_scored, 1000 * per_trained)
