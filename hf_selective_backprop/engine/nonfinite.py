"""`NonfiniteGuard`: stops a run whose losses are NaN or inf, before it trains on them or reads epochs forever."""

from __future__ import annotations

import torch
from accelerate import Accelerator

from . import distributed
from .accounting import SelectionStats

#: What a non-finite loss says about the run, in every error that stops it for one.
NONFINITE_CAUSE = (
    "The model's outputs are non-finite (diverged weights, a too-high learning rate, or broken inputs/labels)."
)


class NonfiniteGuard:
    """Counts the non-finite losses of selection forwards (per epoch) and of training forwards (per optimizer
    step), and stops every rank together when a step or an epoch cannot make progress. Nothing of it is saved: the
    training count is checked before every optimizer step, so none is pending at a checkpoint, and a resumed epoch
    counts its scored losses afresh."""

    def __init__(self, accelerator: Accelerator, stats: SelectionStats):
        self.accelerator, self.stats = accelerator, stats
        self.epoch_scored = self.epoch_nonfinite = 0  # selection-forward losses of the epoch, on this rank
        #: Non-finite training-forward losses since the last optimizer step, counted on the device.
        self._training_nonfinite: torch.Tensor | None = None

    def count_scored(self, losses: torch.Tensor) -> None:
        """Count the non-finite ones among a selection batch's losses (on the host)."""
        nonfinite = int((~torch.isfinite(losses)).sum())
        self.stats.nonfinite_losses += nonfinite
        self.epoch_scored += losses.numel()
        self.epoch_nonfinite += nonfinite

    def fail_if_every_loss_was_nonfinite(self, epoch: int, planned: bool) -> None:
        """At an epoch's end, stop a run that cannot progress: every loss scored in ``epoch`` (on some rank) was
        NaN/inf, and no row was ``planned`` to train. Such rows are never kept, so nothing is trained; a
        step-based run would read epochs forever. A collective; the next epoch counts afresh."""
        stuck = not planned and self.epoch_scored > 0 and self.epoch_nonfinite == self.epoch_scored
        if not distributed.all_true(self.accelerator, not stuck):
            raise RuntimeError(
                f"every per-example loss scored in epoch {epoch} was NaN or inf (this process: "
                f"{self.epoch_nonfinite} of {self.epoch_scored} non-finite): selection never keeps such "
                f"examples, so training cannot make progress. {NONFINITE_CAUSE}"
            )
        self.epoch_scored = self.epoch_nonfinite = 0

    def observe_training_loss(self, loss: torch.Tensor) -> None:
        """Count a training forward's loss if it is NaN or inf, on the device (checked before the step).

        A strategy that decides before loading (InfoBatch, a planned Stale-SB epoch) trains rows no
        selection forward scored, so a model that diverged is first seen here."""
        nonfinite = (~torch.isfinite(loss.detach())).sum()
        if self._training_nonfinite is not None:
            nonfinite = nonfinite + self._training_nonfinite
        self._training_nonfinite = nonfinite

    def fail_if_training_loss_was_nonfinite(self, step: int) -> None:
        """Stop before an optimizer step whose loss (on some rank) was NaN or inf: it would make every weight
        non-finite. Never trained, as a non-finite selection loss never is (a collective)."""
        nonfinite = 0 if self._training_nonfinite is None else int(self._training_nonfinite)  # one wait a step
        self._training_nonfinite = None
        self.stats.nonfinite_losses += nonfinite
        if distributed.all_true(self.accelerator, nonfinite == 0):
            return
        raise RuntimeError(
            f"the training loss of step {step + 1} was NaN or inf (this process: {nonfinite} non-finite "
            f"micro-batch loss(es)); stopped before the optimizer step, which would make the weights non-finite. "
            f"{NONFINITE_CAUSE}"
        )
