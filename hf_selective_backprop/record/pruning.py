"""The subset of a dataset a record chooses: the next run trains on it (``--sb_subset_from``)."""

from __future__ import annotations

import logging

import numpy
import torch

from ..data.noise import stream_generator
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


def kept_ids(record, dataset_ids: numpy.ndarray, keep: float, by: str, seed: int, id_column: str) -> numpy.ndarray:
    """The ids of ``dataset_ids`` to train on: ``round(keep * len)`` of them, those with the highest ``by`` in
    ``record`` (a `datasets.Dataset` keyed by ``id_column``); ids the record never saw rank last (``by="coverage"``
    keeps them first, as it keeps examples the first epoch did not score)."""
    check_prune_settings(keep, by)
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
