"""Every ``torch.distributed`` collective of a worker process, recorded and checked as NCCL needs them.

The multi-process tests run on CPUs over gloo, which forgives what NCCL does not: NCCL refuses a host tensor,
and its ``all_gather_into_tensor`` (Accelerate's gather on GPUs, where gloo takes ``all_gather`` with a list)
does not check that every rank sent the same shape; a rank that issues one collective more than the others
waits forever. `CollectiveLog.install` wraps the collectives of ``torch.distributed`` in this process (the
Trainer's, Accelerate's, DeepSpeed's and the package's, all looked up there when called): each call is kept
as its name and the shape and dtype of each tensor it is given, and a tensor that is not on the accelerator's
device is noted. `CollectiveLog.compare` then exchanges every rank's record and says where the ranks first
differ. A collective issued inside another (``all_gather_object``'s own ``all_gather`` of pickled bytes, whose
sizes differ between ranks by design) is not recorded separately, and nor are objects' contents.
"""

from __future__ import annotations

import itertools
import threading

import torch
import torch.distributed as dist

TENSOR_OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "reduce",
              "gather", "scatter", "all_to_all_single")
OBJECT_OPS = ("all_gather_object", "broadcast_object_list", "gather_object")


class CollectiveLog:
    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.calls: list[tuple] = []
        self.misplaced: list[str] = []
        self._originals: dict = {}
        self._inside = threading.local()

    def install(self) -> CollectiveLog:
        for name in TENSOR_OPS + OBJECT_OPS + ("barrier",):
            original = getattr(dist, name)
            self._originals[name] = original
            setattr(dist, name, self._recording(name, original))
        return self

    def _recording(self, name: str, original):
        def recorded(*args, **kwargs):
            if getattr(self._inside, "active", False):
                return original(*args, **kwargs)
            if name in TENSOR_OPS:
                tensors = _tensors(args, kwargs)
                self.calls.append((name, tuple((tuple(t.shape), str(t.dtype)) for t in tensors)))
                self.misplaced += [f"{name} #{len(self.calls)}: a tensor on {t.device}, the accelerator's device is "
                                   f"{self.device}" for t in tensors if not _on(t.device, self.device)]
            elif name in OBJECT_OPS:
                self.calls.append((name, len(args[0])))
            else:
                self.calls.append((name,))
            self._inside.active = True
            try:
                return original(*args, **kwargs)
            finally:
                self._inside.active = False

        return recorded

    def compare(self) -> dict:
        """Every rank's record side by side (a collective): how many calls each made, where they first differ
        (None: nowhere) and this rank's misplaced tensors."""
        logs = [None] * dist.get_world_size()
        self._originals["all_gather_object"](logs, self.calls)
        first = None
        for index, entries in enumerate(itertools.zip_longest(*logs)):
            if len(set(entries)) > 1:
                first = {"index": index, "calls": list(entries)}
                break
        return {"counts": [len(log) for log in logs], "first_difference": first, "misplaced": list(self.misplaced),
                "calls": list(self.calls)}

    def reset(self) -> None:
        self.calls, self.misplaced = [], []


def _tensors(args, kwargs) -> list[torch.Tensor]:
    found = []
    for value in list(args) + list(kwargs.values()):
        values = value if isinstance(value, (list, tuple)) else [value]
        found += [v for v in values if isinstance(v, torch.Tensor)]
    return found


def _on(device: torch.device, expected: torch.device) -> bool:
    return device.type == expected.type and (expected.index is None or device.index in (None, expected.index))
