"""Saving an engine's state into a Trainer checkpoint and restoring it, on the same or another world size.

``sb_state.pt`` holds what every process shares (strategy, store, epoch plan and position, and the
run's record: its selection settings and data, checked on resume), written once;
``sb_rank_state_{rank}.pt`` what each process owns (generator, queue, counters, strategy, the
random state of its data pipeline and, with several processes, its model's buffers).
"""

from __future__ import annotations

import os
import warnings

import torch

from . import run_record
from .accounting import COUNTERS, TIMERS
from .checkpoints import RANK_STATE_FILE, STATE_FILE, atomic_save
from .engine import SelectionEngine
from .epoch_plan import EpochPlan
from .reference import IrreducibleLosses


def save(engine: SelectionEngine, folder: str, should_save: bool, model: torch.nn.Module | None = None) -> None:
    """Write the engine's files into ``folder`` (every process calls this); ``model`` is the unwrapped model."""
    rank = engine.args.process_index
    if should_save:
        shared = {
            "selector": engine.selector.state_dict(),
            "store": engine.store.state_dict(),
            "epoch": engine.epoch,
            "consumed": engine.consumed,
            "rows_per_batch": engine.selection_batch_size,
            # Made at the epoch's start from the store of then: once the epoch has begun it cannot be redrawn.
            "epoch_started": engine.epoch_started,
            "plan": None if engine.plan is None else engine.plan.state_dict(),
            # A stream's epoch rule (InfoBatch's mean), made from the store at the epoch's start, likewise.
            "stream_rule": engine.stream_rule,
            "world_size": engine.accelerator.num_processes,
            "run": engine.run,
            # Scored once before training ('rholoss'): a resumed run must not score it again.
            "irreducible": None if engine.irreducible is None else engine.irreducible.state_dict(),
        }
        atomic_save(shared, os.path.join(folder, STATE_FILE))
    rank_state = {
        "generator": engine.generator.get_state(),
        "queue": engine.queue.state_dict(),
        "stats": engine.stats.state_dict(),
        # Per rank too: a 'local' history scope (or kath18's running tau) differs between ranks.
        "selector": engine.selector.state_dict(),
        "data": engine.data_state.state_dict(),
    }
    if model is not None and engine.accelerator.num_processes > 1:
        rank_state["model_buffers"] = model_buffers(model)
    atomic_save(rank_state, os.path.join(folder, RANK_STATE_FILE.format(rank=rank)))


def model_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's saved buffers (BatchNorm running statistics, ...) as this process holds them.

    DDP copies rank 0's buffers to the other ranks only at the start of a training forward; in
    between, each rank's own training forward has updated its copy, and the selection forwards of
    the next step use it. The Trainer's checkpoint holds rank 0's model only, so without these a
    resumed rank scores its first selection batches with rank 0's statistics and selects other rows.
    """
    saved = model.state_dict().keys()
    return {name: value.detach().cpu().clone() for name, value in model.named_buffers() if name in saved}


def restore_model_buffers(engine: SelectionEngine, model: torch.nn.Module) -> None:
    """Put the buffers this process saved back into ``model`` (the unwrapped model), once after a resume.

    Called after the model is wrapped: wrapping it in DDP copies rank 0's buffers to every rank.
    """
    saved, engine.saved_model_buffers = engine.saved_model_buffers, None
    if not saved:
        return
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in saved.items():
            if name in buffers:
                buffers[name].copy_(value)


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
    run_record.check(shared.get("run"), engine.run, checkpoint)
    engine.selector.load_state_dict(shared["selector"])
    engine.store.load_state_dict(shared["store"])
    if engine.selector.uses_reference_losses:
        if shared.get("irreducible") is None:
            raise ValueError(
                f"{checkpoint} holds no irreducible losses, which --sb_strategy rholoss needs: it was saved by a run "
                "of another strategy; resume it with that strategy"
            )
        engine.irreducible = IrreducibleLosses.from_state_dict(shared["irreducible"])
    engine.epoch = shared["epoch"]
    plan = None if shared["plan"] is None else EpochPlan.from_state_dict(shared["plan"])
    # Rows of the epoch's (planned) order that all processes together had read.
    read = shared["consumed"] * shared["world_size"] * shared["rows_per_batch"]
    if shared["epoch_started"]:
        engine.resumed_position = (shared["epoch"], plan, 0 if ignore_data_skip else read)
        engine.resumed_stream_rule = shared.get("stream_rule")
    world, rank = engine.accelerator.num_processes, engine.args.process_index
    rank_path = os.path.join(checkpoint, RANK_STATE_FILE.format(rank=rank))
    if shared["world_size"] == world:
        if not os.path.isfile(rank_path):
            raise FileNotFoundError(
                f"{checkpoint} has no {os.path.basename(rank_path)}: this process's queue, generator and counters "
                "cannot be restored, so the resumed run would not continue the saved one"
            )
        _restore_rank(engine, torch.load(rank_path, weights_only=True))
    else:
        _adopt_rank_states(engine, checkpoint, shared["world_size"])


def _restore_rank(engine: SelectionEngine, state: dict) -> None:
    engine.generator.set_state(state["generator"])
    engine.queue.clear()
    _push_saved_queue(engine, state["queue"])
    engine.stats.load_state_dict(state["stats"])
    engine.selector.load_state_dict(state["selector"])
    engine.data_state.load_state_dict(state.get("data"))
    engine.saved_model_buffers = state.get("model_buffers")


def _push_saved_queue(engine: SelectionEngine, state: dict) -> None:
    # Saved rows are on the CPU; new rows arrive on the device, and a popped batch may join both.
    engine.queue.push({key: value.to(engine.args.device) for key, value in state["rows"].items()})


def _adopt_rank_states(engine: SelectionEngine, checkpoint: str, old_world: int) -> None:
    """Resume with another number of processes than the checkpoint was saved by.

    The read rows of the epoch's order are skipped whatever the world size (the sampler skips
    rows, not per-rank batches). Old rank r's queued rows and counters go to new rank
    ``r % world``; new rank r continues old rank r's generator, strategy and data pipeline state.
    """
    world, rank = engine.accelerator.num_processes, engine.args.process_index
    adopted = []
    for old_rank in range(rank, old_world, world):
        path = os.path.join(checkpoint, RANK_STATE_FILE.format(rank=old_rank))
        if os.path.isfile(path):
            adopted.append((old_rank, torch.load(path, weights_only=True)))
    engine.queue.clear()
    for old_rank, state in adopted:
        _push_saved_queue(engine, state["queue"])
        if old_rank == rank:
            engine.generator.set_state(state["generator"])
            engine.selector.load_state_dict(state["selector"])
            engine.data_state.load_state_dict(state.get("data"))
            engine.saved_model_buffers = state.get("model_buffers")
    if adopted:
        merged = {name: 0 for name in COUNTERS}
        for _, state in adopted:
            for name in COUNTERS:
                merged[name] += state["stats"].get(name, 0)
        # A step is taken by all ranks together; times are per process.
        merged["optimizer_steps"] = max(state["stats"].get("optimizer_steps", 0) for _, state in adopted)
        for name in TIMERS:
            merged[name] = max(state["stats"].get(name, 0.0) for _, state in adopted)
        engine.stats.load_state_dict(merged)
    warnings.warn(
        f"{checkpoint} was saved by {old_world} processes and this run has {world}: the shared loss "
        f"history and store are restored; this process takes over the queued rows and counters of old "
        f"rank(s) {[old for old, _ in adopted]} and the resumed epoch skips the rows already read. The run "
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
        save(trainer.engine, folder, trainer.args.should_save, trainer.accelerator.unwrap_model(model))
        if trainer.accelerator.num_processes > 1:
            trainer.accelerator.wait_for_everyone()
        save_trainer_files()
