"""`RecordFeed`: the events of one process, held on the device until a flush gathers every process's into the record.

An event is a batch's ids, losses, margins (NaN where the task defines none), kind and epoch. Buffering keeps the
training step free of host synchronisation: the host waits once per flush, not per batch.
Flushes happen at points every process reaches together (an epoch's end, every `FLUSH_EVERY_STEPS` optimizer steps,
a checkpoint, the end of training), so every process applies the same events in the same order and holds the same
record, and a resumed run, whose buffer starts empty at a checkpoint, flushes at the same points as the
uninterrupted one.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from ..engine.distributed import gather_rows
from .table import SCORED, TRAINED, ExampleRecord

#: Optimizer steps between flushes: bounds the buffer on long epochs (an id, a loss and a margin: 16 bytes an
#: example on the device).
FLUSH_EVERY_STEPS = 200


class RecordFeed:
    """This process's events since the last flush."""

    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator
        self._events: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int, int]] = []

    def __len__(self) -> int:
        return len(self._events)

    def scored(self, ids: torch.Tensor, losses: torch.Tensor, margins: torch.Tensor | None, epoch: int) -> None:
        """Losses (and margins, or None) of a selection forward."""
        self._add(ids, losses, margins, SCORED, epoch)

    def trained(self, ids: torch.Tensor, losses: torch.Tensor, margins: torch.Tensor | None, epoch: int) -> None:
        """Losses (and margins, or None) of a training forward, each followed by a backward pass."""
        self._add(ids, losses, margins, TRAINED, epoch)

    def _add(self, ids, losses, margins, kind: int, epoch: int) -> None:
        margins = margins.detach().reshape(-1) if margins is not None else None
        self._events.append((ids.detach().reshape(-1), losses.detach().reshape(-1), margins, kind, epoch))

    def flush(self, record: ExampleRecord) -> None:
        """Apply every process's buffered events to ``record`` (a collective: every process calls it)."""
        device = self.accelerator.device
        parts = [
            torch.stack([
                ids.to(device, torch.float64),  # exact below 2**53
                losses.to(device, torch.float64),
                torch.full_like(losses, kind, dtype=torch.float64, device=device),
                torch.full_like(losses, epoch, dtype=torch.float64, device=device),
                (margins.to(device, torch.float64) if margins is not None
                 else torch.full_like(losses, float("nan"), dtype=torch.float64, device=device)),
            ], dim=1)
            for ids, losses, margins, kind, epoch in self._events
        ]
        self._events = []
        rows = torch.cat(parts) if parts else torch.zeros((0, 5), dtype=torch.float64, device=device)
        rows, _ = gather_rows(self.accelerator, rows)
        record.apply(rows[:, 0].to(torch.int64), rows[:, 1], rows[:, 2].to(torch.int64), rows[:, 3].to(torch.int64),
                     rows[:, 4])


__all__ = ["FLUSH_EVERY_STEPS", "SCORED", "TRAINED", "RecordFeed"]
