"""Stable example ids: the column that keys the loss store and every decision made before loading."""

from __future__ import annotations

from collections.abc import Mapping

import numpy
import torch
from datasets import Dataset as HFDataset
from torch.utils.data import Dataset, IterableDataset


class IndexedDataset(Dataset):
    """Adds a stable id (the position) to each example of a map-style dataset of dicts."""

    def __init__(self, dataset, column: str):
        self.dataset, self.column = dataset, column

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, position: int) -> dict:
        return {**self.dataset[position], self.column: position}


def with_index_column(dataset, column: str):
    """``dataset`` with an id column: the one it has, else the position (0..N-1)."""
    if isinstance(dataset, IterableDataset):
        return dataset
    column_names = getattr(dataset, "column_names", None)
    if column_names is not None:
        return dataset if column in column_names else dataset.add_column(column, list(range(len(dataset))))
    if _own_ids(dataset) is not None:
        given = getattr(dataset, "index_column", column)  # where an ImageTensorDataset puts its ids
        if given != column:
            raise ValueError(
                f"--sb_index_column {column!r}: the training dataset gives its ids under {given!r}; pass "
                f"--sb_index_column {given} (or build the dataset with index_column={column!r})"
            )
        return dataset
    if len(dataset) and isinstance(dataset[0], dict) and column in dataset[0]:
        return dataset
    return IndexedDataset(dataset, column)


def keeping_ids(collate_fn, column: str):
    """``collate_fn`` that keeps the id column of dict examples where it drops unknown keys (as TRL's
    language-modelling collator does): selection needs each row's id."""

    def collate(features):
        batch = collate_fn(features)
        if column not in batch and features and isinstance(features[0], Mapping) and column in features[0]:
            batch[column] = torch.tensor([int(feature[column]) for feature in features])
        return batch

    return collate


def _own_ids(dataset) -> torch.Tensor | None:
    """Ids a dataset can give without loading rows (its ``example_ids()``), if it has that method."""
    return dataset.example_ids() if hasattr(dataset, "example_ids") else None


def ids_by_position(dataset, column: str) -> torch.Tensor | None:
    """The id of each row, in row order (None for a stream), checked to be unique non-negative integers.

    A `datasets.Dataset` is read from its Arrow column; a torch dataset from its ``example_ids()``
    if it has one (they must be the values of ``column``), else row by row, once.
    """
    if isinstance(dataset, IterableDataset):
        return None
    if isinstance(dataset, IndexedDataset):
        return torch.arange(len(dataset))
    if isinstance(dataset, HFDataset):
        ids = _column_values(dataset, column)
    elif _own_ids(dataset) is not None:
        ids = _own_ids(dataset).numpy()
    else:
        ids = numpy.asarray([int(dataset[position][column]) for position in range(len(dataset))])
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or (ids.size and ids.min() < 0):
        raise ValueError(
            f"--sb_index_column {column!r} must hold one non-negative integer id per example, got dtype "
            f"{ids.dtype} and shape {ids.shape}"
        )
    unique = numpy.unique(ids)
    if unique.size != ids.size:
        raise ValueError(
            f"--sb_index_column {column!r} holds {ids.size - unique.size} duplicate ids: the loss store and the "
            "decisions made before loading key examples by id, so every example needs its own (remove the "
            "column to number rows 0..N-1)"
        )
    return torch.from_numpy(ids.astype(numpy.int64))


def _column_values(dataset: HFDataset, column: str) -> numpy.ndarray:
    """A datasets.Dataset column as a NumPy array, fast: the Arrow column, then the row mapping that
    select/shuffle/filter leave (reading through the dataset's formatting takes minutes for 1M rows)."""
    values = dataset.data.column(column).to_numpy()
    mapping = getattr(dataset, "_indices", None)
    return values if mapping is None else values[mapping.column(0).to_numpy()]
