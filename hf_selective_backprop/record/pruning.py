"""The subset of a dataset a record chooses: the next run trains on it (``--sb_subset_from``)."""

from __future__ import annotations

import logging

import numpy
import torch

from ..data.noise import stream_generator
from ..selectors.class_budget import class_budget_choice, class_labels_refusal
from ..selectors.coverage import coverage_choice
from .checks import check_choice, check_columns, check_has_rows, check_keep, check_unique_ids
from .scores import PRUNE_SCORES, keep_order, prune_column

logger = logging.getLogger(__name__)
#: Stream key of the subset's draw (its random subset and the ties of a score).
_SUBSET_STREAM = 0x737562736574  # "subset"
#: The fewest examples a subset may keep: a batch of one fails in training (BatchNorm needs two values a channel).
MIN_SUBSET = 2


def check_prune_settings(keep: float, by: str) -> None:
    check_keep(keep)
    check_choice(by, PRUNE_SCORES, "by (--sb_subset_by)")


def check_varies(scores: numpy.ndarray, by: str) -> None:
    """Refuse a score that orders nothing: NaN or one value for every example, whose 'highest' would be the ties'
    random draw, a random subset under another name."""
    known = scores[~numpy.isnan(scores)]
    if known.size and known.min() < known.max():
        return
    column = prune_column(by)[0]
    value = "NaN (never measured)" if not known.size else f"{known[0].item():g}"
    raise ValueError(
        f"by (--sb_subset_by) {by!r}: the record's {column!r} is {value} for every example, so the subset it keeps "
        "would be a random one: choose a score that varies (e.g. --sb_subset_by mean_loss), or record more epochs "
        "(one scoring per example leaves variability and forgetting_events at 0)"
    )


def kept_ids(record, dataset_ids: numpy.ndarray, keep: float, by: str, seed: int, id_column: str,
             labels: numpy.ndarray | None = None) -> numpy.ndarray:
    """The ids of ``dataset_ids`` to train on: ``round(keep * len)`` of them, those with the highest ``by`` in
    ``record`` (a `datasets.Dataset` keyed by ``id_column``); ids the record never saw rank last (``by="coverage"``
    and ``"class_budget"`` keep them first, as they keep examples the first epoch did not score). ``labels``: the
    class of each of ``dataset_ids`` (`dataset_labels`), which ``by="class_budget"`` needs."""
    check_prune_settings(keep, by)
    if by == "class_budget" and (labels is None or len(labels) != len(dataset_ids)):
        raise ValueError("by='class_budget' budgets the subset by class: give labels, the class of each of the "
                         f"{len(dataset_ids)} training examples (got {'none' if labels is None else len(labels)})")
    if id_column not in record.column_names:
        raise ValueError(
            f"the record has no {id_column!r} column (its columns: {record.column_names}): it keys examples by "
            f"another id column; pass that name with --sb_index_column"
        )
    check_has_rows(len(record), "the record")
    count = _subset_size(keep, len(dataset_ids))
    # Not the bare seed: --label_noise draws randperm(N) from it, and a random subset drawn alike kept every flipped
    # label whenever the two seeds were equal (a random 80 % of 20 % noise held 25 % flipped labels).
    generator = stream_generator(_SUBSET_STREAM, seed)
    if by == "random":
        order = torch.randperm(len(dataset_ids), generator=generator).numpy()
        return numpy.sort(dataset_ids[order[:count]])
    scores = torch.from_numpy(_scores_of(record, dataset_ids, by, id_column))
    if by == "coverage":
        return numpy.sort(dataset_ids[coverage_choice(scores, count, generator).numpy()])
    if by == "class_budget":
        chosen = class_budget_choice(scores, torch.from_numpy(labels), count, generator)
        return numpy.sort(dataset_ids[chosen.numpy()])
    order = keep_order(scores, generator).numpy()
    return numpy.sort(dataset_ids[order[:count]])


def _scores_of(record, dataset_ids: numpy.ndarray, by: str, id_column: str) -> numpy.ndarray:
    """Each of ``dataset_ids``' ``by`` score in ``record``, signed so that the kept are the highest; NaN where the
    record never saw it."""
    column, sign = prune_column(by)
    check_columns(record.column_names, [column], "the record", f"by (--sb_subset_by) {by!r} reads")
    record_ids = numpy.asarray(record[id_column], dtype=numpy.int64)
    check_unique_ids(record_ids, id_column, "the record")
    record_scores = sign * numpy.asarray(record[column], dtype=float)
    by_id = numpy.argsort(record_ids)
    slot = by_id[numpy.searchsorted(record_ids, dataset_ids, sorter=by_id).clip(max=len(record_ids) - 1)]
    found = record_ids[slot] == dataset_ids
    unseen = int((~found).sum())
    if unseen == len(dataset_ids):
        raise ValueError(
            f"none of the training set's {id_column!r} ids is in the record: it was written for another dataset "
            "(or another id column)"
        )
    scores = numpy.where(found, record_scores[slot], numpy.nan)
    check_varies(scores, by)
    if unseen:
        logger.warning(f"{unseen} of {len(dataset_ids)} training examples are not in the record: they rank last")
    return scores


def _subset_size(keep: float, size: int) -> int:
    count = round(keep * size)
    if count < MIN_SUBSET:
        raise ValueError(f"keep (--sb_subset_keep) {keep} keeps {count} of {size} examples: a subset needs at least "
                         f"{MIN_SUBSET} (a training batch of one fails in BatchNorm); keep a larger share")
    return count


#: Where a training set's class labels are looked for, after the trainer's own label names.
LABEL_COLUMNS = ("labels", "label")


def dataset_labels(dataset, label_names=(), flag: str = "--sb_subset_by class_budget") -> numpy.ndarray:
    """Each row's class label (int64, in row order) from a map-style training set: a `datasets.Dataset`'s label
    column (``label_names`` first, then labels, label), an image dataset's label tensor, else each row's dict
    read once. Refused, naming ``flag``, where they are not one integer class per row (token-level labels)."""
    from datasets import Dataset as HFDataset

    from ..data.datasets import ImageTensorDataset
    from ..engine.indexing import IndexedDataset, _column_values

    names = [*(label_names or ()), *(name for name in LABEL_COLUMNS if name not in (label_names or ()))]
    while isinstance(dataset, IndexedDataset):
        dataset = dataset.dataset
    if isinstance(dataset, HFDataset):
        column = next((name for name in names if name in dataset.column_names), None)
        if column is None:
            raise ValueError(f"{flag} needs each training example's class label: the training set has none of the "
                             f"columns {names} (its columns: {dataset.column_names})")
        try:
            values = numpy.asarray(_column_values(dataset, column))
        except Exception as error:  # a ragged column (a label per token) has no one array
            raise ValueError(class_labels_refusal(flag, f"a {column!r} column that is not one value per row "
                                                        f"({type(error).__name__})")) from error
    elif isinstance(dataset, ImageTensorDataset):
        values = dataset.labels.cpu().numpy()
    else:
        rows = (dataset[position] for position in range(len(dataset)))
        values = []
        for row in rows:
            column = next((name for name in names if isinstance(row, dict) and name in row), None)
            if column is None:
                raise ValueError(f"{flag} needs each training example's class label: the training rows hold none "
                                 f"of {names}")
            value = row[column]
            values.append(value.tolist() if torch.is_tensor(value) else value)
        values = numpy.asarray(values) if values else numpy.zeros(0, numpy.int64)
    if values.ndim != 1 or values.dtype.kind not in "iu":
        raise ValueError(class_labels_refusal(flag, f"labels of dtype {values.dtype} and shape {values.shape}"))
    return values.astype(numpy.int64)
