"""`LoggedLoss`: the training ``loss`` a Trainer user reads, under strategies that weight examples.

Weights that rescale a pruned batch (InfoBatch's 1/(1-r), importance weights) make the loss that is backpropagated
(the weighted objective) grow with the share pruned: logged as ``loss`` it climbed 0.70 -> 0.95 where the Trainer's
fell to 0.65, which reads as divergence. The Trainer logs the weighted mean instead (each example's loss weighted,
divided by the weights: an estimate of the mean loss of every example, comparable with the Trainer's own), and the
objective under its own name, ``sb/weighted_loss``.
"""

from __future__ import annotations

import torch
from transformers.trainer_pt_utils import nested_gather


class LoggedLoss:
    """The weighted-mean factor of the micro-batch in flight, and the objective summed since the last log."""

    KEY = "sb/weighted_loss"

    def __init__(self):
        self.pending: torch.Tensor | None = None  # set by compute_loss, read by the training step
        self.objective_total: torch.Tensor | None = None
        self.logged_at_step = 0

    def start(self, global_step: int) -> None:
        """A training loop starts at ``global_step`` (a resumed run: the checkpoint's): the first log covers the
        steps from there, as the Trainer counts its own ``loss``."""
        self.objective_total, self.logged_at_step = None, global_step

    def step_loss(self, objective: torch.Tensor) -> torch.Tensor:
        """The training step's value for the Trainer's ``loss``: the weighted mean where compute_loss weighted."""
        factor, self.pending = self.pending, None
        if factor is None:
            return objective
        objective = objective.detach()
        self.objective_total = objective if self.objective_total is None else self.objective_total + objective
        return objective * factor.to(objective.device)

    def add_to(self, logs: dict, global_step: int, parallel_mode) -> None:
        """Put the objective's mean per optimizer step since the last log into ``logs``, averaged over processes
        as the Trainer averages ``loss`` (a collective every process reaches with its log)."""
        if self.objective_total is None:
            return
        steps = max(global_step - self.logged_at_step, 1)
        logs[self.KEY] = round(nested_gather(self.objective_total, parallel_mode).mean().item() / steps, 4)
        self.objective_total, self.logged_at_step = None, global_step
