"""Stable example ids: the column that keys the loss store and every decision made before loading."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping

import numpy
import torch
from datasets import Dataset as HFDataset
from torch.utils.data import Dataset, IterableDataset

logger = logging.getLogger(__name__)


class IndexedDataset(Dataset):
    """Adds a stable id (the position) to each example of a map-style dataset of dicts."""

    def __init__(self, dataset, column: str):
        self.dataset, self.column = dataset, column

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, position: int) -> dict:
        return {**self.dataset[position], self.column: position}


#: Ids may run this many times past the number of rows (gaps from filtering) before the id-indexed tables
#: (12 bytes a slot) are refused as wasteful; any span up to MIN_ID_SPAN is allowed.
MAX_ID_SPAN_PER_ROW, MIN_ID_SPAN = 64, 1 << 24
#: The id column's default name (``--sb_index_column``): numbering rows under it is the ordinary case.
DEFAULT_COLUMN = "index"
#: Id columns datasets carry of their own (GLUE's ``idx``, many datasets' ``id``), used in the default's place.
OWN_ID_COLUMNS = ("idx", "id")


def with_index_column(dataset, column: str):
    """``dataset`` with an id column: the one it has, else the position (0..N-1), said in the log (a warning
    when the column was named on purpose: a typo would otherwise replace a real id column by row numbers)."""
    if isinstance(dataset, IterableDataset):
        return dataset
    column_names = getattr(dataset, "column_names", None)
    if column_names is not None:
        if column in column_names:
            return dataset
        own = _own_id_column(dataset) if column == DEFAULT_COLUMN else None
        if own is not None:
            logger.info(f"keying the training examples by the dataset's own {own!r} column (copied as {column!r}; "
                        f"--sb_index_column {own} keys by it directly)")
            return dataset.add_column(column, _column_values(dataset, own).tolist())
        say = logger.info if column == DEFAULT_COLUMN else logger.warning
        say(f"--sb_index_column {column!r} is not a column of the training dataset (its columns: {column_names}): "
            f"numbering its {len(dataset)} rows 0..{len(dataset) - 1} under that name as the example ids")
        return dataset.add_column(column, list(range(len(dataset))))
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


def _own_id_column(dataset: HFDataset) -> str | None:
    """The first of `OWN_ID_COLUMNS` the dataset has, if its values can key examples: a record keyed by the rows'
    positions would join another shuffle or selection of the same data to the wrong rows."""
    for name in OWN_ID_COLUMNS:
        if name in dataset.column_names:
            try:
                ids_by_position(dataset, name)  # the checks an id column gets: integers, unique, non-negative, dense
            except (ValueError, TypeError) as why:
                logger.warning(f"the training dataset's own {name!r} column cannot key its examples ({why}): "
                               f"numbering its rows 0..{len(dataset) - 1} instead")
                return None
            return name
    return None


def unnamed_rows(dataset) -> str | None:
    """Why ``dataset``'s rows cannot carry an id column (rows that are tuples or tensors, not mappings of column
    names to values), or None. Read from its first row, as `with_index_column` would."""
    if dataset is None or isinstance(dataset, HFDataset | IterableDataset) or _own_ids(dataset) is not None:
        return None
    if not hasattr(dataset, "__len__") or len(dataset) == 0:
        return None
    row = dataset[0]
    if isinstance(row, Mapping):
        return None
    return (f"the training dataset's rows are {type(row).__name__}s, not mappings of column names to values, so "
            "they have no column to carry each example's id in; return a dict per row to give them one")


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
    check_id_values(ids, column)
    unique = numpy.unique(ids)
    if unique.size != ids.size:
        raise ValueError(
            f"--sb_index_column {column!r} holds {ids.size - unique.size} duplicate ids: the loss store and the "
            "decisions made before loading key examples by id, so every example needs its own (remove the "
            "column to number rows 0..N-1)"
        )
    return torch.from_numpy(ids.astype(numpy.int64))


def check_id_values(ids: numpy.ndarray, column: str) -> None:
    """Refuse ids the id-indexed tables cannot hold, naming the column and the first offending row: not one
    integer per row, negative, or so large that a table indexed by them would waste gigabytes."""
    if ids.size == 0:
        return  # an empty dataset is refused, by name, where the training loader is built
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(
            f"--sb_index_column {column!r} must hold one non-negative integer id per example, got dtype "
            f"{ids.dtype} and shape {ids.shape}"
        )
    if ids.size and ids.min() < 0:
        row = int(numpy.argmax(ids < 0))
        raise ValueError(
            f"--sb_index_column {column!r} holds {int(ids[row])} at row {row}: ids must be non-negative integers "
            "(remove the column to number rows 0..N-1)"
        )
    if ids.size and int(ids.max()) + 1 > max(MAX_ID_SPAN_PER_ROW * ids.size, MIN_ID_SPAN):
        row = int(numpy.argmax(ids))
        raise ValueError(
            f"--sb_index_column {column!r} holds {int(ids[row])} at row {row}: the loss store and the epoch's plan "
            f"are indexed by id, so ids up to it would take {12 * (int(ids[row]) + 1) / 2**30:.1f} GiB per process "
            f"for {ids.size} examples; renumber the ids densely (or remove the column to number rows 0..N-1)"
        )


def check_ids_where_cheap(dataset, column: str) -> None:
    """`ids_by_position`'s checks (duplicates, negatives, non-integers, ids far past the dataset's size), by row,
    where the ids can be read without loading rows: a `datasets.Dataset`'s column, a dataset's ``example_ids()``.
    What keys a record by id checks so before the first step, as selection does."""
    if isinstance(dataset, HFDataset | IndexedDataset) or _own_ids(dataset) is not None:
        ids_by_position(dataset, column)


def check_column_ids(dataset, column: str) -> None:
    """`check_id_values` on a `datasets.Dataset`'s id column (read from Arrow: fast); other datasets are
    checked where their ids are read."""
    if isinstance(dataset, HFDataset) and column in dataset.column_names:
        check_id_values(_column_values(dataset, column), column)


def _column_values(dataset: HFDataset, column: str) -> numpy.ndarray:
    """A datasets.Dataset column as a NumPy array, fast: the Arrow column, then the row mapping that
    select/shuffle/filter leave (reading through the dataset's formatting takes minutes for 1M rows)."""
    values = dataset.data.column(column).to_numpy()
    mapping = getattr(dataset, "_indices", None)
    return values if mapping is None else values[mapping.column(0).to_numpy()]


def refuse_index_column_the_model_reads(model, column: str, label_names) -> None:
    """The ids go under ``--sb_index_column`` and never reach the model: a label column there would train on
    row numbers (``label`` becomes the ``labels`` the model trains on), a required input would be missing. An
    optional input (``index=None``) may share the name."""
    labels = {*(label_names or []), "label", "label_ids", "labels"}
    try:
        parameter = inspect.signature(model.forward).parameters.get(column)
    except (TypeError, ValueError):
        parameter = None
    required = parameter is not None and parameter.default is inspect.Parameter.empty and parameter.kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    if column in labels or required:
        what = "a label column" if column in labels else f"a required input of {type(model).__name__}"
        raise ValueError(
            f"--sb_index_column {column!r} names {what}: the example ids need a column of their own, which the "
            "model never receives; pass another name, e.g. --sb_index_column index"
        )


def prepare_training_dataset(dataset, model, args, label_names):
    """The training dataset with its id column (refused where the model would read it), bad ids named now, by row."""
    refuse_index_column_the_model_reads(model, args.sb_index_column, label_names)
    dataset = with_index_column(dataset, args.sb_index_column)
    check_column_ids(dataset, args.sb_index_column)
    return dataset
