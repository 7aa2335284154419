"""A selection strategy defined outside the package, as a user would write one.

It trains on the *lowest*-loss fraction of each selection batch (the opposite of Selective-Backprop,
so its effect is easy to tell apart) and counts its calls, state that a checkpoint must carry.
"""

from __future__ import annotations

import torch

from hf_selective_backprop.selectors import Selection, Selector, keep_count, register_strategy


class EasiestFirst(Selector):
    def __init__(self, keep: float):
        self.keep = keep
        self.calls = 0

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        self.calls += 1
        lowest = torch.argsort(losses, stable=True)[: keep_count(self.keep, losses.numel())]
        return Selection(torch.sort(lowest).values)

    def expected_keep_fraction(self) -> float:
        return self.keep

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state["calls"])


register_strategy("easiest", lambda args: EasiestFirst(args.sb_keep_fraction))
