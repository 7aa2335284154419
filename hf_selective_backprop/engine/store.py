"""Per-example loss store for Stale-SB: O(N) tensors indexed by the int64 example id."""

from __future__ import annotations

import torch


class LossStore:
    """Latest loss of every example and the epoch it was measured in.

    Unknown examples hold NaN and epoch -1. The tensors grow to the largest id seen, so ids
    with gaps cost one float and one int64 per slot, never a Python object per example.

    A map-style dataset's store is sized once, for its largest id (`SelectionEngine.attach`). A stream's
    grows as larger ids arrive: each tensor is a view of a buffer allocated with room to spare (1.5x
    the slots needed), so ids arriving in increasing order reallocate O(log N) times, not once per
    batch; at most 1.5 x 12 bytes per slot up to the largest id, and the old buffer beside the new
    one while it is copied.
    """

    GROWTH = 1.5

    def __init__(self, capacity: int = 0):
        self.losses = torch.full((capacity,), float("nan"), dtype=torch.float32)
        self.epochs = torch.full((capacity,), -1, dtype=torch.int64)

    def __len__(self) -> int:
        return self.losses.numel()

    def _grow(self, capacity: int) -> None:
        if capacity <= len(self):
            return
        # The spare slots of the buffer hold NaN / -1 already: extending the views is free.
        if self.losses.untyped_storage().nbytes() < capacity * self.losses.element_size():
            room = max(capacity, int(len(self) * self.GROWTH))
            losses = torch.full((room,), float("nan"), dtype=torch.float32)
            epochs = torch.full((room,), -1, dtype=torch.int64)
            losses[: len(self)], epochs[: len(self)] = self.losses, self.epochs
            self.losses, self.epochs = losses, epochs
        self.losses = self.losses.set_(self.losses.untyped_storage(), 0, (capacity,))
        self.epochs = self.epochs.set_(self.epochs.untyped_storage(), 0, (capacity,))

    def update(self, ids: torch.Tensor, losses: torch.Tensor, epoch: int) -> None:
        """Record losses for ids; non-finite losses are not stored (the old value stays)."""
        ids = ids.detach().reshape(-1).to("cpu", torch.int64)
        losses = losses.detach().reshape(-1).to("cpu", torch.float32)
        if ids.numel() != losses.numel():
            raise ValueError(f"{ids.numel()} ids for {losses.numel()} losses")
        if ids.numel() and int(ids.min()) < 0:
            raise ValueError("example ids must be non-negative")
        finite = torch.isfinite(losses)
        ids, losses = ids[finite], losses[finite]
        if ids.numel() == 0:
            return
        unique, inverse = torch.unique(ids, return_inverse=True)
        if unique.numel() != ids.numel():
            # An id twice in one update (e.g. a DistributedSampler's padding gathered from several ranks):
            # indexed assignment with repeated indices is undefined in PyTorch, so keep the last explicitly.
            positions = torch.arange(ids.numel())
            last = torch.full((unique.numel(),), -1, dtype=torch.int64).scatter_reduce(0, inverse, positions, "amax")
            ids, losses = ids[last], losses[last]
        self._grow(int(ids.max()) + 1)
        self.losses[ids] = losses
        self.epochs[ids] = epoch

    def lookup(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(losses, epochs) for ids; NaN / -1 where nothing is stored."""
        ids = ids.detach().reshape(-1).to("cpu", torch.int64)
        known = ids < len(self)
        losses = torch.full(ids.shape, float("nan"))
        epochs = torch.full(ids.shape, -1, dtype=torch.int64)
        losses[known] = self.losses[ids[known]]
        epochs[known] = self.epochs[ids[known]]
        return losses, epochs

    def state_dict(self) -> dict:
        return {"losses": self.losses.clone(), "epochs": self.epochs.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.losses = state["losses"].clone().to(torch.float32)
        self.epochs = state["epochs"].clone().to(torch.int64)


class LabelStore:
    """Each example's class label (int64, -1 where none is known), indexed by id: for strategies that budget by
    class (``Selector.uses_stored_labels``). A map-style dataset's is sized once, for its largest id; 8 bytes a
    slot."""

    def __init__(self, capacity: int = 0):
        self.labels = torch.full((capacity,), -1, dtype=torch.int64)

    def __len__(self) -> int:
        return self.labels.numel()

    def update(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        ids = ids.detach().reshape(-1).to("cpu", torch.int64)
        labels = labels.detach().reshape(-1).to("cpu", torch.int64)
        if ids.numel() != labels.numel():
            raise ValueError(f"{ids.numel()} ids for {labels.numel()} labels")
        if ids.numel() == 0:
            return
        if int(ids.max()) >= len(self):
            grown = torch.full((int(ids.max()) + 1,), -1, dtype=torch.int64)
            grown[: len(self)] = self.labels
            self.labels = grown
        self.labels[ids] = labels  # an id twice in one update carries its one label twice

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Labels for ids; -1 where none is stored."""
        ids = ids.detach().reshape(-1).to("cpu", torch.int64)
        known = ids < len(self)
        labels = torch.full(ids.shape, -1, dtype=torch.int64)
        labels[known] = self.labels[ids[known]]
        return labels

    def state_dict(self) -> dict:
        return {"labels": self.labels.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.labels = state["labels"].clone().to(torch.int64)
