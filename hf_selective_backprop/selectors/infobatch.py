"""InfoBatch (Qin et al., ICLR 2024, "InfoBatch: Lossless Training Speed Up by Unbiased Dynamic Data
Pruning"): prune easy examples before loading, rescale the kept easy ones, train on everything at the end."""

from __future__ import annotations

import torch

from .base import Selection, Selector

#: The paper's annealing: the last 12.5 % of the epochs train on all data.
INFOBATCH_ANNEAL_DELTA = 0.875


class InfoBatchSelector(Selector):
    """Each epoch, drops each example whose latest training loss is below the mean with probability
    ``prune_ratio`` (r), and weights the kept below-mean examples' loss by 1/(1 - r).

    The expected gradient of an epoch is then the full data's: a below-mean example contributes
    (1 - r) x 1/(1 - r) = 1 times its gradient in expectation. Scores are the training-forward
    losses the trainer stores for every trained example (``uses_stored_losses``): no selection
    forward. An example without a stored loss (never trained, e.g. the whole first epoch) is kept
    with weight 1. Epochs at or after ``anneal_delta`` x the run's epochs train on all data,
    unweighted, as the paper does for its last 12.5 %.

    The decision is made before loading (``plan_epoch``), so pruned examples cost no loading,
    augmentation, forward or backward. A stream cannot be planned: each loaded batch's rows are
    decided by the same rule from their stored losses and the store's mean at the epoch's start
    (``plan_rows``), so pruned rows are read and collated but not trained. In an epoch that is not
    decided before loading (for example under ``sb_interrupt``) every loaded row is trained.
    """

    needs_losses = False
    produces_weights = True
    uses_stored_losses = True

    def __init__(self, prune_ratio: float, anneal_delta: float, num_epochs: float):
        if not 0.0 <= prune_ratio < 1.0:
            raise ValueError(f"prune_ratio must be in [0, 1), got {prune_ratio}")
        if not 0.0 <= anneal_delta <= 1.0:
            raise ValueError(f"anneal_delta must be in [0, 1], got {anneal_delta}")
        self.prune_ratio = prune_ratio
        self.anneal_delta = anneal_delta
        self.num_epochs = num_epochs

    def fit_run(self, num_epochs: float) -> None:
        self.num_epochs = num_epochs  # annealing starts at anneal_delta of the epochs the budget buys

    def plan_epoch(self, stored_losses: torch.Tensor, generator: torch.Generator, epoch: int) -> Selection | None:
        if epoch >= self.anneal_delta * self.num_epochs:
            return None
        mean = self.stream_epoch_rule(stored_losses, epoch)
        return None if mean is None else self._prune(stored_losses, generator, mean)

    def stream_epoch_rule(self, stored_losses: torch.Tensor, epoch: int) -> float | None:
        """The mean of the known stored losses (None: nothing is known, nothing is pruned)."""
        known = torch.isfinite(stored_losses)
        return float(stored_losses[known].mean()) if bool(known.any()) else None

    def plan_rows(self, stored_losses, generator, rule, progress):
        """A stream's batch, by the same rule; a stream is step-based, so annealing starts at ``anneal_delta``
        of the run's steps."""
        return None if progress >= self.anneal_delta else self._prune(stored_losses, generator, rule)

    def _prune(self, stored_losses: torch.Tensor, generator: torch.Generator, mean: float) -> Selection:
        easy = torch.isfinite(stored_losses) & (stored_losses < mean)
        draws = torch.rand(stored_losses.shape, generator=generator)
        kept = ~easy | (draws >= self.prune_ratio)
        weights = torch.where(easy, 1.0 / (1.0 - self.prune_ratio), 1.0).float()
        indices = kept.nonzero().squeeze(1)
        return Selection(indices, weights[indices])

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        return Selection(torch.arange(losses.numel()), torch.ones(losses.numel()))

    def expected_keep_fraction(self) -> float:
        # About half the examples fall below the mean; r of them are pruned until annealing starts.
        return 1.0 - 0.5 * self.prune_ratio * self.anneal_delta
