"""The subset of a dataset a record chooses: the next run trains on it (``--sb_subset_from``)."""

from __future__ import annotations

import logging

import numpy
import torch

from ..data.noise import stream_generator
from ..selectors.coverage import coverage_choice
from .scores import PRUNE_SCORES, keep_order, prune_column

logger = logging.getLogger(__name__)
#: Stream key of the subset's draw (its random subset and the ties of a score).
_SUBSET_STREAM = 0x737562736574  # "subset"


def check_prune_settings(keep: float, by: str) -> None:
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep (--sb_subset_keep) must be in (0, 1] (the share of the training set kept), got {keep}")
    if by not in PRUNE_SCORES:
        raise ValueError(f"by (--sb_subset_by) must be one of {', '.join(PRUNE_SCORES)}, got {by!r}")


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
    count = max(1, round(keep * len(dataset_ids)))
    # Not the bare seed: --label_noise draws randperm(N) from it, and a random subset drawn alike kept every flipped
    # label whenever the two seeds were equal (a random 80 % of 20 % noise held 25 % flipped labels).
    generator = stream_generator(_SUBSET_STREAM, seed)
    if by == "random":
        order = torch.randperm(len(dataset_ids), generator=generator).numpy()
        return numpy.sort(dataset_ids[order[:count]])
    record_ids = numpy.asarray(record[id_column], dtype=numpy.int64)
    column, sign = prune_column(by)
    record_scores = sign * numpy.asarray(record[column], dtype=float)
    by_id = numpy.argsort(record_ids)
    slot = numpy.searchsorted(record_ids, dataset_ids, sorter=by_id).clip(max=len(record_ids) - 1)
    found = record_ids[by_id[slot]] == dataset_ids if len(record_ids) else numpy.zeros(len(dataset_ids), bool)
    scores = numpy.where(found, record_scores[by_id[slot]] if len(record_ids) else numpy.nan, numpy.nan)
    unseen = int((~found).sum())
    if unseen == len(dataset_ids):
        raise ValueError(
            f"none of the training set's {id_column!r} ids is in the record: it was written for another dataset "
            "(or another id column)"
        )
    if unseen:
        logger.warning(f"{unseen} of {len(dataset_ids)} training examples are not in the record: they rank last")
    if by == "coverage":
        return numpy.sort(dataset_ids[coverage_choice(torch.from_numpy(scores), count, generator).numpy()])
    order = keep_order(torch.from_numpy(scores), generator).numpy()
    return numpy.sort(dataset_ids[order[:count]])
