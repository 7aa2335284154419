"""Writing an engine's state (`SelectionEngine.state_dict`) into a Trainer checkpoint and reading it back, on the
same or another world size.

``sb_state.pt`` holds what every process shares (strategy, store, epoch plan and position, and the
run's signature: its selection settings and data, checked on resume), written once;
``sb_rank_state_{rank}.pt`` what each process owns (generator, queue, counters, strategy, the
random state of its data pipeline and, with several processes, its model's buffers).
"""

from __future__ import annotations

import os
import warnings

import torch

from . import run_signature
from .checkpoints import RANK_STATE_FILE, STATE_FILE, atomic_save, require_complete_checkpoint, require_resumable
from .engine import SelectionEngine


def resume_target(trainer, resume_from_checkpoint: str | bool | None):
    """The checkpoint ``trainer.train()`` resumes from, checked before anything trains. Selecting, ``True`` is the
    last *complete* checkpoint-N (transformers picks the highest, even one a killed run left half written), and a
    checkpoint of another model is refused before its weights are loaded; without selection, a selective run's
    checkpoint, or one of another budget or model, is refused (`run_signature.check_without_selection`)."""
    output_dir = trainer.args.output_dir
    if trainer.selector is None:
        checkpoint = run_signature.check_without_selection(resume_from_checkpoint, trainer.args)
        if checkpoint is not None:
            run_signature.check_model(checkpoint, trainer.accelerator.unwrap_model(trainer.model))
        return resume_from_checkpoint
    if resume_from_checkpoint is True:
        resume_from_checkpoint = require_complete_checkpoint(output_dir)
    if isinstance(resume_from_checkpoint, str):
        require_resumable(resume_from_checkpoint)
        run_signature.check_model(resume_from_checkpoint, trainer.accelerator.unwrap_model(trainer.model))
    return resume_from_checkpoint


def save(engine: SelectionEngine, folder: str, should_save: bool, model: torch.nn.Module | None = None) -> None:
    """Write the engine's files into ``folder`` (every process calls this); ``model`` is the unwrapped model."""
    state = engine.state_dict(model)
    if should_save:
        atomic_save(state["shared"], os.path.join(folder, STATE_FILE))
    atomic_save(state["rank"], os.path.join(folder, RANK_STATE_FILE.format(rank=engine.args.process_index)))


def load(engine: SelectionEngine, checkpoint: str, ignore_data_skip: bool = False) -> None:
    """Restore ``engine`` from ``checkpoint``; the resumed epoch then skips, unloaded, what was read."""
    path = os.path.join(checkpoint, STATE_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{checkpoint} has no {STATE_FILE}: it was not written by SelectiveBackpropTrainer, so the "
            "selection state (loss history, per-example store, position in the epoch) cannot be restored. "
            "Resume it with transformers.Trainer, or start a new run from its weights."
        )
    shared = torch.load(path, weights_only=True)
    # Before anything is restored: a checkpoint of other settings or data fails here, not mid-restore.
    run_signature.check(shared.get("run"), engine.run, checkpoint)
    if engine.selector.uses_reference_losses and shared.get("irreducible") is None:
        raise ValueError(
            f"{checkpoint} holds no irreducible losses, which --sb_strategy rholoss needs: it was saved by a run "
            "of another strategy; resume it with that strategy"
        )
    world, rank, saved_world = engine.accelerator.num_processes, engine.args.process_index, shared["world_size"]
    if saved_world == world:
        rank_path = os.path.join(checkpoint, RANK_STATE_FILE.format(rank=rank))
        if not os.path.isfile(rank_path):
            raise FileNotFoundError(
                f"{checkpoint} has no {os.path.basename(rank_path)}: this process's queue, generator and counters "
                "cannot be restored, so the resumed run would not continue the saved one"
            )
        ranks = {rank: torch.load(rank_path, weights_only=True)}
    else:
        # The read rows of the epoch's order are skipped whatever the world size (the sampler skips rows, not
        # per-rank batches); saved rank r's queued rows and counters go to rank r % world.
        paths = {old: os.path.join(checkpoint, RANK_STATE_FILE.format(rank=old))
                 for old in range(rank, saved_world, world)}
        ranks = {old: torch.load(path, weights_only=True) for old, path in paths.items() if os.path.isfile(path)}
    adopted = engine.load_state_dict({"shared": shared, "ranks": ranks}, ignore_data_skip)
    if saved_world != world:
        warnings.warn(
            f"{checkpoint} was saved by {saved_world} processes and this run has {world}: the shared loss "
            f"history and store are restored; this process takes over the queued rows and counters of old "
            f"rank(s) {adopted} and the resumed epoch skips the rows already read. The run "
            "continues, but not bit for bit as it would have with the same processes.",
            stacklevel=2,
        )


def save_before_trainer(trainer, model, folder: str, save_trainer_files) -> None:
    """Write the engine's files into the checkpoint ``folder``, then the Trainer's (``save_trainer_files()``).

    Selection state first: the Trainer writes trainer_state.json after the weights, optimizer and RNG files
    and rotates old checkpoints only after that, so trainer_state.json marks a complete checkpoint and a kill
    mid-save never leaves only incomplete ones (docs/reliability.md).
    """
    with trainer.engine.stats.timer("save_seconds"):
        os.makedirs(folder, exist_ok=True)
        if trainer.record_keeper is not None:
            trainer.record_keeper.save(folder, trainer.args.should_save)
        save(trainer.engine, folder, trainer.args.should_save, trainer.accelerator.unwrap_model(model))
        if trainer.accelerator.num_processes > 1:
            trainer.accelerator.wait_for_everyone()
        save_trainer_files()
