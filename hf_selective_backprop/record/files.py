"""The record as a file: a parquet table beside the model (``example_record.parquet``), read back from a path, a
folder or a Hub repository with `load_record`."""

from __future__ import annotations

import contextlib
import json
import logging
import os

import datasets
import numpy
import pyarrow
import pyarrow.parquet

from ..engine.checkpoints import written_in_place_of
from .checks import check_columns, check_has_rows, check_unique_ids, require_type
from .labels import LABEL_COLUMN, labels_of
from .scores import ADDED_LATER, RECORD_COLUMNS, record_columns
from .table import ExampleRecord

logger = logging.getLogger(__name__)

#: The record's table in a training run's output folder (and so in its Hub repository).
RECORD_FILE = "example_record.parquet"
#: Its data map, drawn beside it.
DATA_MAP_FILE = "data_map.png"


#: The record's own entry in its parquet file's metadata: its id column and the fingerprint of the data it was
#: written on (`fingerprint.data_fingerprint`).
METADATA_KEY = "hf_selective_backprop"


def record_dataset(record: ExampleRecord, id_column: str = "id") -> datasets.Dataset:
    """The record as a `datasets.Dataset`, one row per example training saw, keyed by ``id_column``."""
    require_type(record, ExampleRecord, "record", "an ExampleRecord (a trainer's record_keeper.record)")
    require_type(id_column, str, "id_column", "the name of the id column, a string")
    columns = {name: (value if isinstance(value, list) else value.numpy()) for name, value in
               record_columns(record).items()}
    columns[id_column] = columns.pop("id")
    return datasets.Dataset.from_dict({id_column: columns.pop(id_column), **columns})


def write_record(record: ExampleRecord, path: str, id_column: str, data: dict | None = None,
                 complete: bool = True, classes: int | None = None,
                 labels: tuple[numpy.ndarray, numpy.ndarray] | None = None) -> datasets.Dataset:
    """Write the record's table to ``path`` (parquet), with ``data`` (the fingerprint of the data it was written
    on, or None), ``complete`` (False: it covers only the training after a resume that found no record to
    continue) and ``classes`` (a classifier's class count, or None) in its metadata, and its data map beside it,
    when matplotlib is installed. ``labels``: (ids, class labels) of the training examples (`labels.class_labels`),
    kept in the table's ``label`` column; None for none."""
    table = record_dataset(record, id_column)
    if labels is not None:
        table = table.add_column(LABEL_COLUMN, labels_of(numpy.asarray(table[id_column]), labels).tolist())
    from .. import __version__  # the package's, set before its submodules import

    metadata = {"version": __version__, "id_column": id_column, "data": data, "complete": complete, "classes": classes}
    _attach(table, metadata)
    arrow = table.data.table
    arrow = arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), METADATA_KEY: json.dumps(metadata)})
    # Losses are floats that rarely repeat: a dictionary of their values only grows the file, and zstd packs them
    # tighter than snappy, which a record of millions of examples on the Hub feels. pyarrow writes it, as
    # `Dataset.to_parquet` fixes both per column in recent `datasets`; the table, fresh from `from_dict`, has no
    # indices mapping, and its schema carries the features `load_dataset` reads back.
    with written_in_place_of(path) as partial_path:  # never a truncated table in place of a finished run's
        pyarrow.parquet.write_table(arrow, partial_path, compression="zstd", use_dictionary=["region"])
    try:
        from .figure import draw_data_map
    except ImportError:
        logger.info("matplotlib is not installed: the data map is not drawn (pip install matplotlib)")
    else:
        draw_data_map(table, os.path.join(os.path.dirname(path), DATA_MAP_FILE), classes=classes)
    return table


#: What a record and data map that this run did not write are renamed to: the Trainer's push_to_hub leaves names
#: starting with "_" out of the upload, and the model card reads only RECORD_FILE.
PREVIOUS_PREFIX = "_previous_"


def set_aside_previous(output_dir: str) -> list[str]:
    """Rename a record and data map left in ``output_dir`` by something else (an earlier run into the same folder, a
    copy) to ``_previous_<name>``, so that neither the card nor the upload describes them as this run's; returns
    the new paths. For a run that wrote no record of its own (--sb_record False, or no batch carried ids)."""
    moved = []
    for name in (RECORD_FILE, DATA_MAP_FILE):
        path = os.path.join(output_dir, name)
        if not os.path.lexists(path):
            continue
        target, count = os.path.join(output_dir, PREVIOUS_PREFIX + name), 1
        while os.path.lexists(target):  # an earlier set-aside stays as it is
            count += 1
            target = os.path.join(output_dir, f"{PREVIOUS_PREFIX}{count}_{name}")
        os.rename(path, target)
        moved.append(target)
    if moved:
        logger.warning("%s held a record this run did not write: renamed to %s, so that neither the model card nor "
                       "push_to_hub takes it for this run's", output_dir, ", ".join(moved))
    return moved


@contextlib.contextmanager
def _quiet_progress():
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bar()


def record_metadata(table: datasets.Dataset) -> dict:
    """The record's own metadata (`METADATA_KEY`): ``version`` (of hf-selective-backprop, which wrote it),
    ``id_column``, ``data`` (its data's fingerprint), ``complete`` and ``classes``; empty for a table that was not
    read by `load_record` (or was written by an earlier version)."""
    try:
        return dict(json.loads(table.info.description)[METADATA_KEY])
    except (ValueError, KeyError, TypeError):
        return {}


def _attach(table: datasets.Dataset, metadata: dict) -> None:
    # datasets keeps only its own entry of a parquet file's metadata; a table's info is carried through select,
    # filter and the like, so the record's entry rides there.
    table.info.description = json.dumps({METADATA_KEY: metadata})


def load_record(source: str | os.PathLike, revision: str | None = None) -> datasets.Dataset:
    """A training run's record: a parquet file, a folder holding ``example_record.parquet`` (a run's output
    folder), or the id of a Hub repository the run was pushed to. Refused, naming what is wrong: a path that does
    not exist, a file that is not a record (a column missing), a record of no row or of one id twice."""
    require_type(source, str | os.PathLike, "source", f"a path (a run's folder or its {RECORD_FILE}) or a Hub id")
    require_type(revision, str | type(None), "revision", "None or a Hub revision (a branch, tag or commit)")
    path, where = _record_path(os.fspath(source), revision)
    metadata = _checked_metadata(path, where)
    with _quiet_progress():
        table = datasets.Dataset.from_parquet(path, keep_in_memory=True)
    id_column = metadata["id_column"]
    check_unique_ids(table.data.column(id_column).to_numpy(), id_column, where)
    _attach(table, metadata)
    return table


def as_record(table, argument: str = "table") -> datasets.Dataset:
    """``table`` as a record with rows: a `datasets.Dataset` as it is, a path or Hub id read by `load_record`."""
    if isinstance(table, str | os.PathLike):
        return load_record(table)
    require_type(table, datasets.Dataset, argument, "the record as a datasets.Dataset (record.load_record reads one) "
                 f"or where to read it (a run's folder, its {RECORD_FILE}, a Hub id)")
    check_has_rows(len(table), argument)
    return table


def _record_path(source: str, revision: str | None) -> tuple[str, str]:
    """The local file of the record ``source`` names, and how to name it in a message."""
    local = os.path.expanduser(source)
    if os.path.isdir(local):
        path = os.path.join(local, RECORD_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{source} holds no {RECORD_FILE}: train with --sb_record (the default) to write one, or name the "
                "parquet file itself"
            )
        return path, path
    if os.path.isfile(local):
        return local, source
    if _looks_like_a_path(source):
        raise FileNotFoundError(f"{source} does not exist: a record is read from a run's output folder, its "
                                f"{RECORD_FILE}, or the Hub repository it was pushed to (owner/name)")
    return _downloaded(source, revision), f"the {RECORD_FILE} of the Hub repository {source}"


def _looks_like_a_path(source: str) -> bool:
    # Not "contains a separator": a Hub id is "owner/name". What no Hub id can be (a leading "." or "/", two
    # separators, a backslash) or what names a file is a path, and a missing path says so instead of reading as a
    # malformed repository id.
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        return True
    return source.endswith(".parquet")


def _downloaded(source: str, revision: str | None) -> str:
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(source, RECORD_FILE, revision=revision)
    except Exception as error:  # not found, offline, no access: each says which in its own words, kept below
        raise FileNotFoundError(f"{source} is no local file or folder, and no {RECORD_FILE} could be read from a Hub "
                                f"repository of that name ({type(error).__name__}: {error})") from error


def _checked_metadata(path: str, where: str) -> dict:
    """The record's metadata, with its ``id_column``, once its file is known to be a record with rows: checked before
    datasets reads it, whose own errors on a bad file name neither the file nor the cause."""
    try:
        schema, rows = pyarrow.parquet.read_schema(path), pyarrow.parquet.read_metadata(path).num_rows
    except (pyarrow.ArrowInvalid, OSError) as error:
        raise ValueError(f"{where} is not a parquet table, so not an example record ({error})") from error
    metadata = json.loads((schema.metadata or {}).get(METADATA_KEY.encode(), b"{}"))
    check_columns(schema.names, [name for name in RECORD_COLUMNS if name not in ADDED_LATER], where,
                  f"an example record holds ({RECORD_FILE}, as --sb_record writes it)")
    check_has_rows(rows, where)
    return {**metadata, "id_column": _id_column(schema.names, metadata, where)}


def _id_column(names: list[str], metadata: dict, where: str) -> str:
    # A record written before its metadata puts its id column first, and every other column is a RECORD_COLUMN.
    others = [name for name in names if name not in RECORD_COLUMNS]
    id_column = metadata.get("id_column") or (others[0] if others else None)
    if id_column not in names:
        raise ValueError(f"{where} has no id column (its columns: {names}): a record keys each row by the "
                         "training set's id column (--sb_index_column)")
    return id_column
