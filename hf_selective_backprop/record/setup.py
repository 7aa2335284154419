"""What a trainer sets up to keep an example record (``--sb_record``) and to train on the subset an earlier run's
record chooses (``--sb_subset_from``): ids on the training rows, the collator keeping them, the callback."""

from __future__ import annotations

import contextlib
import logging

import numpy
import torch
from datasets import Dataset as HFDataset
from torch.utils.data import IterableDataset, Subset

from ..engine.indexing import (
    check_ids_where_cheap,
    ids_by_position,
    keeping_ids,
    refuse_index_column_the_model_reads,
    unnamed_rows,
    with_index_column,
)
from ..engine.packing import swapped
from .files import load_record, record_metadata, set_aside_previous
from .fingerprint import check_same_data
from .keeper import RecordCallback
from .pruning import check_varies, dataset_labels, kept_ids
from .scores import prune_column

logger = logging.getLogger(__name__)


def subset_record(args):
    """The record ``--sb_subset_from`` names, read and checked before any data is prepared (None without it)."""
    source = getattr(args, "sb_subset_from", None)
    if source is None:
        return None
    try:
        record = load_record(source)
    except Exception as error:  # a missing file, an unreachable Hub, a file that is not a table: all name the flag
        raise ValueError(f"--sb_subset_from {source!r}: no example record could be read ({error})") from error
    needed = [args.sb_index_column] + ([] if args.sb_subset_by == "random" else [prune_column(args.sb_subset_by)[0]])
    missing = [column for column in needed if column not in record.column_names]
    if missing:
        raise ValueError(
            f"--sb_subset_from {source!r}: the record has no {missing} column(s) (its columns: "
            f"{record.column_names}); --sb_index_column must be the id column it was written with"
        )
    if args.sb_subset_by != "random":
        check_varies(numpy.asarray(record[needed[1]], dtype=float), args.sb_subset_by)
    return record


def prepare(trainer, record) -> bool:
    """Give the training set ids and cut it to ``record``'s subset (if given); returns whether the trainer keeps
    a record of its own, for which it adds the callback and, without selection, lets the ids through."""
    args, column = trainer.args, trainer.args.sb_index_column
    keeps = bool(args.sb_record) and trainer._can_record()
    dataset = trainer.train_dataset
    unnamed = unnamed_rows(dataset)
    if keeps and unnamed is not None:
        logger.warning(f"the example record is off: {unnamed}")
        keeps = False
    if keeps and trainer.selector is None:
        keeps = _model_leaves_ids(trainer, column)
    if dataset is not None and (keeps or record is not None):
        dataset = with_index_column(dataset, column)
        if keeps:  # the record keys its rows by these ids: two examples under one id would merge into one row
            if trainer.selector is not None:  # a column the model reads is refused first, by what it is
                refuse_index_column_the_model_reads(trainer.model, column, trainer.label_names)
            check_ids_where_cheap(dataset, column)
        if record is not None:
            dataset = _subset(dataset, record, args, trainer.label_names)
        trainer.train_dataset = dataset
    if not keeps:
        return False
    trainer.add_callback(RecordCallback(trainer))
    return True


def write(trainer, folder: str) -> None:
    """The run's record, data map and metadata into ``folder``; where this run wrote none, a record left there by
    something else is set aside, so that neither the card nor an upload takes it for this run's."""
    written = None
    if trainer.record_keeper is not None:
        written = trainer.record_keeper.write(folder, trainer.args.should_save)
    if written is None and trainer.args.should_save:
        set_aside_previous(folder)


def ids_kept(trainer):
    """While a run without selection builds its training loader: the collator keeps the id column (the selective
    path's loader keeps it already). Only then: the collator itself, whose random state a checkpoint saves, stays."""
    if not trainer._records or trainer.selector is not None:
        return contextlib.nullcontext()
    return swapped(trainer, "data_collator", keeping_ids(trainer.data_collator, trainer.args.sb_index_column))


def _model_leaves_ids(trainer, column: str) -> bool:
    """Without selection a model input or label may be named like the id column: the plain run keeps it, unrecorded."""
    try:
        refuse_index_column_the_model_reads(trainer.model, column, trainer.label_names)
    except ValueError as error:
        logger.warning(f"the example record is off: {error}")
        return False
    return True


def _subset(dataset, record, args, label_names=()):
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise ValueError("--sb_subset_from keeps a share of a map-style training set: a stream has no size to share")
    ids = ids_by_position(dataset, args.sb_index_column).numpy()
    check_same_data(record_metadata(record).get("data"), dataset, ids, f"--sb_subset_from {args.sb_subset_from!r}")
    labels = dataset_labels(dataset, label_names) if args.sb_subset_by == "class_budget" else None
    keep = kept_ids(record, ids, args.sb_subset_keep, args.sb_subset_by, args.seed, args.sb_index_column, labels)
    positions = numpy.flatnonzero(numpy.isin(ids, keep))
    logger.info(f"--sb_subset_from: training on {len(positions):,} of {len(ids):,} examples "
                f"({args.sb_subset_by}, keep {args.sb_subset_keep})")
    if isinstance(dataset, HFDataset):
        return dataset.select(positions)
    return Subset(dataset, torch.from_numpy(positions).tolist())
