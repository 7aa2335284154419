"""MosaicML Composer's Selective-Backprop rule: a fixed count, sampled by in-batch rank."""

from __future__ import annotations

import torch

from .base import Selection, Selector
from .topk import check_keep, keep_count


class ComposerSelector(Selector):
    """Keeps exactly ``keep_count(keep, n)`` rows, drawn without replacement with
    ``p ∝ percentile ** (1/keep - 1)``.

    The percentile is Composer's: losses are ranked ascending (rank r = 0 .. n-1) and row of
    rank r gets ``(r + 0.5) / n``, so no row has probability 0 and the highest loss is the
    most likely. Unlike Selective-Backprop there is no loss history: only the ranks within
    the current batch matter. Differences from Composer's code, on purpose: the count is
    rounded half up with a minimum of 1 (Composer truncates with ``int(keep * n)``), ties are
    ranked by position through a stable sort, and sampling uses the given ``torch.Generator``
    instead of NumPy's global RNG, so runs are reproducible.
    """

    def __init__(self, keep: float):
        self.keep = check_keep(keep)

    def probabilities(self, losses: torch.Tensor) -> torch.Tensor:
        """Normalised sampling weights of a first draw (later draws renormalise over the rest)."""
        n = losses.numel()
        order = torch.sort(losses, stable=True).indices
        ranks = torch.empty(n, dtype=torch.float64)
        ranks[order] = torch.arange(n, dtype=torch.float64)
        weights = ((ranks + 0.5) / n).pow(1.0 / self.keep - 1.0)
        return weights / weights.sum()

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        n = losses.numel()
        if n == 0:
            return Selection(torch.empty(0, dtype=torch.long))
        rows = torch.multinomial(
            self.probabilities(losses), keep_count(self.keep, n), replacement=False, generator=generator
        )
        return Selection(torch.sort(rows).values)

    def expected_keep_fraction(self) -> float:
        return self.keep
