"""Selective-Backprop with Horvitz-Thompson loss weights, so selection does not bias the gradient."""

from __future__ import annotations

import torch

from .base import Selection, bernoulli_keep
from .percentile import PercentileSelector

#: Default lower bound on every keep probability; it caps a weight at mean(P) / floor.
DEFAULT_PROB_FLOOR = 0.05


class ReweightedPercentileSelector(PercentileSelector):
    """SB's coin flips (``P_i = max(CDF_R(loss_i) ** beta, floor)``) plus a weight per kept row.

    Weight (one choice, normalised Horvitz-Thompson): ``w_i = mean(P) / P_i``, the mean over
    the finite rows of the selection batch, computed before the coin flips. Since row i is
    kept with probability P_i,

        E[sum over kept rows of w_i * loss_i] = mean(P) * sum_i loss_i
        E[sum over kept rows of w_i]          = mean(P) * n = E[number kept],

    so the weighted loss summed over the kept rows is, in expectation, the full batch's loss
    sum scaled by the expected kept fraction: the kept rows' weights average 1 and a step on
    a queue of kept rows has the same expected size as a step on an unselected batch (plain
    1/P_i would make each step about 1/keep times larger, i.e. silently raise the learning
    rate). Pure 1/P_i weights are ``w_i / mean(P)``.

    Clipping, without bias: instead of clipping weights (which would bias the estimate), the
    keep probability itself is floored at ``max(min_prob, prob_floor)`` and the weights use
    that floored probability, so the estimate stays exactly unbiased and no weight exceeds
    ``mean(P) / floor`` (about 7 at beta = 2 with the default floor 0.05). The price is a
    slightly larger kept fraction (0.341 instead of 0.333 at beta = 2, floor 0.05), which
    ``expected_keep_fraction`` accounts for.
    """

    produces_weights = True

    def __init__(
        self,
        beta: float,
        history_size: int = 1024,
        min_prob: float = 0.0,
        prob_floor: float = DEFAULT_PROB_FLOOR,
    ):
        if not 0.0 < prob_floor <= 1.0:
            raise ValueError(f"prob_floor must be in (0, 1], got {prob_floor}")
        super().__init__(beta, history_size, max(min_prob, prob_floor))

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        p = self.probabilities(losses, population)
        rows = bernoulli_keep(p, generator)
        if p.numel() == 0:
            return Selection(rows, torch.empty(0))
        return Selection(rows, p.mean() / p[rows])
