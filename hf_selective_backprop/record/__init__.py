"""The example record: what every training example did in a run, and what it is good for.

``SelectiveBackpropTrainer`` writes ``example_record.parquet`` into its output folder (``--sb_record``, on by
default), one row per training example keyed by the dataset's own id column; ``push_to_hub`` uploads it with the
model. This module reads it back and answers the three questions it is for::

    from hf_selective_backprop import record

    table = record.load_record("outputs/run")            # or a Hub repository id
    record.data_map(table, "data_map.png")                # confidence against variability, regions named
    suspects = record.label_issues(table)                 # the labels that look wrong, likeliest first
    subset = record.prune(train_dataset, table, keep=0.7, by="mean_loss")  # the next run's training set
"""

from __future__ import annotations

import os

import datasets
import numpy

from .checks import check_choice, check_columns, check_top, require_type
from .confident_joint import estimated_label_issues, first_of_each_class
from .files import DATA_MAP_FILE, RECORD_FILE, as_record, load_record, record_dataset, record_metadata
from .fingerprint import check_same_data
from .labels import LABEL_COLUMN
from .pruning import check_prune_settings, dataset_labels, kept_ids
from .scores import (
    AMBIGUOUS,
    EASY,
    HARD,
    LABEL_ISSUE_RANKINGS,
    PRUNE_SCORES,
    label_issue_flags,
    label_issue_order,
)
from .table import ExampleRecord

__all__ = [
    "AMBIGUOUS", "DATA_MAP_FILE", "EASY", "HARD", "LABEL_ISSUE_RANKINGS", "PRUNE_SCORES", "RECORD_FILE",
    "ExampleRecord", "data_map", "label_issues", "load_record", "prune", "record_dataset",
]


def data_map(table: datasets.Dataset | str, path: str | os.PathLike, title: str | None = None,
             classes: int | None = None) -> dict[str, int]:
    """Draw the record's data map into ``path`` (PNG; needs matplotlib); returns the examples in each region.
    ``table``: the record, or where `load_record` reads it; ``classes``: the model's class count, which says what
    chance is (by default the one the trainer wrote into the record)."""
    from .figure import draw_data_map

    table = as_record(table)
    require_type(path, str | os.PathLike, "path", "where to write the figure (a .png or .pdf path)")
    require_type(title, str | type(None), "title", "None or a string")
    require_type(classes, int | type(None), "classes", "None or the model's number of classes")
    check_columns(table.column_names, ("confidence", "variability", "correctness", "region"), "table",
                  "the data map draws")
    if classes is None:
        classes = record_metadata(table).get("classes")
    return draw_data_map(table, os.fspath(path), title, classes)


def label_issues(table: datasets.Dataset | str, top: int | None = None, by: str = "last_loss") -> datasets.Dataset:
    """The rows flagged as likely label issues, likeliest first by ``by``, their rank in ``label_issue_rank``
    (0, 1, ...).

    Which rows: in a record that holds each example's class label (its ``label`` column; the trainer writes it for
    a classifier whose labels it can read), as many of each class as confident learning's count estimates from the
    record (`confident_joint.estimated_label_issues`), the likeliest of that class by ``by``; in one without, the
    rows whose ``by`` says the model did not learn them (`scores.label_issue_flags`: p(gold) under 1/2 at the last
    scoring, by the mean loss or by the mean confidence; a negative aum). Either way ``by`` picks the rows, not
    only their order. ``top=K``: the first K rows of ``by``'s ranking instead (unscored rows last). ``by``: one of
    `LABEL_ISSUE_RANKINGS` (docs/record.md compares them). ``table``: the record, or where `load_record` reads
    it."""
    table = as_record(table)
    check_top(top)
    check_choice(by, LABEL_ISSUE_RANKINGS, "by")
    columns = _ranking_columns(table, by)
    order = label_issue_order(columns, by).numpy()
    if top is not None:
        chosen = order[:top]
    elif LABEL_COLUMN in table.column_names and "confidence" in table.column_names:
        labels = numpy.asarray(table[LABEL_COLUMN], dtype=numpy.int64)
        confidence = numpy.asarray(table["confidence"], dtype=float)
        quota = estimated_label_issues(confidence, labels, _likeliest_other(table, confidence, labels))
        scored = ~numpy.isnan(numpy.asarray(table[by], dtype=float))
        chosen = first_of_each_class(order, labels, quota, scored)
    else:
        chosen = order[: int(label_issue_flags(columns, by).sum())]
    return table.select(chosen).add_column("label_issue_rank", list(range(len(chosen))))


def _likeliest_other(table: datasets.Dataset, confidence: numpy.ndarray, labels: numpy.ndarray) -> numpy.ndarray | None:
    """Each example's p of its likeliest other class, for more than two classes: p(gold) x exp(-margin) from its
    mean confidence and area under the margin (the margin is the log-ratio of the two at each scoring), at most
    1 - p(gold); None (1 - p(gold), exact) for two classes or a record without margins."""
    if len(numpy.unique(labels[labels >= 0])) <= 2 or "aum" not in table.column_names:
        return None
    aum = numpy.asarray(table["aum"], dtype=float)
    return numpy.where(numpy.isnan(aum), 1 - confidence, numpy.minimum(confidence * numpy.exp(-aum), 1 - confidence))


def _ranking_columns(table: datasets.Dataset, by: str) -> dict:
    import torch

    needed = ("confidence", "variability") if by == "confidence" else (by,)
    missing = [name for name in needed if name not in table.column_names]
    if missing:
        raise ValueError(f"by={by!r} reads the record's {missing} column, which this record lacks (it was written "
                         "by an earlier version of hf-selective-backprop): rank it by another of "
                         f"{', '.join(name for name in LABEL_ISSUE_RANKINGS if name != by)}")
    columns = {name: torch.tensor(numpy.asarray(table[name], dtype=float)) for name in needed}
    if by == "aum" and bool(columns["aum"].isnan().all()):
        raise ValueError("by='aum' needs margins, and this record has none: its run's loss was not single-label "
                         "classification (or a custom per_example_loss_func)")
    return columns


def prune(dataset: datasets.Dataset, table: datasets.Dataset | str, keep: float, by: str = "mean_loss",
          seed: int = 0, id_column: str = "index", label_column: str | None = None) -> datasets.Dataset:
    """The rows of ``dataset`` a next run trains on: the share ``keep`` with the highest ``by`` in the record
    ``table`` (or where `load_record` reads it); `PRUNE_SCORES` says what each keeps, ``"random"`` is the control
    of the same size; ``by="class_budget"`` reads each row's class from ``label_column`` (default: labels, else
    label). Refused: a record written on other data (its fingerprint), a score that does not vary, a subset of
    fewer than 2 examples."""
    require_type(dataset, datasets.Dataset, "dataset", "the training set as a datasets.Dataset")
    table = as_record(table)
    check_prune_settings(keep, by)
    require_type(seed, int | numpy.integer, "seed", "an integer")
    require_type(id_column, str, "id_column", "the name of the id column both tables hold, a string")
    if id_column not in dataset.column_names:
        raise ValueError(f"the dataset has no {id_column!r} column to join the record on (its columns: "
                         f"{dataset.column_names})")
    ids = numpy.asarray(dataset[id_column], dtype=numpy.int64)
    check_same_data(record_metadata(table).get("data"), dataset, ids, "record.prune(dataset, table)")
    labels = None
    if by == "class_budget":
        labels = dataset_labels(dataset, [label_column] if label_column else (), "prune(by='class_budget')")
    chosen = numpy.isin(ids, kept_ids(table, ids, keep, by, seed, id_column, labels))
    return dataset.select(numpy.flatnonzero(chosen))
