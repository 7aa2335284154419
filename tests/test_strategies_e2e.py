"""Every strategy and every selection-pass option, end to end in SelectiveBackpropTrainer (CPU, ~30 s)."""

import math

import pytest
import torch
from tiny import TinyClassifier, make_config, make_dataset
from torch import nn

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.losses import cross_entropy_per_example
from hf_selective_backprop.models import ModelArguments, build_model
from hf_selective_backprop.selectors import keep_count
from hf_selective_backprop.trainer import WEIGHT_KEY

N, BATCH, EPOCHS = 250, 8, 2  # 31 full selection batches of 8 and one of 2 per epoch


class RecordingTrainer(SelectiveBackpropTrainer):
    """Records every micro-batch, every step's selection decision and the weighted losses."""

    def __init__(self, *args, **kwargs):
        self.per_example, self.step_weights = [], None
        super().__init__(*args, per_example_loss_func=self._record_per_example, **kwargs)
        self.micro_batches, self.steps, self.losses, self.scored = [], [], [], []

    def _record_per_example(self, outputs, labels):
        losses = cross_entropy_per_example(outputs, labels)
        self.per_example.append(losses.detach())
        return losses

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        seen, considered = self.engine.stats.examples_seen, self.engine.stats.considered
        batches, count = super().get_batch_samples(epoch_iterator, num_batches, device)
        if batches:
            step = self.state.global_step
            stats = self.engine.stats
            self.steps.append((step, stats.examples_seen - seen, stats.considered - considered))
        return batches, count

    def _build_engine(self):
        engine = super()._build_engine()
        score = engine._score

        def recording_score(batch, ids, model, *rest, **kwargs):
            self.scored.append(len(ids))
            return score(batch, ids, model, *rest, **kwargs)

        engine._score = recording_score
        return engine

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.micro_batches.append({k: v.clone() for k, v in inputs.items()})
        # The weights travel beside the model's inputs from here on (compute_loss does not see them).
        self.step_weights = inputs.get(WEIGHT_KEY)
        return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        assert WEIGHT_KEY not in inputs
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.step_weights is not None and model.training:
            per_example, weights = self.per_example[-1], self.step_weights
            denominator = num_items_in_batch if num_items_in_batch is not None else len(weights)
            expected = (per_example * weights).sum() / denominator
            plain = per_example.sum() / denominator
            self.losses.append((float(loss.detach()), float(expected), float(plain)))
        return loss


def train(output_dir, model=None, dataset=None, **overrides):
    settings = dict(per_device_train_batch_size=BATCH, num_train_epochs=EPOCHS)
    settings.update(overrides)
    trainer = RecordingTrainer(
        model=model or TinyClassifier(),
        args=make_config(output_dir, **settings),
        train_dataset=dataset if dataset is not None else make_dataset(N),
    )
    trainer.train()
    return trainer


def selection_batch_sizes(n, size):
    return [size] * (n // size) + ([n % size] if n % size else [])


STRATEGIES = {
    # A small learning rate keeps the loss distribution (and so SB's kept fraction) nearly stationary.
    "sb": dict(sb_strategy="sb", learning_rate=1e-3),
    "sb-weighted": dict(sb_strategy="sb", sb_importance_weighting=True, learning_rate=1e-3),
    "topk": dict(sb_strategy="topk"),
    "composer": dict(sb_strategy="composer"),
    "kath18": dict(sb_strategy="kath18"),
    "kath18-weighted": dict(sb_strategy="kath18", sb_importance_weighting=True),
    "uniform": dict(sb_strategy="uniform"),
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_trains_full_batches_and_keeps_what_its_rule_says(output_dir, name):
    overrides = STRATEGIES[name]
    trainer = train(output_dir, **overrides)
    stats = trainer.sb_stats
    assert stats["strategy"] == overrides["sb_strategy"]
    assert {len(batch["index"]) for batch in trainer.micro_batches} == {BATCH}
    assert len(trainer.micro_batches) == stats["optimizer_steps"] == trainer.state.global_step > 0
    assert stats["examples_seen"] == stats["considered"] == EPOCHS * N
    assert stats["backwards"] == stats["training_forwards"] == stats["kept"] - len(trainer.engine.queue)
    strategy = overrides["sb_strategy"]
    if strategy == "kath18":
        # One training batch drawn (with replacement) per selection batch of presample x batch rows.
        sizes = selection_batch_sizes(N, math.ceil(3 * BATCH))
        assert trainer.scored == sizes * EPOCHS
        assert stats["kept"] == EPOCHS * BATCH * len(sizes)
    elif strategy in ("topk", "composer"):
        sizes = selection_batch_sizes(N, BATCH)
        assert stats["kept"] == EPOCHS * sum(keep_count(1 / 3, n) for n in sizes)
    elif strategy == "uniform":
        # Decided once per epoch before loading: only the kept examples are ever loaded.
        assert stats["kept"] == stats["examples_loaded"] == EPOCHS * keep_count(1 / 3, N)
    else:
        # Coin flips with mean 1/3 (0.341 with the reweighted selector's probability floor).
        assert abs(stats["kept_fraction"] - 1 / 3) < 0.1
    if strategy == "uniform":
        assert stats["selection_forwards"] == 0 and trainer.scored == []
    else:
        assert stats["selection_forwards"] == EPOCHS * N
    weighted = overrides.get("sb_importance_weighting", False)
    assert all((WEIGHT_KEY in batch) == weighted for batch in trainer.micro_batches)
    if weighted:
        # compute_loss used the weights: the loss is the weighted per-example sum, not the plain one.
        assert len(trainer.losses) == len(trainer.micro_batches)
        for loss, expected, _ in trainer.losses:
            assert loss == pytest.approx(expected, rel=1e-5, abs=1e-6)
        assert any(abs(expected - plain) > 1e-3 for _, expected, plain in trainer.losses)
        assert not torch.allclose(torch.cat([b[WEIGHT_KEY] for b in trainer.micro_batches]), torch.tensor(1.0))


def test_importance_weights_change_training_but_not_the_draw(tmp_path):
    plain = train(str(tmp_path / "plain"), sb_strategy="kath18", num_train_epochs=1)
    weighted = train(str(tmp_path / "weighted"), sb_strategy="kath18", sb_importance_weighting=True, num_train_epochs=1)
    # Same seed, same scores: the first step trains the same rows; only the weights differ.
    assert torch.equal(plain.micro_batches[0]["index"], weighted.micro_batches[0]["index"])
    first = [p.detach() for p in plain.model.parameters()]
    second = [p.detach() for p in weighted.model.parameters()]
    assert not all(torch.allclose(a, b) for a, b in zip(first, second, strict=True))


def plain_and_selected(trainer):
    """(step, rows read) of the steps trained on an unselected batch, and those of selected ones."""
    plain = [(step, seen) for step, seen, considered in trainer.steps if considered == 0]
    selected = [(step, seen) for step, seen, considered in trainer.steps if considered > 0]
    return plain, selected


@pytest.mark.parametrize("window", [(0.5, 1.0), (0.0, 0.5)])
def test_sb_start_and_end_switch_selection_at_half_the_data(output_dir, window):
    start, end = window
    trainer = train(output_dir, dataset=make_dataset(256), sb_strategy="topk", sb_start=start, sb_end=end)
    stats = trainer.sb_stats
    plain, selected = plain_and_selected(trainer)
    assert plain and selected
    # One switch: plain steps before the selected ones (sb_start) or after them (sb_end).
    first, second = (plain, selected) if start > 0 else (selected, plain)
    assert max(step for step, _ in first) < min(step for step, _ in second)
    # The switch is at half of the 512 rows read, to within a step's selection batches.
    assert abs(stats["considered"] - 256) <= 2 * BATCH
    assert sum(seen for _, seen in plain) == stats["examples_seen"] - stats["considered"]
    assert stats["examples_seen"] == 512
    assert {len(batch["index"]) for batch in trainer.micro_batches} == {BATCH}


def test_sb_interrupt_makes_every_second_step_a_plain_full_batch(output_dir):
    trainer = train(output_dir, dataset=make_dataset(256), sb_strategy="topk", sb_interrupt=2)
    plain, selected = plain_and_selected(trainer)
    assert all(step % 2 == 1 for step, _ in plain)
    assert all(step % 2 == 0 for step, _ in selected)
    assert abs(len(plain) - len(selected)) <= 1
    # A plain step reads exactly one selection batch and trains it whole.
    assert {seen for _, seen in plain} == {BATCH}
    stats = trainer.sb_stats
    assert stats["examples_seen"] - stats["considered"] == BATCH * len(plain)
    assert {len(batch["index"]) for batch in trainer.micro_batches} == {BATCH}


# ---- selection-pass options on a conv net -------------------------------------------------------

IMAGE, CLASSES = 16, 3


class ImageRows(torch.utils.data.Dataset):
    def __init__(self, n=64, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(n, 3, IMAGE, IMAGE, generator=generator)
        self.labels = torch.randint(CLASSES, (n,), generator=generator)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"pixel_values": self.images[i], "labels": self.labels[i]}


class FlatImageMLP(nn.Module):
    """Flattens fixed-size images: a smaller input cannot reach its first Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * IMAGE * IMAGE, CLASSES))

    def forward(self, pixel_values, labels=None):
        logits = self.net(pixel_values)
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


def timm_model(name):
    return build_model(ModelArguments(model=name), CLASSES, IMAGE, (0.0,) * 3, (1.0,) * 3)


def record_selection_forwards(model):
    """Inputs and contexts of every forward run without gradients (the selection passes)."""
    seen = []

    def hook(module, args, kwargs):
        if not torch.is_grad_enabled():
            pixels = kwargs["pixel_values"]
            seen.append(
                dict(
                    shape=tuple(pixels.shape),
                    channels_last=pixels.is_contiguous(memory_format=torch.channels_last)
                    and not pixels.is_contiguous(),
                    inference_mode=torch.is_inference_mode_enabled(),
                    bf16=torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16,
                    training=module.training,
                )
            )

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


OPTIONS = {
    "bf16": dict(sb_selection_precision="bf16"),
    "scale": dict(sb_selection_scale=0.5),
    "channels_last": dict(sb_selection_channels_last=True),
    "inference_mode": dict(sb_selection_inference_mode=True),
    "selection_batch_4x": dict(sb_selection_batch_size=4 * BATCH),
    "all": dict(
        sb_selection_precision="bf16",
        sb_selection_scale=0.5,
        sb_selection_channels_last=True,
        sb_selection_inference_mode=True,
        sb_selection_batch_size=4 * BATCH,
    ),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_selection_pass_options_run_end_to_end_on_a_conv_net(output_dir, name):
    options = OPTIONS[name]
    model = timm_model("test_resnet")
    seen = record_selection_forwards(model)
    trainer = train(output_dir, model=model, dataset=ImageRows(64), num_train_epochs=1, **options)
    stats = trainer.sb_stats
    assert stats["selection_forwards"] == stats["examples_seen"] == 64
    assert {len(batch["index"]) for batch in trainer.micro_batches} == {BATCH}
    assert stats["optimizer_steps"] >= 2
    selection_size = options.get("sb_selection_batch_size", BATCH)
    assert trainer.scored == [selection_size] * (64 // selection_size)
    side = int(IMAGE * options.get("sb_selection_scale", 1.0))
    passes = [s for s in seen if s["shape"][0] > 1]  # not the one-example input check at train start
    assert [s["shape"] for s in passes] == [(selection_size, 3, side, side)] * len(trainer.scored)
    for s in passes:
        assert s["channels_last"] == options.get("sb_selection_channels_last", False)
        assert s["inference_mode"] == options.get("sb_selection_inference_mode", False)
        assert s["bf16"] == (options.get("sb_selection_precision") == "bf16")
        assert not s["training"]


@pytest.mark.parametrize("kind", ["mlp_on_features", "mlp_on_flattened_images", "vit_fixed_size"])
def test_selection_scale_on_a_model_that_cannot_take_it_fails_before_training(output_dir, kind):
    if kind == "mlp_on_features":
        model, dataset = TinyClassifier(), make_dataset(64)
    elif kind == "mlp_on_flattened_images":
        model, dataset = FlatImageMLP(), ImageRows(64)
    else:
        model, dataset = timm_model("test_vit"), ImageRows(64)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = RecordingTrainer(
        model=model,
        # sb_start=0.5: the first selection forward would come only after half of training.
        args=make_config(output_dir, per_device_train_batch_size=BATCH, sb_selection_scale=0.5, sb_start=0.5),
        train_dataset=dataset,
    )
    with pytest.raises(ValueError, match="--sb_selection_scale"):
        trainer.train()
    assert trainer.state.global_step == 0 and trainer.micro_batches == []
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
