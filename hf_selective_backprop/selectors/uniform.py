"""Uniform random subset: the control baseline that loss-based selection has to beat."""

from __future__ import annotations

import torch

from .base import Selection, Selector
from .topk import check_keep, keep_count


class UniformSelector(Selector):
    """Keeps exactly ``keep_count(keep, n)`` rows drawn uniformly without replacement.

    "No Train No Gain" (Kaddour et al., 2023) and Balles et al. (2023) found that loss-based
    selection often fails to beat a random subset of the same size under a fixed budget, so
    this is the baseline to compare every other strategy against. It ignores losses
    (``needs_losses = False``): the trainer skips the selection forward and passes a dummy
    tensor (e.g. zeros) of the batch's length, whose values are never read. It decides each epoch
    before loading (``plan_epoch``), so the examples it leaves out are never loaded; inside an
    ``sb_start``/``sb_end`` boundary or with ``sb_interrupt`` it draws per selection batch instead.
    """

    needs_losses = False

    def __init__(self, keep: float):
        self.keep = check_keep(keep)

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        n = losses.numel()
        rows = torch.randperm(n, generator=generator)[: keep_count(self.keep, n)]
        return Selection(torch.sort(rows).values)

    def plan_epoch(self, stored_losses: torch.Tensor, generator: torch.Generator, epoch: int) -> Selection:
        return self._select(stored_losses, generator, stored_losses)

    def expected_keep_fraction(self) -> float:
        return self.keep
