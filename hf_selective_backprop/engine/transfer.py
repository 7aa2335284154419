"""Copies between the host and an accelerator that stall it no more than they must.

On a CUDA device a copy to the host waits for every kernel queued before it (a host
synchronisation), and so does a copy to the device from pageable host memory; a copy from pinned
memory with ``non_blocking=True`` does not (``non_blocking`` alone does nothing for pageable
memory). Selection copies each selection batch's results to the host once (`to_host`: several
tensors in one copy) and sends row indices and weights back with `to_device`.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``; a host tensor goes to a CUDA device from pinned memory, without blocking."""
    device = torch.device(device)
    if tensor.device.type == "cpu" and device.type == "cuda":
        # The caching host allocator keeps the pinned block alive until the copy has completed.
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_host(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` on the host, in a single device-to-host copy whatever their number and dtypes.

    The bytes of those on the accelerator (one device) are concatenated there, copied once and viewed
    back as each tensor. Widest dtypes first, so every tensor starts at an offset its element size
    divides (``view(dtype)`` needs it). Host tensors among them (ids a collator left on the host, say)
    stay where they are; for host tensors alone this is no synchronisation.
    """
    if any(t.device.type == "cpu" for t in tensors) and any(t.device.type != "cpu" for t in tensors):
        on_device = [i for i, t in enumerate(tensors) if t.device.type != "cpu"]
        copied = dict(zip(on_device, to_host(*(tensors[i] for i in on_device)), strict=True))
        return tuple(copied.get(i, t.detach()) for i, t in enumerate(tensors))
    order = sorted(range(len(tensors)), key=lambda i: -tensors[i].element_size())
    flat = [_flat(tensors[i]) for i in order]
    packed = torch.cat([t.view(torch.uint8) for t in flat]).cpu()
    out: list[torch.Tensor | None] = [None] * len(tensors)
    offset = 0
    for i, t in zip(order, flat, strict=True):
        size = t.numel() * t.element_size()
        out[i] = packed[offset : offset + size].view(t.dtype).reshape(tensors[i].shape)
        offset += size
    return tuple(out)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as one dimension of stride 1, which view(dtype) needs. An empty or one-element tensor counts as
    contiguous whatever its strides (one row of a gathered column has stride 2), so contiguous() keeps them."""
    if tensor.numel() == 0:
        return tensor.new_empty(0)
    flat = tensor.detach().reshape(-1).contiguous()
    return flat if flat.stride(0) == 1 else flat.clone(memory_format=torch.contiguous_format)
