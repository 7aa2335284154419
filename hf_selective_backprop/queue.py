"""Rows in, full micro-batches out: Algorithm 1's backprop queue."""

from __future__ import annotations

import torch


class BatchQueue:
    """Holds selected rows (a dict of equal-length tensors) until a full batch is ready.

    Rows are kept as chunks and concatenated only when a batch is popped, so a selection
    batch costs one gather and no per-example work.
    """

    def __init__(self):
        self._chunks: list[dict[str, torch.Tensor]] = []
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def push(self, rows: dict[str, torch.Tensor]) -> None:
        lengths = {key: value.shape[0] for key, value in rows.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"rows of unequal length: {lengths}")
        n = next(iter(lengths.values()), 0)
        if n == 0:
            return
        if self._chunks and rows.keys() != self._chunks[0].keys():
            raise ValueError(f"columns {sorted(rows)} differ from queued {sorted(self._chunks[0])}")
        for key, value in rows.items():
            if self._chunks and value.shape[1:] != self._chunks[0][key].shape[1:]:
                raise ValueError(
                    f"column {key!r} has rows of shape {tuple(value.shape[1:])} here and "
                    f"{tuple(self._chunks[0][key].shape[1:])} in the queue: selection batches rows from several "
                    "selection batches together, so every batch must have the same shape per row (pad "
                    "variable-length inputs to a fixed length, e.g. padding='max_length')"
                )
        self._chunks.append(rows)
        self._rows += n

    def pop(self, n: int) -> dict[str, torch.Tensor]:
        """Exactly ``n`` rows, oldest first."""
        if n < 1 or n > self._rows:
            raise ValueError(f"cannot pop {n} rows from a queue of {self._rows}")
        taken, size = [], 0
        while size < n:
            chunk = self._chunks.pop(0)
            length = next(iter(chunk.values())).shape[0]
            need = n - size
            if length > need:
                taken.append({k: v[:need] for k, v in chunk.items()})
                self._chunks.insert(0, {k: v[need:] for k, v in chunk.items()})
                size += need
            else:
                taken.append(chunk)
                size += length
        self._rows -= n
        if len(taken) == 1:
            return taken[0]
        return {key: torch.cat([c[key] for c in taken]) for key in taken[0]}

    def clear(self) -> None:
        self._chunks, self._rows = [], 0

    def state_dict(self) -> dict:
        if not self._chunks:
            return {"rows": {}}
        merged = {k: torch.cat([c[k] for c in self._chunks]).cpu() for k in self._chunks[0]}
        return {"rows": merged}

    def load_state_dict(self, state: dict) -> None:
        self.clear()
        self.push(state["rows"])
