"""Parallel setups that selection does not support, refused when a selective trainer is built."""

from __future__ import annotations

from collections.abc import Callable

from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled


def refuse_unsupported(trainer, zero3_enabled: Callable[[], bool] = is_deepspeed_zero3_enabled) -> None:
    """Setups whose collectives or loss scale selection would break, refused before anything trains."""
    args = trainer.args
    strategy = args.sb_strategy
    if args.n_gpu > 1:
        # The Trainer would wrap the model in nn.DataParallel, which splits each step's batch over the
        # devices and multiplies the loss by the device count (Trainer.compute_loss); a weighted loss
        # computed on the gathered outputs would be n_gpu times too large.
        raise ValueError(
            f"--sb_strategy {strategy} with {args.n_gpu} GPUs in one process (torch.nn.DataParallel) is not "
            "supported: launch one process per GPU with `accelerate launch` (or torchrun), or make one GPU "
            "visible (CUDA_VISIBLE_DEVICES=0)"
        )
    if not trainer.selector.needs_losses:
        return  # no selection forward: the Trainer's own forwards are the only collectives
    sharded = None
    if trainer.is_fsdp_enabled:
        sharded = "FSDP (--fsdp / an accelerate FSDP config)"
    elif trainer.is_deepspeed_enabled and zero3_enabled():
        sharded = "DeepSpeed ZeRO stage 3"
    if sharded is not None:
        # A sharded model all-gathers its weights in every forward, so every rank must run the same number
        # of forwards; selection forwards run only where a rank has rows to score (a fully planned batch,
        # a Stale-SB epoch's stored losses), which would hang. Not run on GPUs yet: refused until it is.
        raise ValueError(
            f"--sb_strategy {strategy} runs selection forwards, which {sharded} does not support yet (ranks "
            "would run different numbers of forwards and hang in the weight all-gather). Use DDP or DeepSpeed "
            "ZeRO stage 1/2, or a strategy without a selection forward (uniform, infobatch)"
        )
