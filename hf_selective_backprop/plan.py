"""How long a selective run is: expected optimizer steps, and bounds the Trainer's loop needs."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingPlan:
    """Sizes of a run in which an epoch is one pass of the data through selection.

    ``rows_per_epoch`` are the examples one process reads per epoch; a step trains
    ``rows_per_step`` = batch size x gradient accumulation of them.
    """

    rows_per_epoch: int
    selection_batches_per_epoch: int
    selection_batch_size: int
    rows_per_step: int
    keep: float
    active_share: float
    warmup_epochs: int

    def expected_keep(self) -> float:
        """Average share of read rows that is trained, over the steps after warm-up."""
        active, keep = self.active_share, self.keep
        # A step with selection reads rows_per_step / keep rows, one without reads rows_per_step.
        return 1.0 / (1.0 - active + active / keep)

    def expected_steps(self, epochs: float) -> int:
        warm = min(epochs, self.warmup_epochs)
        rows = warm * self.rows_per_epoch + (epochs - warm) * self.rows_per_epoch * self.expected_keep()
        return max(1, math.floor(rows / self.rows_per_step))

    def max_micro_batches_per_epoch(self, grad_accum: int) -> int:
        """A bound on the micro-batches of one epoch (a multiple of grad_accum).

        Every read row is trained at most once, plus a queue carried from the previous epoch.
        """
        rows = self.selection_batches_per_epoch * self.selection_batch_size + self.rows_per_step
        steps = math.ceil(rows / self.rows_per_step)
        return steps * grad_accum
