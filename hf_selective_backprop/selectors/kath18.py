"""Katharopoulos & Fleuret (ICML 2018), "Not All Samples Are Created Equal", with loss scores."""

from __future__ import annotations

import math

import torch

from .base import Selection, Selector

#: Relative smoothing added to every score (as a fraction of the mean score), so that rows
#: with zero loss keep a small chance of being drawn and their weights stay finite.
SCORE_EPS = 1e-6


class Kath18Selector(Selector):
    """Draws exactly ``batch_size`` rows WITH replacement from a selection batch of
    n = presample x batch_size rows, with ``p_i ∝ loss_i``.

    Scores are the losses (the paper's cheap alternative to its gradient-norm bound),
    negative losses clamped to 0, plus ``SCORE_EPS * mean`` (and a tiny absolute term, so an
    all-zero batch becomes uniform).

    Weights (``importance_weighting=True``): exactly the paper's unbiased ``w_i = 1 / (n p_i)``
    with n the number of scored rows, no renormalisation. Then the mean over the drawn batch
    of ``w * loss`` is an unbiased estimate of the mean loss (and gradient) of the n scored
    rows. Without weighting the selection is biased towards high losses, by design.

    Variance-reduction start (``variance_start=True``; threshold from Eq. 29 of arXiv 1803.00942): until it has
    started, rows are drawn uniformly (without replacement when n >= batch_size) with weights
    1. Every call computes ``tau = 1 / sqrt(1 - ||g - u||^2 / ||g||^2)``, g the normalised
    scores and u = 1/n, and keeps an exponential moving average (momentum 0.9, started at
    0 as in the authors' code, which acts as a short warm-up). Importance sampling starts on
    the first call whose updated average exceeds ``(B + 3b) / (3b)``, B = n of that call and
    b = batch_size, and then stays on for good (the authors' sampler re-tests every step);
    the average keeps being updated, for logging. The EMA and the flag are the state.

    With fewer finite rows than ``batch_size`` the draw is still ``batch_size`` rows with
    replacement; with none at all the selection is empty.
    """

    def __init__(
        self,
        presample: float,
        importance_weighting: bool,
        variance_start: bool,
        batch_size: int,
        *,
        momentum: float = 0.9,
    ):
        if not presample >= 1.0:
            raise ValueError(f"presample must be >= 1, got {presample}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.presample = float(presample)
        self.importance_weighting = bool(importance_weighting)
        self.produces_weights = self.importance_weighting
        self.variance_start = bool(variance_start)
        self.batch_size = int(batch_size)
        self.momentum = momentum
        self.tau = 0.0
        self.started = not self.variance_start

    @staticmethod
    def probabilities(losses: torch.Tensor) -> torch.Tensor:
        """Sampling probabilities (float64) proportional to the smoothed, non-negative losses."""
        scores = losses.double().clamp_min(0.0)
        scores = scores + SCORE_EPS * scores.mean() + torch.finfo(torch.float64).tiny
        return scores / scores.sum()

    @staticmethod
    def variance_reduction(p: torch.Tensor) -> float:
        """The paper's tau for normalised scores ``p``: 1 for uniform scores, sqrt(n) for one-hot."""
        u = 1.0 / p.numel()
        ratio = float((p - u).square().sum() / p.square().sum())
        return 1.0 / math.sqrt(max(1.0 - ratio, 1e-12))

    def tau_threshold(self, n: int) -> float:
        """(B + 3b) / (3b): the variance reduction at which scoring B rows pays off (Eq. 29)."""
        return (n + 3.0 * self.batch_size) / (3.0 * self.batch_size)

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        n, b = losses.numel(), self.batch_size
        if n == 0:
            empty = torch.empty(0, dtype=torch.float32) if self.importance_weighting else None
            return Selection(torch.empty(0, dtype=torch.long), empty)
        p = self.probabilities(losses)
        if self.variance_start:
            self.tau = self.momentum * self.tau + (1.0 - self.momentum) * self.variance_reduction(p)
            self.started = self.started or self.tau > self.tau_threshold(n)
        if not self.started:
            if n >= b:
                rows = torch.randperm(n, generator=generator)[:b]
            else:
                rows = torch.randint(n, (b,), generator=generator)
            return Selection(rows, torch.ones(b) if self.importance_weighting else None)
        rows = torch.multinomial(p, b, replacement=True, generator=generator)
        weights = (1.0 / (n * p[rows])).float() if self.importance_weighting else None
        return Selection(rows, weights)

    def expected_keep_fraction(self) -> float:
        return 1.0 / self.presample

    def state_dict(self) -> dict:
        return {"tau": self.tau, "started": self.started}

    def load_state_dict(self, state: dict) -> None:
        self.tau = float(state["tau"])
        self.started = bool(state["started"])
