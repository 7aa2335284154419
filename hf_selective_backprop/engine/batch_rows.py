"""A batch as selection sees it: a dict of tensors holding one row per example, kept or dropped by rows."""

from __future__ import annotations

import torch

#: The column that carries a kept row's loss weight from the engine to ``compute_loss``.
WEIGHT_KEY = "sb_weight"


def check_rows(batch: dict) -> None:
    """Every entry of a batch must hold one row per example: selection keeps and regroups rows."""
    sizes = {key: value.shape[0] if torch.is_tensor(value) and value.dim() > 0 else None
             for key, value in batch.items()}
    rows = next((size for size in sizes.values() if size is not None), None)
    for key, size in sizes.items():
        if size is None or size != rows:
            shape = tuple(batch[key].shape) if torch.is_tensor(batch[key]) else type(batch[key]).__name__
            raise ValueError(
                f"the batch entry {key!r} ({shape}) is not one row per example (the batch has {rows} rows): "
                "selection keeps or drops single rows, so it cannot split this entry. Packed or padding-free "
                "batches (TRL's packing=True / padding_free=True, DataCollatorWithFlattening) hold several "
                "examples in one row: pad the examples instead, or train with --sb_strategy none"
            )


def take_rows(batch: dict, rows: torch.Tensor) -> dict:
    return {key: value[rows] for key, value in batch.items()}


def batch_length(batch: dict) -> int:
    return next(iter(batch.values())).shape[0]


def batch_device(batch: dict) -> torch.device:
    return next(iter(batch.values())).device
