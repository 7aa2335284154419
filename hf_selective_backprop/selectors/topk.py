"""Deterministic top-k: train on the highest-loss fraction of every selection batch."""

from __future__ import annotations

import math

import torch

from .base import Selection, Selector


def keep_count(keep: float, n: int) -> int:
    """Rows a fixed-fraction rule keeps out of ``n``: ``keep * n`` rounded half up, at least 1.

    Half-up rather than Python's half-to-even ``round`` so that the count never shrinks when
    ``n`` grows by one (round(2.5) == 2 but round(3.5) == 4 would make 5 -> 2, 7 -> 4). Never
    more than ``n``; 0 only for an empty batch.
    """
    if n <= 0:
        return 0
    return min(n, max(1, math.floor(keep * n + 0.5)))


def check_keep(keep: float) -> float:
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    return float(keep)


class TopKSelector(Selector):
    """Keeps exactly ``keep_count(keep, n)`` highest-loss rows of each selection batch.

    The greedy end of the spectrum (RHO-LOSS-style top fraction without the irreducible-loss
    correction): no randomness, so the generator is unused. Ties are broken by position (the
    earlier row wins) through a stable sort, so equal inputs always give equal selections.
    Indices come back in ascending order, preserving the batch's order.
    """

    def __init__(self, keep: float):
        self.keep = check_keep(keep)

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        k = keep_count(self.keep, losses.numel())
        order = torch.sort(losses, descending=True, stable=True).indices
        return Selection(torch.sort(order[:k]).values)

    def expected_keep_fraction(self) -> float:
        return self.keep
