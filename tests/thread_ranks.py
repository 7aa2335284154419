"""Ranks as threads of this process on an accelerator that is not the CPU: the package's collectives checked as
NCCL needs them, without GPUs or a process group.

`run_ranks(fn)` calls ``fn(accelerator)`` on each rank's thread. Each ``accelerator`` stands for an
`accelerate.Accelerator` whose device is ``meta``:

- a tensor made on that device (``torch.full(..., device=accelerator.device)``) or moved there (``.to``) is a
  `Placed` tensor: its data stays on the host, its ``device`` says ``meta``, ``.cpu()`` gives a host tensor, and
  an operation that mixes it with a host tensor of one or more dimensions fails, as on a GPU (indexing by a host
  tensor, which a GPU allows, and parameters, which stand for the model's weights, excepted);
- the collectives that `hf_selective_backprop.engine.distributed` calls (Accelerate's ``gather``, ``reduce``,
  ``gather_object`` and ``broadcast_object_list``) meet every rank's call and fail unless every rank
  called the same one, with tensors on the device, of one shape and dtype: what ``all_gather_into_tensor``,
  Accelerate's gather under NCCL, needs (it refuses host tensors and does not check sizes). A collective that a
  rank ended without (it returned, or raised alone) fails the ranks waiting in it, where NCCL would hang. Each
  rank's calls are kept in ``World.calls``.
"""

from __future__ import annotations

import copy
import threading
from unittest import mock

import torch
from accelerate.utils import DistributedType
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from hf_selective_backprop.engine import distributed

META = torch.device("meta")
TIMEOUT = 15


class Placed(torch.Tensor):
    """A host tensor standing for one on the accelerator (see the module's docstring)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is torch.Tensor.device:  # the property's getter
            return META
        if func is torch.Tensor.cpu or (func is torch.Tensor.to and _target(args, kwargs) == "cpu"):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).clone().as_subclass(torch.Tensor)
        checked = args[:1] + args[2:] if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) else args
        leaves = [x for x in tree_leaves((checked, kwargs)) if isinstance(x, torch.Tensor)]
        host = [x for x in leaves if type(x) is torch.Tensor and x.dim() > 0]
        if host and any(isinstance(x, Placed) for x in leaves):
            raise AssertionError(f"{getattr(func, '__name__', func)}: a host tensor of shape {tuple(host[0].shape)} "
                                 "beside one on the accelerator")
        return super().__torch_function__(func, types, args, kwargs)


def _target(args, kwargs) -> str | None:
    device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
    return None if device is None else device.type


class OnTheAccelerator(TorchFunctionMode):
    """Tensors made on the meta device, or moved there, become `Placed` host tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.to and _target(args, kwargs) == "meta":
            dtype = torch._C._nn._parse_to(*args[1:], **kwargs)[1]
            source = args[0] if dtype is None else args[0].to(dtype)
            return source.detach().clone().as_subclass(Placed)  # a copy, as a move to a device is
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "meta":
            kwargs["device"] = "cpu"
            return func(*args, **kwargs).as_subclass(Placed)
        return func(*args, **kwargs)


class World:
    """The ranks' meeting point: each collective waits for every rank's call, then checks them against each other."""

    def __init__(self, size: int):
        self.size = size
        self.calls: list[list[tuple]] = [[] for _ in range(size)]
        self.local = threading.local()
        self._rounds: dict[int, list] = {}  # the n-th collective of every rank: (op, value) by rank
        self._departed: set[int] = set()  # ranks whose function returned or raised
        self._condition = threading.Condition()

    def _meet(self, op: str, value, record) -> list:
        rank = self.local.rank
        index = len(self.calls[rank])
        self.calls[rank].append((op, *record))
        with self._condition:
            posted = self._rounds.setdefault(index, [None] * self.size)
            posted[rank] = (op, value)
            self._condition.notify_all()
            came = self._condition.wait_for(
                lambda: all(p is not None for p in posted) or any(len(self.calls[r]) <= index for r in self._departed),
                TIMEOUT)
        missing = [r for r, post in enumerate(posted) if post is None]
        if missing:
            why = "ended without it" if came else f"did not come in {TIMEOUT} s"
            raise AssertionError(f"rank {rank} waits in collective #{index} ({op}), which rank(s) {missing} {why}: "
                                 "a hang under NCCL")
        if len({op for op, _ in posted}) > 1:
            raise AssertionError(f"the ranks called different collectives: {[op for op, _ in posted]}")
        return [value for _, value in posted]

    def depart(self, rank: int) -> None:
        with self._condition:
            self._departed.add(rank)
            self._condition.notify_all()

    def _tensors(self, op: str, tensor: torch.Tensor) -> list[torch.Tensor]:
        if tensor.device != META:
            raise AssertionError(f"{op}: a tensor on {tensor.device}, not on the accelerator's device {META}")
        tensors = self._meet(op, tensor.as_subclass(torch.Tensor), (tuple(tensor.shape), tensor.dtype))
        if len({(tuple(t.shape), t.dtype) for t in tensors}) > 1:
            raise AssertionError(f"{op}: the ranks' tensors differ: {[(tuple(t.shape), t.dtype) for t in tensors]}")
        return [t if t.dim() else t[None] for t in tensors]  # Accelerate gathers a scalar as one row

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._tensors("gather", tensor)).as_subclass(Placed)

    def reduce(self, tensor: torch.Tensor, reduction: str = "mean", scale: float = 1.0) -> torch.Tensor:
        assert reduction == "sum", reduction
        return torch.stack(self._tensors("reduce", tensor)).sum(0).reshape(tensor.shape).as_subclass(Placed)

    def gather_object(self, objects: list) -> list:
        return [item for posted in self._meet("gather_object", copy.deepcopy(objects), ()) for item in posted]

    def broadcast_object_list(self, objects: list, from_process: int = 0) -> list:
        posted = self._meet("broadcast_object_list", copy.deepcopy(objects), ())
        objects[:] = copy.deepcopy(posted[from_process])
        return objects


class Rank:
    """What the package reads of an Accelerator, for one rank of a `World`."""

    def __init__(self, world: World, index: int):
        self.num_processes = world.size
        self.process_index = self.local_process_index = index
        self.is_main_process = self.is_local_main_process = index == 0
        self.device = META
        self.distributed_type = DistributedType.MULTI_GPU
        self.gather, self.reduce = world.gather, world.reduce


_current = threading.local()


def current() -> Rank:
    """The calling rank's accelerator (in place of ``accelerate.PartialState()``)."""
    return _current.accelerator


def run_ranks(fn, size: int = 2) -> tuple[World, list, list]:
    """``fn(accelerator)`` on each of ``size`` ranks: the world, what each rank returned and what each raised."""
    world = World(size)
    results: list = [None] * size
    errors: list = [None] * size

    def body(rank: int) -> None:
        world.local.rank = rank
        _current.accelerator = Rank(world, rank)
        try:
            with OnTheAccelerator():
                results[rank] = fn(_current.accelerator)
        except BaseException as error:  # reported to the test, which asserts on it
            errors[rank] = error
        finally:
            world.depart(rank)  # a rank waiting for this one's collective fails now

    names = ("gather", "reduce", "gather_object", "broadcast_object_list")
    with mock.patch.multiple(distributed, **{name: getattr(world, name) for name in names}):
        threads = [threading.Thread(target=body, args=(rank,), daemon=True) for rank in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(3 * TIMEOUT)
    return world, results, errors
