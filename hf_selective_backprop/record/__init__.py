"""The example record: what every training example did in a run, and what it is good for.

``SelectiveBackpropTrainer`` writes ``example_record.parquet`` into its output folder (``--sb_record``, on by
default), one row per training example keyed by the dataset's own id column; ``push_to_hub`` uploads it with the
model. This module reads it back and answers the three questions it is for::

    from hf_selective_backprop import record

    table = record.load_record("outputs/run")            # or a Hub repository id
    record.data_map(table, "data_map.png")                # confidence against variability, regions named
    suspects = record.label_issues(table)                 # likeliest mislabeled examples first
    subset = record.prune(train_dataset, table, keep=0.7, by="mean_loss")  # the next run's training set
"""

from __future__ import annotations

import datasets
import numpy

from .files import DATA_MAP_FILE, RECORD_FILE, load_record, record_dataset
from .pruning import dataset_labels, kept_ids
from .scores import AMBIGUOUS, EASY, HARD, LABEL_ISSUE_RANKINGS, PRUNE_SCORES, label_issue_order
from .table import ExampleRecord

__all__ = [
    "AMBIGUOUS", "DATA_MAP_FILE", "EASY", "HARD", "LABEL_ISSUE_RANKINGS", "PRUNE_SCORES", "RECORD_FILE",
    "ExampleRecord", "data_map", "label_issues", "load_record", "prune", "record_dataset",
]


def data_map(table: datasets.Dataset, path: str, title: str | None = None) -> dict[str, int]:
    """Draw the record's data map into ``path`` (PNG; needs matplotlib); returns the examples in each region."""
    from .figure import draw_data_map

    return draw_data_map(table, path, title)


def label_issues(table: datasets.Dataset, top: int | None = None, by: str = "last_loss") -> datasets.Dataset:
    """The record's rows ranked from likeliest label issue, with their rank in ``label_issue_rank``: the ``top``
    first, or (``top=None``) those of the hard-to-learn region. ``by``: one of `LABEL_ISSUE_RANKINGS`; the last
    loss ranked flipped labels above the mean confidence in every measured run (docs/benchmarks/benchmarks.md)."""
    import torch

    if by not in LABEL_ISSUE_RANKINGS:
        raise ValueError(f"by must be one of {', '.join(LABEL_ISSUE_RANKINGS)}, got {by!r}")
    needed = {"confidence", "variability"} if by == "confidence" else {by}
    missing = sorted(needed - set(table.column_names))
    if missing:
        raise ValueError(f"by={by!r} reads the record's {missing} column, which this record lacks (it was written "
                         "by an earlier version of hf-selective-backprop): rank it by another of "
                         f"{', '.join(name for name in LABEL_ISSUE_RANKINGS if name != by)}")
    if by == "aum" and numpy.isnan(numpy.asarray(table["aum"], dtype=float)).all():
        raise ValueError("by='aum' needs margins, and this record has none: its run's loss was not single-label "
                         "classification (or a custom per_example_loss_func)")
    columns = {name: torch.tensor(numpy.asarray(table[name], dtype=float)) for name in needed}
    order = label_issue_order(columns, by).numpy()
    ranked = table.select(order).add_column("label_issue_rank", list(range(len(order))))
    if top is not None:
        return ranked.select(range(min(top, len(ranked))))
    return ranked.filter(lambda region: region == HARD, input_columns="region")


def prune(dataset: datasets.Dataset, table: datasets.Dataset, keep: float, by: str = "mean_loss", seed: int = 0,
          id_column: str = "index", label_column: str | None = None) -> datasets.Dataset:
    """The rows of ``dataset`` a next run trains on: the share ``keep`` with the highest ``by`` in the record
    (`PRUNE_SCORES` says what each keeps; ``"random"`` is the control of the same size). ``by="class_budget"``
    reads each row's class from ``label_column`` (default: labels, else label)."""
    if id_column not in dataset.column_names:
        raise ValueError(f"the dataset has no {id_column!r} column to join the record on (its columns: "
                         f"{dataset.column_names})")
    ids = numpy.asarray(dataset[id_column], dtype=numpy.int64)
    labels = None
    if by == "class_budget":
        labels = dataset_labels(dataset, [label_column] if label_column else (), "prune(by='class_budget')")
    chosen = numpy.isin(ids, kept_ids(table, ids, keep, by, seed, id_column, labels))
    return dataset.select(numpy.flatnonzero(chosen))
