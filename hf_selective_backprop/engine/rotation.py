"""Checkpoint rotation (``save_total_limit``) that deletes only the checkpoints the run wrote itself.

transformers' Trainer rotates every ``checkpoint-*`` folder it finds in ``output_dir``: with
``save_total_limit`` it deletes a previous run's checkpoints, or a folder of the user's that happens
to be named ``checkpoint-5``, with everything inside. `SelectiveBackpropTrainer` turns that rotation
off and rotates among the checkpoints of its own run instead. Which those are is recorded in each
checkpoint's ``trainer_state.json`` (by an `ExportableState` callback, where the Trainer keeps
``EarlyStoppingCallback``'s state), so a resumed run also rotates those of the run it continues.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .. import _compat
from .checkpoints import partial_target


class RunCheckpoints(TrainerCallback, ExportableState):
    """The steps at which this run (and the runs it resumed) saved a checkpoint that still exists."""

    def __init__(self):
        self.steps: list[int] = []

    def state(self) -> dict:
        return {"args": {}, "attributes": {"steps": list(self.steps)}}


def record_of(trainer) -> RunCheckpoints:
    # Looked up each time: with restore_callback_states_from_checkpoint the Trainer replaces the instance.
    return next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, RunCheckpoints))


def folder(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")


def restore(record: RunCheckpoints, trainer_state, checkpoint: str | None, run_dir: str) -> None:
    """Take over the record of the run that ``checkpoint`` continues, if it ran in ``run_dir`` (an older
    checkpoint has none, and the steps of a run in another folder name folders there, not here: then only
    the new saves count)."""
    saved = trainer_state.stateful_callbacks.get(RunCheckpoints.__name__) or {}
    same_folder = checkpoint is not None and _same_path(os.path.dirname(os.path.normpath(checkpoint)), run_dir)
    record.steps = list(saved.get("attributes", {}).get("steps", [])) if same_folder else []
    # The Trainer indexes this entry when it saves; a checkpoint without it would fail there.
    trainer_state.stateful_callbacks[RunCheckpoints.__name__] = record.state()


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def add(record: RunCheckpoints, run_dir: str, step: int) -> None:
    """Record the checkpoint about to be saved, forgetting recorded ones that no longer exist.

    A folder of that name that is already there and not recorded (a user's ``checkpoint-5``) stays
    unrecorded, since rotation must not delete what else is inside, unless it holds nothing but files
    the run's checkpoints hold: what a save cut short by a kill or a full disk left, now saved again.
    """
    recorded = [s for s in record.steps if s != step and os.path.isdir(folder(run_dir, s))]
    path = folder(run_dir, step)
    if (step in record.steps or not os.path.exists(path)
            or (recorded and _holds_only_checkpoint_files(path, folder(run_dir, recorded[-1])))):
        record.steps = recorded + [step]
    else:
        record.steps = recorded


#: The model's weights under any of the names the Trainer saves them by: whole or sharded, safetensors or torch,
#: with their index. A checkpoint resumed from may hold them under other names than this run's saves (one
#: converted to shards), and a folder this run saved is recorded all the same.
WEIGHT_FILE = re.compile(r"(model|pytorch_model|adapter_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?")


def _holds_only_checkpoint_files(path: str, own_checkpoint: str) -> bool:
    names = set(os.listdir(own_checkpoint))
    return all(name in names or partial_target(name) in names or WEIGHT_FILE.fullmatch(name)
               for name in os.listdir(path))


def rotate(record: RunCheckpoints, run_dir: str, limit: int | None, protected: list[str | None]) -> None:
    """Delete the run's oldest checkpoints beyond ``limit``, never one of ``protected`` (the newest, the best)."""
    if limit is None or limit <= 0:
        return
    own = [s for s in sorted(set(record.steps)) if os.path.isdir(folder(run_dir, s))]
    kept = {os.path.abspath(path) for path in protected if path is not None}
    surplus = len(own) - max(limit, len([s for s in own if os.path.abspath(folder(run_dir, s)) in kept]))
    for step in own:
        if surplus <= 0:
            break
        if os.path.abspath(folder(run_dir, step)) not in kept:
            shutil.rmtree(folder(run_dir, step), ignore_errors=True)
            surplus -= 1
    record.steps = [s for s in own if os.path.isdir(folder(run_dir, s))]


def save_rotating(trainer, trial, save: Callable[[], None]) -> None:
    """``save()`` this step's checkpoint with the Trainer's own rotation off, then rotate among the run's own."""
    record, run_dir, step = record_of(trainer), _compat.output_dir(trainer, trial), trainer.state.global_step
    add(record, run_dir, step)
    if trainer.accelerator.num_processes > 1:
        # Every rank writes into the folder: the main one must see it as it was before the save.
        trainer.accelerator.wait_for_everyone()
    with _compat.save_total_limit_hidden(trainer.args):
        save()
    if trainer.args.should_save:
        protected = [folder(run_dir, step), trainer.state.best_model_checkpoint]
        rotate(record, run_dir, trainer.args.save_total_limit, protected)


def best_model_loaded(trainer) -> None:
    """After the Trainer loads the best model: with save_total_limit 1 it goes on to delete every checkpoint-*
    folder but the best; delete only this run's, and hide the limit from it until `train_ended`."""
    if trainer.args.should_save and trainer.args.save_total_limit == 1:
        best = trainer.state.best_model_checkpoint
        rotate(record_of(trainer), os.path.dirname(best), 1, [best])
        _compat.hide_save_total_limit(trainer)


def train_ended(trainer) -> None:
    _compat.restore_save_total_limit(trainer)
