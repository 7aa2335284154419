"""Hazards that a GPU, NCCL, mixed precision or torch.compile would hit, shown on the CPU where a CPU can show them."""

import pytest
import torch
import torch.distributed as dist
from tiny import TinyClassifier, make_config, make_dataset
from torch import nn
from torch._dynamo.utils import counters
from transformers import Trainer, TrainerCallback

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.engine import SelectionEngine, distributed


def build(output_dir, trainer_cls=SelectiveBackpropTrainer, model=None, **overrides):
    return trainer_cls(
        model=model or TinyClassifier(), args=make_config(output_dir, **overrides), train_dataset=make_dataset(64)
    )


def _pretend(monkeypatch, **flags):
    """The Trainer as it would stand after creating an accelerator with these flags (FSDP, DeepSpeed)."""
    create = Trainer.create_accelerator_and_postprocess

    def create_then_flag(self):
        create(self)
        for name, value in flags.items():
            setattr(self, name, value)

    monkeypatch.setattr(Trainer, "create_accelerator_and_postprocess", create_then_flag)


def test_fsdp1_with_a_selection_forward_is_refused_at_construction(output_dir, monkeypatch):
    _pretend(monkeypatch, is_fsdp_enabled=True)
    monkeypatch.setattr(distributed, "fsdp_version", lambda accelerator: 1)
    with pytest.raises(ValueError, match=r"--sb_strategy sb runs selection forwards, supported under FSDP version 2"):
        build(output_dir, sb_strategy="sb")
    # Strategies without a selection forward add no forward of their own: the Trainer's collectives stay as they are.
    assert build(output_dir, sb_strategy="uniform").selector is not None


def test_fsdp2_with_a_selection_forward_is_accepted(output_dir, monkeypatch):
    """FSDP2 shards the module in place; the engine keeps forwards in lockstep (tests/test_sharded.py)."""
    _pretend(monkeypatch, is_fsdp_enabled=True)
    monkeypatch.setattr(distributed, "fsdp_version", lambda accelerator: 2)
    trainer = build(output_dir, sb_strategy="sb", sb_staleness=2)
    assert trainer._selection_model() is trainer.model_wrapped


def test_data_parallel_is_refused_naming_accelerate_launch(output_dir, monkeypatch):
    # As TrainingArguments finds it with two visible GPUs and no distributed launch.
    monkeypatch.setattr(type(make_config(output_dir)), "n_gpu", property(lambda self: 2))
    with pytest.raises(ValueError, match=r"2 GPUs in one process .*`accelerate launch`"):
        build(output_dir, sb_strategy="topk")
    build(output_dir, sb_strategy="none")  # Traditional is the Trainer's own DataParallel path


class CastingTrainer(SelectiveBackpropTrainer):
    """Casts floating inputs to bfloat16 in `_prepare_inputs`, as the Trainer does under DeepSpeed bf16."""

    def _prepare_input(self, data):
        data = super()._prepare_input(data)
        if isinstance(data, torch.Tensor) and torch.is_floating_point(data):
            return data.to(torch.bfloat16)
        return data


def test_selection_inputs_are_prepared_by_the_trainer(output_dir):
    # A bf16 model takes only bf16 inputs: the selection forward fails unless its inputs are prepared as training's.
    trainer = build(output_dir, CastingTrainer, model=TinyClassifier().to(torch.bfloat16), num_train_epochs=1)
    trainer.train()
    assert trainer.sb_stats["selection_forwards"] == 64
    assert trainer.sb_stats["optimizer_steps"] > 0


class DtypeRecorder(TinyClassifier):
    """Records the dtype of its first layer's output in each eval-mode forward (selection forwards)."""

    def __init__(self):
        super().__init__()
        self.eval_dtypes = set()
        self.net[0].register_forward_hook(self._record)

    def _record(self, module, args, output):
        if not self.training:
            self.eval_dtypes.add(output.dtype)


@pytest.mark.parametrize(("precision", "expected"), [("auto", torch.bfloat16), ("fp32", torch.float32)])
def test_selection_precision_takes_effect_under_mixed_precision_training(output_dir, precision, expected):
    model = DtypeRecorder()
    trainer = build(output_dir, model=model, bf16=True, num_train_epochs=1, sb_selection_precision=precision)
    model.eval_dtypes.clear()  # the construction check's forward runs before Accelerate patches autocast in
    trainer.train()
    assert model.eval_dtypes == {expected}
    # Accelerate's patch is back in place for training once the selection forward is done.
    assert "_original_forward" in model.__dict__ and model.forward != model._original_forward


def test_selection_model_unwraps_compiled_ddp_without_changing_the_training_model(output_dir, tmp_path):
    trainer = build(output_dir)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(trainer.model)
        trainer.model_wrapped = torch.compile(ddp, backend="eager")  # how Accelerate wraps DDP + torch_compile
        assert trainer._selection_model() is trainer.model
        assert trainer.model_wrapped._orig_mod is ddp  # training still goes through DDP
    finally:
        dist.destroy_process_group()
    compiled = trainer.model_wrapped = torch.compile(trainer.model, backend="eager")
    assert trainer._selection_model() is compiled  # one process: the selection forward stays compiled



@pytest.mark.parametrize(("sync_timers", "device", "waits"), [(True, "cuda", 2), (False, "cuda", 0), (True, "cpu", 0)])
def test_timers_wait_for_the_accelerator_only_when_asked(output_dir, monkeypatch, sync_timers, device, waits):
    calls = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: calls.append(device))
    trainer = build(output_dir, sb_sync_timers=sync_timers)
    # The engine as the trainer builds it, on an accelerator of this type (nothing runs on it here).
    accelerator = type("Accelerator", (), {"device": torch.device(device)})()
    engine = SelectionEngine(
        trainer.args, trainer.selector, trainer.engine.scorer, accelerator, 8, 8, forwards_in_lockstep=False
    )
    with engine.stats.timer("selection_forward_seconds"):
        assert len(calls) == waits // 2  # before the phase starts: work queued earlier is not its time
    assert calls == [torch.device(device)] * waits
    assert "synchronize" not in engine.stats.state_dict()


class GraphCounter(TrainerCallback):
    def __init__(self):
        self.graphs_after_epoch = []

    def on_epoch_end(self, args, state, control, **kwargs):
        self.graphs_after_epoch.append(counters["stats"]["unique_graphs"])


def test_torch_compile_compiles_a_bounded_number_of_graphs(output_dir):
    torch._dynamo.reset()
    counters.clear()
    # 100 examples in selection batches of 24: each epoch ends with a batch of 4; Stale-SB's second epoch
    # scores nothing; the selection forward runs in eval mode without gradients.
    args = make_config(
        output_dir, num_train_epochs=3, sb_staleness=2, sb_selection_batch_size=24,
        torch_compile=True, torch_compile_backend="eager",  # dynamo's guards and graphs without code generation
    )
    counter = GraphCounter()
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), args=args, train_dataset=make_dataset(100), callbacks=[counter]
    )
    try:
        trainer.train()
    finally:
        torch._dynamo.reset()  # no compiled code cached for later tests
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule"
    # Training (train mode, gradients), selection (eval mode, no gradients), and the first selection batch of
    # another size, after which dynamo treats the batch dimension as dynamic. Nothing more in later epochs.
    assert counter.graphs_after_epoch == [3, 3, 3]
