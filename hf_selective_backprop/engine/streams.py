"""Streams (``datasets.load_dataset(..., streaming=True)``, or any torch ``IterableDataset``) under selection.

A stream has no positions: nothing can be planned before loading it, and a resumed epoch reads its
consumed batches again. Strategies that key examples by id (Stale-SB, InfoBatch, RHO-LOSS) work on a
stream whose rows carry the id column (``--sb_index_column``):

- the loss store grows as ids arrive (`LossStore`: 12 bytes a slot up to the largest id, 1.5x that at most);
- a Stale-SB epoch reads the stream and looks each row's stored loss up instead of scoring it;
- InfoBatch decides each loaded batch's rows from their stored losses and the mean of the store at the
  epoch's start (`Selector.plan_rows`), the rule its epoch plan applies by position;
- RHO-LOSS's reference model scores one pass of the stream before training (or a column gives the losses).

On several processes a stream split with ``datasets.distributed.split_dataset_by_node`` is each rank's own
share: it is read as it is, not split again by Accelerate (which would keep a share of the share) and not
dispatched from the main process. An epoch ends, on every rank, when the first rank's share runs out.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.data import IterableDataset

from ..default_strategy import CannotSelect, is_default
from ..selectors import EarlyPruneSelector, Selector
from . import distributed
from .indexing import MAX_ID_SPAN_PER_ROW, MIN_ID_SPAN


def is_stream(dataset) -> bool:
    return isinstance(dataset, IterableDataset)


def id_needs(args, selector: Selector, stream: bool) -> str | None:
    """The flag that makes this run look examples up by id, or None (plain selection needs no ids). On a stream
    a strategy that only plans epochs by position (uniform) decides per batch, without ids."""
    if args.sb_staleness > 1:
        return f"--sb_staleness {args.sb_staleness}"
    planned = type(selector).plan_epoch is not Selector.plan_epoch and not stream
    if selector.uses_stored_losses or selector.uses_reference_losses or planned:
        return f"--sb_strategy {args.sb_strategy}"
    return None


def missing_ids_message(column: str, columns, needs: str, where: str = "the training batches") -> str:
    return (
        f"--sb_index_column {column!r} is not in {where}, which hold {', '.join(columns)}: {needs} "
        "looks examples up by it. Name the column of the training data that holds the ids, or leave the "
        "default to number the rows 0..N-1 (a map-style dataset only: a stream must carry its ids, e.g. "
        "add them before streaming it); a dataset or collator of your own must pass the column through"
    )


def check_training_data(args, selector: Selector, dataset) -> None:
    """What a run can check of its training data at construction, before any time is spent."""
    if not is_stream(dataset):
        return
    if isinstance(selector, EarlyPruneSelector):
        raise CannotSelect(
            f"--sb_strategy {args.sb_strategy} trains a fixed share of a map-style training set's examples from its "
            "second epoch on: a stream has no positions to keep; use a map-style dataset, or --sb_strategy infobatch"
        )
    needs = id_needs(args, selector, stream=True)
    columns = getattr(dataset, "column_names", None)  # None where the stream's features are not known
    if needs is not None and columns is not None and args.sb_index_column not in columns:
        raise CannotSelect(missing_ids_message(args.sb_index_column, columns, needs, "the training stream's columns"))
    if needs is not None and columns is None and is_default(args):
        # A chosen strategy finds out at the first batch, with a clear error; the default may not stop a run there
        # that Trainer would train, and the first batch is too late to step aside.
        raise CannotSelect(
            f"the training stream ({type(dataset).__name__}) does not say its columns before it is read, so whether "
            f"its rows carry the id column {args.sb_index_column!r}, which --sb_strategy {args.sb_strategy} keys "
            "examples by, cannot be checked before training; name the strategy with --sb_strategy to select on it"
        )
    split = getattr(dataset, "_distributed", None)  # datasets.distributed.split_dataset_by_node's
    if split is not None and (split.rank, split.world_size) != (args.process_index, args.world_size):
        raise ValueError(
            f"the training stream was split for rank {split.rank} of {split.world_size} processes "
            f"(split_dataset_by_node), but this is rank {args.process_index} of {args.world_size}: split it with "
            "rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD_SIZE'])"
        )


def is_own_share(accelerator, dataset) -> bool:
    """A stream this rank reads alone (split with split_dataset_by_node), on several processes."""
    return accelerator.num_processes > 1 and getattr(dataset, "_distributed", None) is not None


@contextlib.contextmanager
def own_share(accelerator, dataset):
    """Inside it, ``accelerator.prepare(loader)`` of a split stream's loader puts batches on the device and
    nothing else: no second split, no dispatch from the main process."""
    if not is_own_share(accelerator, dataset):
        yield
        return
    from accelerate.data_loader import prepare_data_loader

    def prepare(loader):
        prepared = prepare_data_loader(
            loader, accelerator.device, num_processes=1, process_index=0, put_on_device=True,
            dispatch_batches=False, non_blocking=accelerator.non_blocking,
        )
        accelerator._dataloaders.append(prepared)
        return prepared

    accelerator.prepare = prepare
    try:
        yield
    finally:
        del accelerator.prepare  # the class's method again


def check_id_bound(ids: torch.Tensor, rows_read: int, column: str) -> None:
    """A stream's ids size the store as they arrive: refuse one that would make it waste gigabytes."""
    if ids.numel() == 0:
        return
    largest = int(ids.max())
    if largest + 1 > max(MAX_ID_SPAN_PER_ROW * rows_read, MIN_ID_SPAN):
        raise ValueError(
            f"--sb_index_column {column!r} holds {largest} after {rows_read} rows of the stream: the loss store is "
            f"indexed by id, so ids up to it would take {12 * (largest + 1) / 2**30:.1f} GiB per process; "
            "renumber the ids densely (0..N-1)"
        )


#: Rows per Arrow batch when a pass reads only a stream's id and reference columns.
READ_BATCH = 4096


def column_pairs(dataset, column: str, index_column: str, accelerator) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, values) of ``column`` over one pass of a stream, reading only the two columns; a split stream's
    shares are gathered, so every rank holds every id's value, and a value missing from one rank's share
    stops every rank."""
    if not is_own_share(accelerator, dataset):
        return _read_pairs(dataset, column, index_column)
    failure = None
    try:
        ids, values = _read_pairs(dataset, column, index_column)
    except ValueError as error:  # carried by the gather: the other ranks would wait in it
        failure, ids, values = error, torch.empty(0, dtype=torch.int64), torch.empty(0)
    ids, values, _ = distributed.gather_pairs(accelerator, ids, values, failure)
    return ids, values


def _read_pairs(dataset, column: str, index_column: str) -> tuple[torch.Tensor, torch.Tensor]:
    for name in (column, index_column):
        columns = getattr(dataset, "column_names", None)
        if columns is not None and name not in columns:
            raise ValueError(f"{name!r} is not a column of the training stream; its columns: {columns}")
    if not hasattr(dataset, "select_columns"):
        raise ValueError(
            f"--sb_reference_column {column!r} needs a datasets stream (this one is {type(dataset).__name__}); "
            "pass --sb_reference_model instead"
        )
    ids, values = [], []
    # In Arrow batches, not row by row: the pass reads the whole stream.
    for batch in dataset.select_columns([index_column, column]).iter(batch_size=READ_BATCH):
        if None in batch[column]:
            # Named by its id: on every rank a split stream's error reaches, its position in one share means nothing.
            example = batch[index_column][batch[column].index(None)]
            raise ValueError(
                f"--sb_reference_column {column!r}: no value for the row whose {index_column!r} is {example}"
            )
        ids.append(torch.as_tensor(batch[index_column], dtype=torch.int64))
        values.append(torch.as_tensor(batch[column], dtype=torch.float32))
    ids = torch.cat(ids) if ids else torch.empty(0, dtype=torch.int64)
    values = torch.cat(values) if values else torch.empty(0)
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        examples = ids[bad][:5].tolist()
        raise ValueError(
            f"--sb_reference_column {column!r} holds NaN or inf for the rows whose {index_column!r} is {examples}; "
            "irreducible losses must be finite"
        )
    return ids, values
