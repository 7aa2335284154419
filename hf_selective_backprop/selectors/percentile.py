"""Selective-Backprop's rule (Jiang et al., Eq. 1): P = max(CDF_R(loss) ** beta, floor)."""

from __future__ import annotations

import torch

from .base import Selection, Selector, bernoulli_keep
from .history import LossHistory


class PercentileSelector(Selector):
    """Keeps each example with probability ``max(CDF_R(loss) ** beta, min_prob)``.

    The batch's own losses join the history before scoring, as in the paper's Algorithm 2;
    they join all at once rather than one by one, so the whole batch is scored in one call.
    """

    def __init__(self, beta: float, history_size: int = 1024, min_prob: float = 0.0):
        if beta < 0:
            raise ValueError(f"beta must be >= 0 (0 keeps everything), got {beta}")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"min_prob must be in [0, 1], got {min_prob}")
        self.beta = beta
        self.min_prob = min_prob
        self.history = LossHistory(history_size)

    def probabilities(self, losses: torch.Tensor, population: torch.Tensor | None = None) -> torch.Tensor:
        self.history.add(losses if population is None else population)
        return self.history.cdf(losses).pow(self.beta).clamp_min(self.min_prob)

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        return Selection(bernoulli_keep(self.probabilities(losses, population), generator))

    def expected_keep_fraction(self) -> float:
        # E[max(U ** beta, f)] for U uniform on [0, 1]: the floor covers u < f ** (1 / beta).
        beta, floor = self.beta, self.min_prob
        if beta == 0:
            return 1.0
        below = floor ** (1.0 / beta)
        return floor * below + (1.0 - below ** (beta + 1.0)) / (beta + 1.0)

    def state_dict(self) -> dict:
        return {"history": self.history.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state["history"])
