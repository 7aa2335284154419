"""The few collectives that keep ranks in lockstep. Each is a no-op on one process."""

from __future__ import annotations

import torch
import torch.distributed as dist
from accelerate import Accelerator


def all_true(accelerator: Accelerator, flag: bool) -> bool:
    """True only if ``flag`` holds on every rank: the one decision all ranks then share."""
    if accelerator.num_processes == 1:
        return flag
    value = torch.tensor([int(flag)], device=accelerator.device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def gather_pairs(accelerator: Accelerator, ids: torch.Tensor, losses: torch.Tensor):
    """(ids, losses) of every rank, aligned row for row; non-finite losses are kept as NaN."""
    if accelerator.num_processes == 1:
        return ids, losses
    ids = ids.reshape(-1).to(accelerator.device, torch.int64)
    losses = losses.reshape(-1).to(accelerator.device, torch.float32)
    all_ids = accelerator.gather(accelerator.pad_across_processes(ids, dim=0, pad_index=-1)).cpu()
    all_losses = accelerator.gather(accelerator.pad_across_processes(losses, dim=0, pad_index=0)).cpu()
    real = all_ids >= 0
    return all_ids[real], all_losses[real]


def sum_over_processes(accelerator: Accelerator, values: dict[str, float]) -> dict[str, float]:
    """Sum each counter over ranks (float64 so large example counts stay exact)."""
    if accelerator.num_processes == 1:
        return dict(values)
    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=accelerator.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return dict(zip(keys, tensor.tolist(), strict=True))


def broadcast_object(accelerator: Accelerator, obj):
    """The main process's ``obj`` on every rank (picklable; CPU tensors inside stay on the CPU)."""
    if accelerator.num_processes == 1:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
