"""Decisions made before loading: which examples an epoch loads, and the sampler that loads only those.

A plan is keyed by example id (the ``sb_index_column``). Examples are *trained* (decided, go
straight to the batch queue with their weight), *scored* (loaded and decided after a selection
forward) or left out (never loaded). Every process holds the same plan, so the sharded loader
stays consistent across ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.data import Sampler

from ..selectors import Selection, Selector
from .indexing import ids_by_position


@dataclass
class EpochPlan:
    """``copies[id]``: times the example is loaded and trained as decided; ``scored[id]``: loaded once
    more to be decided after a selection forward; ``weights[id]``: loss weight of its decided copies."""

    copies: torch.Tensor
    scored: torch.Tensor
    weights: torch.Tensor | None = None

    @classmethod
    def from_selection(cls, selection: Selection, num_ids: int, scored: torch.Tensor | None = None) -> EpochPlan:
        copies = torch.bincount(selection.indices, minlength=num_ids)[:num_ids].to(torch.int32)
        weights = None
        if selection.weights is not None:
            weights = torch.ones(num_ids, dtype=torch.float32)
            weights[selection.indices] = selection.weights.float()
        if scored is None:
            scored = torch.zeros(num_ids, dtype=torch.bool)
        return cls(copies, scored, weights)

    def loads(self, ids: torch.Tensor) -> torch.Tensor:
        """How many times each id is loaded this epoch."""
        return self.copies[ids] + self.scored[ids].to(torch.int32)

    def is_decided(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows (by id) that go to training without a selection forward (no plan both decides and
        scores one id: only examples without a stored loss are scored)."""
        return self.copies[ids] > 0

    def state_dict(self) -> dict:
        return {"copies": self.copies, "scored": self.scored, "weights": self.weights}

    @classmethod
    def from_state_dict(cls, state: dict) -> EpochPlan:
        return cls(state["copies"], state["scored"], state["weights"])


def stale_plan(
    selector: Selector, stored_losses: torch.Tensor, generator: torch.Generator, chunk_size: int
) -> tuple[EpochPlan, int]:
    """Stale-SB's epoch: decide every example with a stored loss before loading, from that loss.

    The known examples are dealt in a random order into chunks of a selection batch's size and
    each chunk goes through the strategy's after-scoring rule, exactly as a scored selection batch
    would (a loss history then evolves as in a fresh epoch). Examples without a stored loss are
    loaded and scored. Returns the plan and the number of stored losses it used.
    """
    known = torch.isfinite(stored_losses).nonzero().squeeze(1)
    order = known[torch.randperm(known.numel(), generator=generator)]
    picked, weights = [], []
    for chunk in order.split(chunk_size):
        selection = selector.select(stored_losses[chunk], generator)
        picked.append(chunk[selection.indices])
        if selection.weights is not None:
            weights.append(selection.weights)
    indices = torch.cat(picked) if picked else torch.empty(0, dtype=torch.long)
    selection = Selection(indices, torch.cat(weights) if selector.produces_weights and weights else None)
    if selector.produces_weights and selection.weights is None:
        selection.weights = torch.empty(0)
    return EpochPlan.from_selection(selection, stored_losses.numel(), ~torch.isfinite(stored_losses)), known.numel()


class PlannedSampler(Sampler[int]):
    """Wraps the Trainer's sampler and yields, in its order, only the positions the epoch's plan loads.

    ``ids_by_position[p]`` is the id of the dataset's row p. ``skip`` drops the first rows of the
    order (resuming inside an epoch), so skipped rows are not loaded either. Without a plan the
    base order passes through unchanged.

    With several processes (``rows_per_round`` = processes x selection batch > 1) the order is padded
    to whole rounds with its own first rows, as Accelerate's sharded batch sampler would pad it; done
    here, before the skip, the padding does not depend on where a resumed epoch starts.
    """

    def __init__(self, base: Sampler, ids_by_position: torch.Tensor | None, rows_per_round: int = 1):
        self.base = base
        self.ids_by_position = ids_by_position
        self.rows_per_round = rows_per_round
        self.epoch_plan: EpochPlan | None = None
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)

    def _padded(self, rows: int) -> int:
        if self.rows_per_round <= 1 or rows == 0:
            return rows
        return math.ceil(rows / self.rows_per_round) * self.rows_per_round

    def __len__(self) -> int:
        if self.epoch_plan is None:
            rows = len(self.base)
        else:
            rows = int(self.epoch_plan.loads(self.ids_by_position).sum())
        # A checkpoint taken after an epoch's last, partial batch counts it as a whole one: skip exceeds the rows.
        return max(self._padded(rows) - self.skip, 0)

    def __iter__(self):
        order = torch.as_tensor(list(self.base), dtype=torch.long)
        if self.epoch_plan is not None:
            order = order.repeat_interleave(self.epoch_plan.loads(self.ids_by_position[order]))
        if len(order):
            order = order.repeat(math.ceil(self._padded(len(order)) / len(order)))[: self._padded(len(order))]
        skip, self.skip = self.skip, 0
        yield from order[skip:].tolist()


def planned_sampler(sampler, dataset, args, selection_batch_size: int, plans_before_loading: bool) -> PlannedSampler:
    """The Trainer's training sampler, wrapped to load only the rows an epoch's plan trains."""
    if isinstance(sampler, torch.utils.data.RandomSampler):
        # Accelerate would make a plain RandomSampler seedable (same order on every rank and on
        # resume) but cannot see it inside a wrapper, so wrap the seedable one.
        from accelerate.data_loader import SeedableRandomSampler

        sampler = SeedableRandomSampler(data_source=sampler.data_source, data_seed=args.data_seed)
    ids = ids_by_position(dataset, args.sb_index_column) if plans_before_loading else None
    padded = args.world_size > 1 and not args.dataloader_drop_last
    return PlannedSampler(sampler, ids, args.world_size * selection_batch_size if padded else 1)
