"""Parallel setups that selection does not support, refused when a selective trainer is built."""

from __future__ import annotations

from .default_strategy import CannotSelect
from .engine import distributed


def refuse_unsupported(trainer) -> None:
    """Setups whose collectives or loss scale selection would break, refused before anything trains."""
    args = trainer.args
    strategy = args.sb_strategy
    if args.n_gpu > 1:
        # The Trainer would wrap the model in nn.DataParallel, which splits each step's batch over the
        # devices and multiplies the loss by the device count (Trainer.compute_loss); a weighted loss
        # computed on the gathered outputs would be n_gpu times too large.
        raise CannotSelect(
            f"--sb_strategy {strategy} with {args.n_gpu} GPUs in one process (torch.nn.DataParallel) is not "
            "supported: launch one process per GPU with `accelerate launch` (or torchrun), or make one GPU "
            "visible (CUDA_VISIBLE_DEVICES=0)"
        )
    processes = trainer.accelerator.num_processes
    if processes > 1 and trainer.accelerator.split_batches:
        # Accelerate would split each loaded batch over the processes, while the engine assembles each process's
        # micro-batches at the Trainer's batch size: every step would train `processes` times the rows the plain
        # Trainer trains, with as many times fewer steps.
        raise CannotSelect(
            f"--sb_strategy {strategy} with split_batches=True (accelerator_config) on {processes} processes is not "
            "supported: selection assembles each process's micro-batches itself. Set split_batches=False and "
            f"per_device_train_batch_size to the global batch size / {processes} (the same training)"
        )
    if trainer.is_fsdp_enabled and trainer.selector.needs_losses and distributed.fsdp_version(trainer.accelerator) != 2:
        # The engine keeps sharded forwards in lockstep (docs/distributed.md), shown with torch's fully_shard
        # (FSDP2), which shards the module in place. FSDP1 wraps it, and the selection forward would have to
        # go through that wrapper: not shown.
        raise CannotSelect(
            f"--sb_strategy {strategy} runs selection forwards, supported under FSDP version 2 only: set "
            "fsdp_version: 2 in the accelerate FSDP config (--fsdp_config with fsdp_version 2), or use DeepSpeed "
            "ZeRO, DDP, or a strategy without a selection forward (uniform, infobatch)"
        )
