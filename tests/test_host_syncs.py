"""How often selection makes the host wait for the device, counted on the CPU.

`OnDevice` is a CPU tensor that stands for one on a CUDA device: everything computed from it stays
`OnDevice`, and each operation that would make the host wait for a CUDA device is recorded: a copy to
the host (``.cpu()``, ``.item()``, ``.tolist()``, ``bool()``, ...), an operation whose output size
depends on the data (``nonzero``, boolean-mask indexing, ``unique``), and a host tensor used in a
device operation (a blocking copy from pageable memory). `transfer.to_device` stands for what it does
on CUDA, a non-blocking copy from pinned memory (tested on a GPU in tests/test_gpu.py).
"""

import pytest
import torch
from tiny import TinyClassifier, make_config, make_dataset
from torch.utils._pytree import tree_leaves

from hf_selective_backprop import SelectiveBackpropTrainer, losses
from hf_selective_backprop.engine import transfer
from hf_selective_backprop.engine.epoch_plan import EpochPlan
from hf_selective_backprop.record.keeper import RecordKeeper

HOST_COPIES = {
    torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy,
    torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
}
DATA_DEPENDENT = {torch.Tensor.nonzero, torch.nonzero, torch.unique, torch.Tensor.unique, torch.masked_select}


class OnDevice(torch.Tensor):
    syncs: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = _sync_reason(func, args, kwargs)
        if reason is not None:
            cls.syncs.append(reason)
        if reason is not None and reason.startswith("to host"):
            with torch._C.DisableTorchFunctionSubclass():
                result = func(*args, **kwargs)
                return result.as_subclass(torch.Tensor) if isinstance(result, torch.Tensor) else result
        return super().__torch_function__(func, types, args, kwargs)


def _sync_reason(func, args, kwargs):
    name = getattr(func, "__name__", repr(func))
    if func in HOST_COPIES:
        return f"to host: {name}"
    if func is torch.Tensor.to:
        device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
        return "to host: .to(cpu)" if device is not None and device.type == "cpu" else None
    if func in DATA_DEPENDENT:
        return f"data-dependent size: {name}"
    leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and any(x.dtype == torch.bool for x in leaves[1:]):
        return f"data-dependent size: boolean mask in {name}"
    if any(isinstance(x, OnDevice) for x in leaves) and any(
        type(x) is torch.Tensor and x.dim() > 0 for x in leaves
    ):
        return f"host tensor in a device op: {name}"
    return None


@pytest.fixture
def counted(monkeypatch):
    # losses.check_class_labels validates the labels with bool(): one wait per per-example loss, left as it is.
    monkeypatch.setattr(losses, "check_class_labels", lambda *args, **kwargs: None)
    OnDevice.syncs = []
    monkeypatch.setattr(transfer, "to_device", lambda tensor, device: tensor.detach().as_subclass(OnDevice))
    return OnDevice.syncs


def on_device(batch: dict) -> dict:
    return {k: v.as_subclass(OnDevice) for k, v in batch.items()}


class OnDeviceTrainer(SelectiveBackpropTrainer):
    def _prepare_input(self, data):
        return data  # the loader put the batch on the device: moving it there again copies nothing


def trainer_for(output_dir, n=64, **overrides):
    # The model's parameters are nn.Parameter, not host tensors: they count as on the device.
    args = make_config(output_dir, **overrides)
    return OnDeviceTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset(n))


def selection_batch(trainer, rows=16):
    data = trainer.train_dataset[:rows]
    return on_device({"pixel_values": data["pixel_values"], "labels": data["labels"], "index": data["index"]})


def test_a_selection_batch_waits_for_the_device_once(output_dir, counted):
    trainer = trainer_for(output_dir, sb_strategy="sb", sb_keep=0.5)
    engine = trainer.engine
    for _ in range(3):
        engine.add_batch(selection_batch(trainer), True, trainer.model)
    assert counted == ["to host: cpu"] * 3  # the losses (one copy per batch)
    counted.clear()
    micro_batch = engine.next_step("cpu")[0]
    assert counted == [] and isinstance(micro_batch["pixel_values"], OnDevice)


def test_weighted_selection_waits_once(output_dir, counted):
    trainer = trainer_for(output_dir, sb_strategy="sb", sb_importance_weighting=True)
    trainer.engine.add_batch(selection_batch(trainer), True, trainer.model)
    assert counted == ["to host: cpu"]


def test_stale_sb_scoring_copies_ids_and_losses_together(output_dir, counted):
    trainer = trainer_for(output_dir, sb_strategy="sb", sb_staleness=2)
    engine = trainer.engine
    for _ in range(2):
        engine.add_batch(selection_batch(trainer), True, trainer.model)
    assert counted == ["to host: cpu"] * 2  # ids and losses for the store, which selection then uses
    counted.clear()
    # The store is refreshed by every training micro-batch: one copy each.
    inputs = engine.next_step("cpu")[0]
    trainer.model.train()
    trainer.compute_loss(trainer.model, inputs)
    assert counted == ["to host: cpu"]
    counted.clear()
    engine.epoch = 1  # a stale epoch read without a plan: stored losses for known ids, no forward
    engine.add_batch(selection_batch(trainer), True, trainer.model)
    assert counted == ["to host: cpu"]


def test_a_planned_batch_waits_once_for_its_ids(output_dir, counted):
    trainer = trainer_for(output_dir, sb_strategy="infobatch")
    engine = trainer.engine
    # InfoBatch's plan: every loaded example trains, with a loss weight.
    engine.epoch_plan = EpochPlan(copies=torch.ones(64, dtype=torch.int32), scored=torch.zeros(64, dtype=torch.bool),
                            weights=torch.full((64,), 2.0))
    engine.add_batch(selection_batch(trainer), True, trainer.model)
    assert counted == ["to host: cpu"]
    assert len(engine.queue) == 16


def test_a_stale_plan_scoring_new_examples_waits_twice(output_dir, counted):
    trainer = trainer_for(output_dir, sb_strategy="sb", sb_staleness=2)
    engine = trainer.engine
    known = torch.arange(64) % 2 == 0  # odd ids have no stored loss: they are scored
    engine.epoch_plan = EpochPlan(copies=known.to(torch.int32), scored=~known)
    engine.add_batch(selection_batch(trainer), True, trainer.model)
    assert counted == ["to host: cpu"] * 2  # the ids, then the scored rows' ids and losses
    assert engine.stats.selection_forwards == 8


@pytest.mark.parametrize("strategy", ["none", "sb"])
def test_a_recorded_training_step_does_not_wait_for_the_device(output_dir, monkeypatch, strategy):
    # Unlike `counted`, the class-label check stays: the model's own loss reads the labels first, so the
    # record's per-example loss skips it (it cost a GPU step about 10 % when it waited every step).
    monkeypatch.setattr(transfer, "to_device", lambda tensor, device: tensor.detach().as_subclass(OnDevice))
    trainer = trainer_for(output_dir, sb_strategy=strategy)
    trainer.record_keeper = RecordKeeper(trainer.accelerator, "index")  # as each training loop makes it
    trainer.model.train()
    OnDevice.syncs = []
    trainer.compute_loss(trainer.model, selection_batch(trainer))
    assert OnDevice.syncs == [] and len(trainer.record_keeper.feed) == 1
    assert trainer.per_example_loss_func.check_labels  # checked again where the model has not read the labels


def test_the_fake_device_sees_a_blocking_copy():
    OnDevice.syncs = []
    x = torch.arange(4).as_subclass(OnDevice)
    _ = x[torch.tensor([0, 2])]
    _ = x[x > 1]
    _ = int(x.sum())
    assert OnDevice.syncs == [
        "host tensor in a device op: __getitem__",
        "data-dependent size: boolean mask in __getitem__",
        "to host: __int__",
    ]


def test_to_host_takes_one_row_of_a_gathered_column():
    # One rank's row of gather_pairs' (rows, 2) result has stride 2: view(dtype) needs stride 1.
    rows = torch.tensor([[3.0, 0.25]], dtype=torch.float64)
    ids, losses = rows[:, 0].to(torch.int64), rows[:, 1].to(torch.float32)
    assert losses.stride() == (2,)
    copied = transfer.to_host(ids, losses)
    assert copied[0].tolist() == [3] and copied[1].tolist() == [0.25]
