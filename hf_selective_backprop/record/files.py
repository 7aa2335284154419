"""The record as a file: a parquet table beside the model (``example_record.parquet``), read back from a path, a
folder or a Hub repository with `load_record`."""

from __future__ import annotations

import contextlib
import logging
import os

import datasets
import pyarrow.parquet

from .scores import record_columns
from .table import ExampleRecord

logger = logging.getLogger(__name__)

#: The record's table in a training run's output folder (and so in its Hub repository).
RECORD_FILE = "example_record.parquet"
#: Its data map, drawn beside it.
DATA_MAP_FILE = "data_map.png"


def record_dataset(record: ExampleRecord, id_column: str = "id") -> datasets.Dataset:
    """The record as a `datasets.Dataset`, one row per example training saw, keyed by ``id_column``."""
    columns = {name: (value if isinstance(value, list) else value.numpy()) for name, value in
               record_columns(record).items()}
    columns[id_column] = columns.pop("id")
    return datasets.Dataset.from_dict({id_column: columns.pop(id_column), **columns})


def write_record(record: ExampleRecord, path: str, id_column: str) -> datasets.Dataset:
    """Write the record's table to ``path`` (parquet) and its data map beside it, when matplotlib is installed."""
    table = record_dataset(record, id_column)
    partial_path = f"{path}.partial"
    # Losses are floats that rarely repeat: a dictionary of their values only grows the file, and zstd packs them
    # tighter than snappy, which a record of millions of examples on the Hub feels. pyarrow writes it, as
    # `Dataset.to_parquet` fixes both per column in recent `datasets`; the table, fresh from `from_dict`, has no
    # indices mapping, and its schema carries the features `load_dataset` reads back.
    pyarrow.parquet.write_table(table.data.table, partial_path, compression="zstd", use_dictionary=["region"])
    os.replace(partial_path, path)  # never a truncated table in place of a finished run's
    try:
        from .figure import draw_data_map
    except ImportError:
        logger.info("matplotlib is not installed: the data map is not drawn (pip install matplotlib)")
    else:
        draw_data_map(table, os.path.join(os.path.dirname(path), DATA_MAP_FILE))
    return table


@contextlib.contextmanager
def _quiet_progress():
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bar()


def load_record(source: str, revision: str | None = None) -> datasets.Dataset:
    """A training run's record: a parquet file, a folder holding ``example_record.parquet`` (a run's output
    folder), or the id of a Hub repository the run was pushed to."""
    if os.path.isdir(source):
        path = os.path.join(source, RECORD_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{source} holds no {RECORD_FILE}: train with --sb_record (the default) to write one, or name the "
                "parquet file itself"
            )
    elif os.path.isfile(source):
        path = source
    elif os.path.exists(os.path.dirname(source) or ".") and source.endswith(".parquet"):
        raise FileNotFoundError(f"no record at {source}")
    else:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(source, RECORD_FILE, revision=revision)
    with _quiet_progress():
        return datasets.Dataset.from_parquet(path, keep_in_memory=True)
