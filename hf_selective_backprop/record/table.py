"""`ExampleRecord`: what training did to every example, as running statistics keyed by example id.

Memory is O(largest id) with a small constant (81 bytes a slot), never a history: each scoring of an
example (the loss of a selection forward, or of a training forward where no selection forward scored it)
updates sums and counters from which the per-example scores follow (`scores.py`).

An example is *learned* at a scoring when its gold label holds more than half the probability,
``exp(-loss) > 1/2``: for cross-entropy this implies the prediction is the gold label (and is exactly correctness
for two classes). A *forgetting event* (Toneva et al., 2019) is a scoring at which a learned example is no longer
learned.
"""

from __future__ import annotations

import logging
import math

import torch

#: Event kinds, as the feed buffers them (`feed.RecordFeed`).
SCORED, TRAINED = 0, 1
#: The loss below which an example counts as learned: p(gold) = exp(-loss) > 1/2.
LEARNED_BELOW = math.log(2.0)

logger = logging.getLogger(__name__)

#: Each table's dtype and the value of a slot no event has touched.
_TABLES = {
    **{name: (torch.int32, 0) for name in (
        "times_scored", "times_backpropagated", "times_learned", "forgetting_events", "nonfinite_losses")},
    # float64: a sum over hundreds of epochs stays exact to float32's precision.
    **{name: (torch.float64, 0.0) for name in ("loss_sum", "confidence_sum", "confidence_sq_sum", "margin_sum")},
    "times_margined": (torch.int32, 0),  # scorings that gave a margin (single-label classification only)
    # pending_epoch: the epoch of a selection forward not yet followed by the example's training forward.
    **{name: (torch.int32, -1) for name in (
        "first_scored_epoch", "last_scored_epoch", "first_learned_epoch", "pending_epoch")},
    **{name: (torch.float32, float("nan")) for name in ("first_loss", "last_loss")},
    "learned": (torch.bool, False),  # at the latest scoring
}
#: Tables a record saved by an earlier version lacks: a resume starts them untouched.
_ADDED_LATER = ("margin_sum", "times_margined")


class ExampleRecord:
    """Running statistics per example id; ids grow the tables as they arrive (a stream's included).

    Events arrive in order through `apply` (the feed gathers them from every process first, so every process
    holds the same record). ``SCORED`` is a selection forward's loss; ``TRAINED`` a training forward's, which
    counts a backward pass and, unless a selection forward scored the example earlier in the same epoch, a
    scoring too.
    """

    def __init__(self, capacity: int = 0):
        self._tables = {name: torch.full((capacity,), fill, dtype=dtype) for name, (dtype, fill) in _TABLES.items()}

    def __len__(self) -> int:
        return self._tables["times_scored"].numel()

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tables[name]

    @property
    def seen(self) -> torch.Tensor:
        """The ids of the examples training scored or backpropagated, ascending. An example whose every loss was
        non-finite counts too: without its row the record would hide the losses it was meant to report."""
        touched = (self["times_scored"] > 0) | (self["times_backpropagated"] > 0) | (self["nonfinite_losses"] > 0)
        return touched.nonzero().squeeze(1)

    def _grow(self, capacity: int) -> None:
        if capacity <= len(self):
            return
        # Doubling: a stream's ids arrive in increasing order; growing by exactly what is needed would copy every time.
        capacity = max(capacity, 2 * len(self))
        for name, table in self._tables.items():
            dtype, fill = _TABLES[name]
            grown = torch.full((capacity,), fill, dtype=dtype)
            grown[: table.numel()] = table
            self._tables[name] = grown

    def apply(self, ids: torch.Tensor, losses: torch.Tensor, kinds: torch.Tensor, epochs: torch.Tensor,
              margins: torch.Tensor | None = None) -> None:
        """Take events in their order (ids int64, losses float, kinds `SCORED`/`TRAINED`, epochs int, margins
        float with NaN where the scoring gave none, or None for none at all), on the host.

        An id may occur several times (a DistributedSampler's padding, a row carried into the next epoch): its
        events are applied one occurrence after the other, each round vectorised over distinct ids.
        """
        if ids.numel() == 0:
            return
        if int(ids.min()) < 0:
            raise ValueError("example ids must be non-negative")
        if margins is None:
            margins = torch.full(ids.shape, float("nan"), dtype=torch.float64)
        self._grow(int(ids.max()) + 1)
        order = torch.argsort(ids, stable=True)
        sorted_ids = ids[order]
        starts = torch.ones_like(sorted_ids, dtype=torch.bool)
        starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
        first_of_run = torch.cummax(torch.where(starts, torch.arange(ids.numel()), 0), 0).values
        occurrence = torch.empty_like(ids)
        occurrence[order] = torch.arange(ids.numel()) - first_of_run
        for round_ in range(int(occurrence.max()) + 1):
            rows = (occurrence == round_).nonzero().squeeze(1)
            self._apply_distinct(ids[rows], losses[rows].to(torch.float64), kinds[rows], epochs[rows].to(torch.int32),
                                 margins[rows].to(torch.float64))

    def _apply_distinct(self, ids, losses, kinds, epochs, margins) -> None:
        t = self._tables
        trained = kinds == TRAINED
        trained_ids = ids[trained]
        t["times_backpropagated"][trained_ids] += 1
        # A training forward right after a selection forward of the same epoch measures nothing new.
        already_scored = torch.zeros_like(trained)
        already_scored[trained] = t["pending_epoch"][trained_ids] == epochs[trained]
        t["pending_epoch"][trained_ids] = -1
        t["pending_epoch"][ids[~trained]] = epochs[~trained]
        scoring = ~already_scored
        finite = torch.isfinite(losses)
        t["nonfinite_losses"][ids[scoring & ~finite]] += 1
        scoring &= finite
        ids, losses, epochs, margins = ids[scoring], losses[scoring], epochs[scoring], margins[scoring]
        if ids.numel() == 0:
            return
        confidence = torch.exp(-losses)
        first = t["times_scored"][ids] == 0
        t["first_loss"][ids[first]] = losses[first].float()
        t["first_scored_epoch"][ids[first]] = epochs[first]
        t["times_scored"][ids] += 1
        t["loss_sum"][ids] += losses
        t["confidence_sum"][ids] += confidence
        t["confidence_sq_sum"][ids] += confidence * confidence
        t["last_loss"][ids] = losses.float()
        margined = torch.isfinite(margins)
        t["margin_sum"][ids[margined]] += margins[margined]
        t["times_margined"][ids[margined]] += 1
        t["last_scored_epoch"][ids] = epochs
        learned = losses < LEARNED_BELOW
        t["forgetting_events"][ids[t["learned"][ids] & ~learned]] += 1
        t["times_learned"][ids[learned]] += 1
        newly = learned & (t["first_learned_epoch"][ids] < 0)
        t["first_learned_epoch"][ids[newly]] = epochs[newly]
        t["learned"][ids] = learned

    def state_dict(self) -> dict:
        return {name: table.clone() for name, table in self._tables.items()}

    def load_state_dict(self, state: dict) -> None:
        missing = set(self._tables) - set(state)
        if missing - set(_ADDED_LATER):
            raise ValueError(f"the saved example record lacks {sorted(missing)}: it was written by another version")
        if missing:
            logger.warning("the saved example record was written before its margins were kept: the resumed run's "
                           "aum covers only the scorings that follow")
        size = state["times_scored"].numel()
        self._tables = {
            name: (state[name].clone().to(dtype) if name in state else torch.full((size,), fill, dtype=dtype))
            for name, (dtype, fill) in _TABLES.items()
        }

