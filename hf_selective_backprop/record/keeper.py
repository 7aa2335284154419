"""`RecordKeeper`: the trainer's example record, from the first event to the table written beside the model.

The trainer feeds it at the two places losses exist (a selection forward's, in the engine; a training forward's,
in ``compute_loss``); `RecordCallback` flushes it at points every process reaches together; checkpoints carry
its state (``sb_record.pt``) so that a resumed run ends with the record of an uninterrupted one.
"""

from __future__ import annotations

import functools
import logging
import math
import os

import torch
from transformers import TrainerCallback

from ..engine.checkpoints import atomic_save
from ..engine.indexing import ids_by_position
from .feed import FLUSH_EVERY_STEPS, RecordFeed
from .files import RECORD_FILE, write_record
from .fingerprint import check_same_data, data_fingerprint
from .labels import class_labels
from .table import ExampleRecord

logger = logging.getLogger(__name__)

#: The record's state in a checkpoint, written once (every process holds the same record).
RECORD_STATE_FILE = "sb_record.pt"


class RecordKeeper:
    """The record of one training run, its events not yet applied, and the epoch a run without selection is in."""

    def __init__(self, accelerator, id_column: str, dataset=None, classes: int | None = None):
        self.accelerator, self.id_column, self.dataset = accelerator, id_column, dataset
        self.record = ExampleRecord()
        self.feed = RecordFeed(accelerator)
        #: The epoch events of a run without a selection engine belong to (set at each epoch's start).
        self.epoch = 0
        #: False once the run resumed from a checkpoint that held no record: the record covers only what followed.
        self.complete = True
        #: Why this run's record stopped (None while it records): a by-product never stops the training.
        self.stopped: str | None = None
        #: A classifier's class count (None for other models): what chance is, for the data map.
        self.classes = classes

    def stop(self, reason: str) -> None:
        """Record nothing more in this run, and write nothing: said once."""
        if self.stopped is None:
            self.stopped = reason
            logger.warning(f"the example record is off for this run: {reason}")

    def scored(self, ids: torch.Tensor | None, losses: torch.Tensor, margins: torch.Tensor | None, epoch: int) -> None:
        """A selection forward's losses, and its margins where the task defines them (else None)."""
        if self.accepts(ids) and losses.numel():
            self.feed.scored(ids, losses, margins, epoch)

    def trained(self, ids: torch.Tensor, losses: torch.Tensor, margins: torch.Tensor | None, epoch: int) -> None:
        """A training forward's losses and margins (`accepts` said yes to its ids)."""
        if losses.numel():
            self.feed.trained(ids, losses, margins, epoch)

    def accepts(self, ids: torch.Tensor | None) -> bool:
        """Whether a batch with these ids can be recorded: a batch without (a stream without an id column) stops
        the record."""
        if ids is None:
            self.stop(f"the training batches carry no {self.id_column!r} column to key examples by: give the "
                      "stream an id column (--sb_index_column), or pass --sb_record False")
        return self.stopped is None

    def flush(self) -> None:
        """Apply every process's buffered events (a collective; every process stops at the same batch)."""
        if self.stopped is None:
            self.feed.flush(self.record)

    def state_dict(self) -> dict:
        return {"record": self.record.state_dict(), "complete": self.complete, "data": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        self.record.load_state_dict(state["record"])
        self.complete = bool(state["complete"])

    @functools.cached_property
    def fingerprint(self) -> dict | None:
        """The training data's `data_fingerprint` (None where it cannot be read without loading rows), read once:
        the data does not change within a run."""
        try:
            return data_fingerprint(self.dataset, self.id_column) if self.dataset is not None else None
        except Exception as error:  # a run's record outweighs its check: written without one, as an older record is
            logger.warning(f"the example record is written without a fingerprint of its data ({error!r}): a later "
                           "use of it on a dataset cannot check that it is the same data")
            return None

    def save(self, folder: str, should_save: bool) -> None:
        """Flush, then write the record's state into the checkpoint ``folder`` (every process calls this)."""
        self.flush()
        if should_save and self.stopped is None:
            os.makedirs(folder, exist_ok=True)
            atomic_save(self.state_dict(), os.path.join(folder, RECORD_STATE_FILE))

    def load(self, checkpoint: str) -> None:
        """Restore the record saved in ``checkpoint``; one saved without a record leaves it to cover the rest only."""
        path = os.path.join(checkpoint, RECORD_STATE_FILE)
        if not os.path.isfile(path):
            self._covers_only_what_follows(
                f"{checkpoint} holds no {RECORD_STATE_FILE} (it was saved with --sb_record False, by another trainer, "
                "or the file was removed)")
            return
        state = torch.load(path, weights_only=True)
        other_data = self._other_data(state.get("data"))
        if other_data is not None:
            self._covers_only_what_follows(f"{checkpoint}'s {RECORD_STATE_FILE} was written on other data "
                                           f"({other_data}), so it is not merged")
            return
        self.load_state_dict(state)

    def _other_data(self, saved: dict | None) -> str | None:
        """Why the record a checkpoint holds belongs to other data than this run's, or None (the same data, or
        either fingerprint unknown)."""
        if saved is None or self.fingerprint is None:
            return None
        try:
            check_same_data(saved, self.dataset, ids_by_position(self.dataset, self.id_column).numpy(),
                            RECORD_STATE_FILE)
        except ValueError as why:
            return str(why)
        return None

    def _covers_only_what_follows(self, why: str) -> None:
        self.complete = False
        logger.warning(f"{why}: the example record covers only the training that follows this resume, and its "
                       "file says so (complete: false in its metadata)")

    def _class_labels(self):
        """A classifier's examples' class labels for the table (`labels.class_labels`), or None."""
        if self.classes is None:
            return None
        try:
            return class_labels(self.dataset, self.id_column)
        except Exception as error:  # a by-product of a by-product: the table is written without them
            logger.warning(f"the example record is written without its examples' class labels ({error!r})")
            return None

    def write(self, output_dir: str, should_save: bool) -> str | None:
        """Flush, then write the record's table (and its data map) into ``output_dir``, with the fingerprint of the
        training data and whether the record covers the whole run; returns the table's path."""
        self.flush()
        if not should_save or self.stopped is not None:
            return None
        if self.record.seen.numel() == 0:
            logger.warning("the example record holds no example (no training batch carried ids): nothing written")
            return None
        path = os.path.join(output_dir, RECORD_FILE)
        try:
            write_record(self.record, path, self.id_column, self.fingerprint, complete=self.complete,
                         classes=self.classes, labels=self._class_labels())
        except OSError as error:  # a full disk, a read-only folder: the run and its model outrank the by-product
            logger.error(f"the example record could not be written to {path} ({error}); the training and the "
                         "model are unaffected")
            return None
        return path


class RecordCallback(TrainerCallback):
    """Sets the epoch of a run without a selection engine, and flushes the trainer's record at points every
    process shares."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        # A plain run's epoch: whole at an epoch's start, fractional in a run resumed mid-epoch.
        self.trainer.record_keeper.epoch = math.floor(state.epoch + 1e-6) if state.epoch else 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % FLUSH_EVERY_STEPS == 0:
            self.trainer.record_keeper.flush()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.trainer.record_keeper.flush()
