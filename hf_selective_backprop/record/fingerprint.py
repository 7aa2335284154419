"""The fingerprint of the data a record was written on, kept in its parquet file's metadata: the label (for a
language model's data, the tokens) of evenly spaced examples, by id.

Ids join a record to a dataset, and ids by position (no id column) match any dataset of the same size, or the same
dataset with its rows moved: the record's scores then land on other examples without a word. A record used on a
dataset (``--sb_subset_from``, `record.prune`) compares the sampled examples the dataset shares with it, so a subset
or a superset of the data passes and another dataset, or moved rows, does not. Labels are read where that costs no
loading of rows (a `datasets.Dataset`'s column, a dataset's ``labels`` tensor): reading a torch dataset's rows may
augment them and draw from its random state.
"""

from __future__ import annotations

import hashlib
import logging

import numpy
import torch
from datasets import Dataset as HFDataset
from torch.utils.data import IterableDataset, Subset

from ..engine.indexing import IndexedDataset

logger = logging.getLogger(__name__)

#: Examples sampled, evenly spaced over the training set: with 10 classes, another dataset passes all 64 with
#: probability 10^-64; with 2, 2^-64.
EXAMPLES_SAMPLED = 64
#: Where an example's label is, in the order looked for; ``input_ids``: a language model's data, labelled by itself.
LABEL_COLUMNS = ("labels", "label", "label_ids", "input_ids")


def data_fingerprint(dataset, id_column: str) -> dict | None:
    """``{"column", "examples", "labels": {id: digest}}`` for the training ``dataset``; None where its ids or
    labels cannot be read without loading rows (a stream, a torch dataset without a ``labels`` tensor)."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or len(dataset) == 0:
        return None
    positions = numpy.unique(numpy.linspace(0, len(dataset) - 1, min(len(dataset), EXAMPLES_SAMPLED)).round())
    positions = positions.astype(numpy.int64).tolist()
    ids = ids_at(dataset, id_column, positions)
    labelled = labels_at(dataset, positions, LABEL_COLUMNS)
    if ids is None or labelled is None:
        return None
    column, labels = labelled
    return {"column": column, "examples": len(dataset),
            "labels": {str(int(i)): _digest(label) for i, label in zip(ids, labels, strict=True)}}


def check_same_data(saved: dict | None, dataset, ids: numpy.ndarray, where: str) -> None:
    """Refuse ``dataset`` (its ids by position: ``ids``) where it holds other labels than the data the record was
    written on (``saved``, its `data_fingerprint`) under the same ids; warn where that cannot be checked."""
    if saved is None:
        logger.warning(f"{where}: the record holds no fingerprint of the data it was written on (an earlier version "
                       "wrote it, or that data's labels could not be read without loading its rows), so it is not "
                       "checked against this dataset: use it only on the data it was written on, with the same ids")
        return
    sampled = {int(i): digest for i, digest in saved["labels"].items()}
    positions = numpy.flatnonzero(numpy.isin(ids, numpy.fromiter(sampled, dtype=numpy.int64)))
    labelled = labels_at(dataset, positions.tolist(), (saved["column"],)) if positions.size else None
    if labelled is None:
        reason = ("shares none of the examples it samples" if not positions.size
                  else f"has no {saved['column']!r} column that can be read without loading its rows")
        logger.warning(f"{where}: the record's fingerprint of its data cannot be checked here: this dataset {reason}")
        return
    differ = [int(ids[p]) for p, label in zip(positions, labelled[1], strict=True)
              if _digest(label) != sampled[int(ids[p])]]
    if differ:
        raise ValueError(_mismatch(saved, len(ids), differ, positions.size, where))


def _mismatch(saved: dict, size: int, differ: list[int], compared: int, where: str) -> str:
    return (f"{where}: the record was written on other data: {len(differ)} of the {compared} examples its "
            f"fingerprint samples hold another {saved['column']!r} here (ids {differ[:5]}); it was written on "
            f"{saved['examples']:,} examples, this dataset has {size:,}. Another dataset, or the same with its rows "
            "moved while the ids are positions: use the data the record was written on, with the ids it was "
            "written with (its id column, --sb_index_column)")


def _digest(value) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def ids_at(dataset, id_column: str, positions: list[int]) -> list[int] | None:
    """The ids of ``dataset``'s rows at ``positions``, where they can be read without loading rows; else None."""
    if isinstance(dataset, HFDataset):
        if id_column not in dataset.column_names:
            return None
        return dataset.with_format("arrow")[positions].column(id_column).to_pylist()
    if isinstance(dataset, Subset):
        return ids_at(dataset.dataset, id_column, [int(dataset.indices[p]) for p in positions])
    if isinstance(dataset, IndexedDataset):
        return positions
    own = dataset.example_ids() if hasattr(dataset, "example_ids") else None
    return own[positions].tolist() if own is not None else None


def labels_at(dataset, positions: list[int], columns) -> tuple[str, list] | None:
    """The first of ``columns`` ``dataset`` holds, and its values at ``positions``, as stored (no transform)."""
    if isinstance(dataset, HFDataset):
        column = next((name for name in columns if name in dataset.column_names), None)
        if column is None:
            return None
        return column, dataset.with_format("arrow")[positions].column(column).to_pylist()
    if isinstance(dataset, Subset):
        return labels_at(dataset.dataset, [int(dataset.indices[p]) for p in positions], columns)
    if isinstance(dataset, IndexedDataset):
        return labels_at(dataset.dataset, positions, columns)
    labels = getattr(dataset, "labels", None)
    if "labels" in columns and isinstance(labels, torch.Tensor):  # an ImageTensorDataset's rows carry "labels"
        return "labels", labels[positions].tolist()
    return None
