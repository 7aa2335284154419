"""The record as a file: a parquet table beside the model (``example_record.parquet``), read back from a path, a
folder or a Hub repository with `load_record`."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

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


@contextlib.contextmanager
def written_in_place_of(path: str):
    """A new temporary file beside ``path`` to write, then moved over it (os.replace): a link at ``path`` is replaced,
    never followed (it may point at a user's file outside the folder), and a failed write leaves ``path`` as it
    was. The temporary name is fresh (mkstemp), so no link can wait there either."""
    folder = os.path.dirname(os.path.abspath(path))
    descriptor, partial_path = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".partial")
    os.close(descriptor)
    try:
        yield partial_path
        os.replace(partial_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial_path)
        raise


def write_record(record: ExampleRecord, path: str, id_column: str) -> datasets.Dataset:
    """Write the record's table to ``path`` (parquet) and its data map beside it, when matplotlib is installed."""
    table = record_dataset(record, id_column)
    # Losses are floats that rarely repeat: a dictionary of their values only grows the file, and zstd packs them
    # tighter than snappy, which a record of millions of examples on the Hub feels. pyarrow writes it, as
    # `Dataset.to_parquet` fixes both per column in recent `datasets`; the table, fresh from `from_dict`, has no
    # indices mapping, and its schema carries the features `load_dataset` reads back.
    with written_in_place_of(path) as partial_path:  # never a truncated table in place of a finished run's
        pyarrow.parquet.write_table(table.data.table, partial_path, compression="zstd", use_dictionary=["region"])
    try:
        from .figure import draw_data_map
    except ImportError:
        logger.info("matplotlib is not installed: the data map is not drawn (pip install matplotlib)")
    else:
        draw_data_map(table, os.path.join(os.path.dirname(path), DATA_MAP_FILE))
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
