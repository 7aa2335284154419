"""The few collectives that keep ranks in lockstep. Each is a no-op on one process.

They go through Accelerate's (``reduce``, ``gather``, ``gather_object``, ``broadcast_object_list``), except the
ragged gather of `gather_pairs`, which needs each rank's row count to drop the padding:
``Accelerator.pad_across_processes`` would gather the counts once to pad and the caller a second time. Every
tensor they hand over is on the accelerator's device and of one shape and dtype on every rank: NCCL's
``all_gather_into_tensor`` (Accelerate's gather on GPUs) refuses host tensors and does not check sizes.

``accelerator`` is an `accelerate.Accelerator` or an `accelerate.PartialState` (what they read: the number of
processes, this one's index and the device).
"""

from __future__ import annotations

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, broadcast_object_list, gather, gather_object, reduce

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


def why_unplaced(model: torch.nn.Module, device: torch.device | str) -> str | None:
    """Why ``model`` cannot run a forward on inputs on ``device`` yet (None: it can).

    DeepSpeed and FSDP place the model when training starts, not when the Trainer is built: until then its
    weights are on the host, or (loaded under a ZeRO-3 config) partitioned over the ranks.
    """
    parameters = list(model.parameters())
    if any(hasattr(parameter, "ds_id") for parameter in parameters):
        return "its weights are partitioned by DeepSpeed ZeRO-3 (each rank holds a shard until training starts)"
    device = torch.device(device)
    elsewhere = sorted({str(p.device) for p in parameters if not _same_device(p.device, device)})
    if elsewhere:
        return (f"its weights are on {', '.join(elsewhere)} and the rows on {device} until training starts "
                "(DeepSpeed and FSDP place the model then)")
    return None


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def all_true(accelerator: Accelerator, flag: bool) -> bool:
    """True only if ``flag`` holds on every rank: the one decision all ranks then share."""
    if accelerator.num_processes == 1:
        return flag
    # Filled on the device: a tensor made from host data would be one more blocking copy.
    dissenting = reduce(torch.full((1,), int(not flag), device=accelerator.device), reduction="sum")
    return int(dissenting.item()) == 0


def flags_of_every_rank(accelerator: Accelerator, flag: bool) -> list[bool]:
    """``flag`` as each rank holds it, in rank order (one small gather)."""
    if accelerator.num_processes == 1:
        return [flag]
    flags = gather(torch.full((1,), int(flag), device=accelerator.device))
    return [bool(value) for value in flags.cpu().tolist()]


def fail_together(accelerator: Accelerator, error: Exception | None) -> None:
    """Raise on every rank when ``error`` was raised on any (a collective: call it on every rank, with None where
    nothing failed). A check of one rank's own data that raised there alone would leave the other ranks waiting
    in their next collective until its timeout; the error names each failing rank and its cause."""
    if accelerator.num_processes == 1 or all_true(accelerator, error is None):
        if error is not None:
            raise error
        return
    _raise_on_every_rank(accelerator, error)


def _raise_on_every_rank(accelerator: Accelerator, error: Exception | None):
    causes = gather_object([None if error is None else str(error)])  # only once some rank has failed
    failed = "; ".join(f"rank {rank} of {accelerator.num_processes}: {cause}"
                       for rank, cause in enumerate(causes) if cause is not None)
    raise ValueError(f"stopped on every rank: {failed}") from error


def gather_pairs(accelerator: Accelerator, ids: torch.Tensor, losses: torch.Tensor,
                 failure: ValueError | None = None):
    """(ids, losses) of every rank on the host, aligned row for row (non-finite losses kept as NaN), and the
    slice of them that holds this rank's own rows.

    ``failure``: this rank could not compute its rows; it joins the gather all the same, and every rank raises
    (`fail_together`'s error), without a collective more when no rank failed.

    One process: one device-to-host copy. Several: the host waits twice, for the ranks' row counts and
    for the rows (ids, exact in float64 below 2**53, and losses travel as one tensor).
    """
    ids, losses = ids.reshape(-1), losses.reshape(-1)
    if accelerator.num_processes == 1:
        if failure is not None:
            raise failure
        ids, losses = to_host(ids.to(torch.int64), losses.to(torch.float32))
        return ids, losses, slice(0, len(ids))
    device = accelerator.device
    pairs = torch.stack([to_device(ids, device).double(), to_device(losses, device).double()], dim=1)
    rows, mine = gather_rows(accelerator, pairs, failure)
    return rows[:, 0].to(torch.int64), rows[:, 1].to(torch.float32), mine


def gather_labelled(accelerator: Accelerator, ids: torch.Tensor, losses: torch.Tensor, labels: torch.Tensor,
                    failure: ValueError | None = None):
    """`gather_pairs` with each row's class label: (ids, losses, labels) of every rank on the host, and the slice
    that holds this rank's own rows. Labels travel in the same tensor (exact in float64), in the same waits."""
    ids, losses, labels = ids.reshape(-1), losses.reshape(-1), labels.reshape(-1)
    if accelerator.num_processes == 1:
        if failure is not None:
            raise failure
        ids, losses, labels = to_host(ids.to(torch.int64), losses.to(torch.float32), labels.to(torch.int64))
        return ids, losses, labels, slice(0, len(ids))
    device = accelerator.device
    rows = torch.stack([to_device(ids, device).double(), to_device(losses, device).double(),
                        to_device(labels, device).double()], dim=1)
    rows, mine = gather_rows(accelerator, rows, failure)
    return rows[:, 0].to(torch.int64), rows[:, 1].to(torch.float32), rows[:, 2].to(torch.int64), mine


def gather_rows(accelerator: Accelerator, rows: torch.Tensor, failure: Exception | None = None):
    """Every rank's ``rows`` (float64, shape (n, k), n differing between ranks) on the host, in rank order, and
    the slice of them that holds this rank's own. ``failure``: as `gather_pairs`'s."""
    if accelerator.num_processes == 1:
        if failure is not None:
            raise failure
        (rows,) = to_host(rows)
        return rows, slice(0, len(rows))
    device = accelerator.device
    rows = to_device(rows, device)
    count = -1 if failure is not None else len(rows)
    counts = gather(torch.full((1,), count, device=device, dtype=torch.int64)).cpu().tolist()
    if min(counts) < 0:
        _raise_on_every_rank(accelerator, failure)
    longest = max(counts)
    padded = torch.cat([rows, rows.new_zeros(longest - len(rows), rows.shape[1])])  # all_gather needs equal shapes
    gathered = gather(padded).cpu()
    every = torch.cat([gathered[rank * longest : rank * longest + count] for rank, count in enumerate(counts)])
    before = sum(counts[: accelerator.process_index])
    return every, slice(before, before + len(rows))


def sum_over_processes(accelerator: Accelerator, values: dict[str, float]) -> dict[str, float]:
    """Sum each counter over ranks (float64 so large example counts stay exact)."""
    if accelerator.num_processes == 1:
        return dict(values)
    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=accelerator.device)
    return dict(zip(keys, reduce(tensor, reduction="sum").tolist(), strict=True))


def broadcast_object(accelerator: Accelerator, obj):
    """The main process's ``obj`` on every rank (picklable; CPU tensors inside stay on the CPU)."""
    if accelerator.num_processes == 1:
        return obj
    return broadcast_object_list([obj], from_process=0)[0]
