"""What a selective trainer adds to the Trainer's checkpoints and reads back at a resume: the engine's state (a plain
run's data state), the record's part and the run's own checkpoint rotation."""

from __future__ import annotations

from functools import partial

from . import _compat
from .engine import rotation, state_files
from .engine.data_state import load_plain, save_plain


def save(trainer, model, trial, save_trainer_files) -> None:
    """This run's files of a checkpoint, then the Trainer's (``save_trainer_files``): the Trainer's
    trainer_state.json, written last, marks the checkpoint complete."""
    folder = rotation.folder(_compat.output_dir(trainer, trial), trainer.state.global_step)
    if trainer.selector is None:
        save_plain(trainer, folder)
        if trainer.record_keeper is not None:
            trainer.record_keeper.save(folder, trainer.args.should_save)
        save_trainer_files()
        return
    save_all = partial(state_files.save_before_trainer, trainer, model, folder, save_trainer_files)
    # The Trainer's rotation would delete every checkpoint-* folder of output_dir, a previous run's or a
    # user's included: rotate among this run's own instead (hf_selective_backprop.engine.rotation).
    rotation.save_rotating(trainer, trial, save_all)


def resume(trainer, checkpoint: str | None, epochs_trained: int, skipped: int) -> tuple[int, int]:
    """This run's state back from ``checkpoint`` (None: a fresh run), once the Trainer has read its own; returns the
    epochs trained and the batches the Trainer's loop skips."""
    trainer._logged_loss.start(trainer.state.global_step)
    if trainer.record_keeper is not None and checkpoint is not None:
        trainer.record_keeper.load(checkpoint)
    if trainer.selector is None:
        load_plain(trainer, checkpoint)
        return epochs_trained, skipped
    rotation.restore(rotation.record_of(trainer), trainer.state, checkpoint, trainer.args.output_dir)
    if checkpoint is None:
        return epochs_trained, skipped
    state_files.load(trainer.engine, checkpoint, trainer.args.ignore_data_skip)
    # The Trainer skips batches by steps, which selection breaks: the engine's sampler skips the rows read instead.
    return trainer.engine.epoch, 0
