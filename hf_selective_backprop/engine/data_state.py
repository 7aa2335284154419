"""The data pipeline's random state (augmentation generators) in a checkpoint, as of the last batch read.

A map-style training dataset or a data collator takes part when it has ``state_dict()`` and
``load_state_dict(state)`` (`BatchTransform` and `ImageTensorDataset` have them: the augmentation
generator). Each process saves its own in ``sb_rank_state_{rank}.pt``. ``state_dict()`` must hold
tensors, numbers, strings and containers of them: checkpoints are read with ``weights_only=True``.

The loader reads ahead of training: Accelerate's ``DataLoaderShard`` loads batch k+1 before it hands
out batch k, so at a checkpoint the pipeline has already drawn for a batch that is not read yet, and
the resumed run loads that batch again (its sampler skips only the rows read). Saved as it is then,
the state would give that batch, and every later one, other draws than the uninterrupted run. So
`DataState` keeps the state from before each fetch until its batch is read, and a checkpoint holds
the state from before the first unread batch, how many batches to load again, and the state at
saving time (a collator may draw in between, e.g. for an evaluation): the resumed run loads the
unread batches from the first state, then continues from the state at saving time.

Exact only where this process runs the dataset and collator itself, once per batch it reads: not
with ``dataloader_num_workers > 0`` (they run in worker processes), a stream (re-read up to its
position on resume) or ``dispatch_batches`` (the main process loads every process's batches).
Resuming such a run warns that the pipeline's random state was not restored.

A run without selection (``sb_strategy="none"``) is the Trainer's loop, which reads ahead the same way: the
functions at the end track its loader with a `DataState` of its own and save it in ``sb_data_state_{rank}.pt``
(`PLAIN_STATE_FILE`), a file apart, since ``sb_rank_state_{rank}.pt`` marks a checkpoint with selection state.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections import deque
from functools import partial

import torch
from torch.utils.data import IterableDataset

from .checkpoints import atomic_save
from .indexing import IndexedDataset

NAMES = {"dataset": "the training dataset", "collator": "the data collator"}


def _is_stateful(obj) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def stateful_sources(dataset, collator) -> dict[str, object]:
    """The training dataset (map-style) and data collator that keep a state, by name."""
    if isinstance(dataset, IndexedDataset):  # the trainer's id column around the user's dataset
        dataset = dataset.dataset
    found = {}
    if not isinstance(dataset, IterableDataset) and _is_stateful(dataset):
        found["dataset"] = dataset
    if _is_stateful(collator) and collator is not dataset:
        found["collator"] = collator
    return found


class DataState:
    """Tracks the random state of ``sources`` batch by batch; ``unsaved_reason`` says why it cannot."""

    def __init__(self, sources: dict[str, object], unsaved_reason: str | None = None):
        self.sources = sources
        self.unsaved_reason = unsaved_reason if sources else None
        self._unread: deque[dict] = deque()  # state before each fetched batch not read yet
        self._before_fetch: dict | None = None
        self._refetch = 0  # after a resume: batches still to load again before ``_then`` applies
        self._then: dict | None = None

    @classmethod
    def for_training(cls, dataset, collator, num_workers: int, dispatch_batches: bool | None) -> DataState:
        sources = stateful_sources(dataset, collator)
        reason = None
        if num_workers > 0:
            reason = (
                f"dataloader_num_workers={num_workers} runs the dataset and collator in worker processes "
                "(with dataloader_num_workers=0 a resumed run is the uninterrupted one)"
            )
        elif isinstance(dataset, IterableDataset):
            reason = "a stream is read again up to its position when a run resumes"
        elif dispatch_batches:
            reason = "with dispatch_batches the main process loads the batches of every process"
        return cls(sources, reason)

    @property
    def tracked(self) -> bool:
        return bool(self.sources) and self.unsaved_reason is None

    def _snapshot(self) -> dict:
        # A copy: a state_dict may hand out live tensors that the next draw changes.
        return {name: copy.deepcopy(source.state_dict()) for name, source in self.sources.items()}

    def _load(self, state: dict) -> None:
        for name, source in self.sources.items():
            if name in state:
                source.load_state_dict(state[name])

    def wrap(self, collate_fn):
        """``collate_fn`` as the training loader calls it: each call is one fetched batch."""
        if not self.tracked:
            return collate_fn

        def collate(features):
            self._unread.append(self._before_fetch)
            batch = collate_fn(features)
            if self._refetch:
                self._refetch -= 1
                if not self._refetch:
                    self._load(self._then)
            self._before_fetch = self._snapshot()  # a second fetch in the same read starts here
            return batch

        return collate

    def next(self, iterator):
        """The iterator's next batch (None at its end), noting that it was read."""
        if not self.tracked:
            return next(iterator, None)
        self._before_fetch = self._snapshot()
        batch = next(iterator, None)
        if batch is not None:
            self._unread.popleft()
        return batch

    def state_dict(self) -> dict | None:
        if not self.tracked:
            return None
        now = self._snapshot()
        return {
            "sources": self._unread[0] if self._unread else now,
            # Saved right after a resume, before the batches to load again were loaded: still to do.
            "refetch": len(self._unread) + self._refetch,
            "then": self._then if self._refetch else now,
        }

    def load_state_dict(self, state: dict | None) -> None:
        if not self.sources:
            return
        names = " and ".join(NAMES[name] for name in self.sources)
        if not self.tracked:
            warnings.warn(
                f"The random state of {names} (augmentation) is not restored: {self.unsaved_reason}. The resumed "
                "run draws other augmentations than the uninterrupted run would; weights, optimizer and selection "
                "state are restored.",
                stacklevel=3,
            )
            return
        if state is None:
            warnings.warn(
                f"The checkpoint holds no random state of {names} (augmentation): it was saved with dataloader "
                "workers, a stream or dispatch_batches, or by an earlier version. The resumed run draws other "
                "augmentations than the uninterrupted run would.",
                stacklevel=3,
            )
            return
        missing = [NAMES[name] for name in self.sources if name not in state["sources"]]
        unused = [NAMES[name] for name in state["sources"] if name not in self.sources]
        if missing or unused:
            warnings.warn(
                "The checkpoint's data pipeline is not this run's: "
                + "; ".join(
                    [f"it holds no random state of {name}, which starts afresh" for name in missing]
                    + [f"it holds a random state of {name}, which this run lacks" for name in unused]
                ),
                stacklevel=3,
            )
        self._load(state["sources"])
        self._refetch = state["refetch"]
        self._then = state["then"] if self._refetch else None


# ---- a run without selection ---------------------------------------------------------------------------

#: Each process's data pipeline state in a checkpoint of a run without selection.
PLAIN_STATE_FILE = "sb_data_state_{rank}.pt"


def follow_plain_loader(trainer, loader):
    """``loader``, the Trainer's training loader of a run without selection, its batches tracked by a `DataState`
    (``trainer.plain_data_state``); returned as it is where nothing keeps a random state."""
    args = trainer.args
    data_state = DataState.for_training(
        trainer.train_dataset, trainer.data_collator, args.dataloader_num_workers,
        trainer.accelerator.dataloader_config.dispatch_batches,
    )
    trainer.plain_data_state = data_state if data_state.sources else None
    if data_state.tracked:
        # Accelerate's DataLoaderShard reads through the DataLoader it wraps, whose collate_fn its resumed-epoch
        # copy (skip_first_batches) takes over.
        base = getattr(loader, "base_dataloader", loader)
        base.collate_fn = data_state.wrap(base.collate_fn)
    return loader


def read_plain(trainer, iterator):
    """``iterator``, the Trainer's epoch iterator, noting each batch it hands out as read."""
    data_state = trainer.plain_data_state
    if data_state is None or not data_state.tracked:
        return iterator
    return iter(partial(data_state.next, iterator), None)


def save_plain(trainer, folder: str) -> None:
    """Write this process's pipeline state into the checkpoint ``folder``, before the Trainer's trainer_state.json
    marks it complete (every process calls this)."""
    state = trainer.plain_data_state.state_dict() if trainer.plain_data_state is not None else None
    if state is None:
        return
    os.makedirs(folder, exist_ok=True)
    atomic_save({"data": state}, os.path.join(folder, PLAIN_STATE_FILE.format(rank=trainer.args.process_index)))


def load_plain(trainer, checkpoint: str | None) -> None:
    """Restore this process's pipeline state from ``checkpoint`` (a warning where it holds none)."""
    if checkpoint is None or trainer.plain_data_state is None:
        return
    path = os.path.join(checkpoint, PLAIN_STATE_FILE.format(rank=trainer.args.process_index))
    state = torch.load(path, weights_only=True)["data"] if os.path.isfile(path) else None
    trainer.plain_data_state.load_state_dict(state)
