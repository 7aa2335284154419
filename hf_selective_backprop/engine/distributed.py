"""The few collectives that keep ranks in lockstep. Each is a no-op on one process.

They go through Accelerate's (``Accelerator.reduce``, ``Accelerator.gather``, ``broadcast_object_list``), except
the ragged gather of `gather_pairs`, which needs each rank's row count to drop the padding:
``Accelerator.pad_across_processes`` would gather the counts once to pad and the caller a second time.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, broadcast_object_list

from .transfer import to_device, to_host


def shards_weights(accelerator: Accelerator) -> bool:
    """Whether the model's weights are split over the ranks (DeepSpeed ZeRO-3, FSDP): each forward then
    all-gathers them, so every rank must run the same number of forwards."""
    if accelerator.num_processes == 1:
        return False
    if fsdp_version(accelerator) is not None:
        return True
    plugin = accelerator.state.deepspeed_plugin if accelerator.distributed_type == DistributedType.DEEPSPEED else None
    return plugin is not None and plugin.zero_stage == 3


def fsdp_version(accelerator: Accelerator) -> int | None:
    """1 or 2 when the model is (to be) wrapped by FSDP, else None."""
    if accelerator.distributed_type != DistributedType.FSDP:
        return None
    return accelerator.state.fsdp_plugin.fsdp_version


def all_true(accelerator: Accelerator, flag: bool) -> bool:
    """True only if ``flag`` holds on every rank: the one decision all ranks then share."""
    if accelerator.num_processes == 1:
        return flag
    # Filled on the device: a tensor made from host data would be one more blocking copy.
    dissenting = accelerator.reduce(torch.full((1,), int(not flag), device=accelerator.device), reduction="sum")
    return int(dissenting.item()) == 0


def gather_pairs(accelerator: Accelerator, ids: torch.Tensor, losses: torch.Tensor):
    """(ids, losses) of every rank on the host, aligned row for row (non-finite losses kept as NaN), and the
    slice of them that holds this rank's own rows.

    One process: one device-to-host copy. Several: the host waits twice, for the ranks' row counts and
    for the rows (ids, exact in float64 below 2**53, and losses travel as one tensor).
    """
    ids, losses = ids.reshape(-1), losses.reshape(-1)
    if accelerator.num_processes == 1:
        ids, losses = to_host(ids.to(torch.int64), losses.to(torch.float32))
        return ids, losses, slice(0, len(ids))
    device = accelerator.device
    counts = accelerator.gather(torch.full((1,), len(ids), device=device, dtype=torch.int64)).cpu().tolist()
    longest = max(counts)
    pairs = torch.stack([to_device(ids, device).double(), to_device(losses, device).double()], dim=1)
    padded = torch.cat([pairs, pairs.new_zeros(longest - len(ids), 2)])  # all_gather needs equal shapes
    gathered = accelerator.gather(padded).cpu()
    rows = torch.cat([gathered[rank * longest : rank * longest + count] for rank, count in enumerate(counts)])
    before = sum(counts[: accelerator.process_index])
    return rows[:, 0].to(torch.int64), rows[:, 1].to(torch.float32), slice(before, before + len(ids))


def sum_over_processes(accelerator: Accelerator, values: dict[str, float]) -> dict[str, float]:
    """Sum each counter over ranks (float64 so large example counts stay exact)."""
    if accelerator.num_processes == 1:
        return dict(values)
    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=accelerator.device)
    return dict(zip(keys, accelerator.reduce(tensor, reduction="sum").tolist(), strict=True))


def broadcast_object(accelerator: Accelerator, obj):
    """The main process's ``obj`` on every rank (picklable; CPU tensors inside stay on the CPU)."""
    if accelerator.num_processes == 1:
        return obj
    return broadcast_object_list([obj], from_process=0)[0]
