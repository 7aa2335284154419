"""The selection engine: decisions before loading load nothing they drop; a user's strategy plugs in."""

import os

import pytest
import torch
import user_strategy  # noqa: F401  (registers --sb_strategy easiest)
from tiny import TinyClassifier, make_config, make_dataset

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.engine.checkpoints import STATE_FILE
from hf_selective_backprop.selectors import keep_count

N = 96


class CountingRows(torch.utils.data.Dataset):
    """A map-style dataset that counts how often each row is loaded."""

    def __init__(self, n: int = N):
        data = make_dataset(n)
        self.x, self.y = data["pixel_values"], data["labels"]
        self.loads = torch.zeros(n, dtype=torch.int64)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        self.loads[i] += 1
        return {"pixel_values": self.x[i], "labels": self.y[i]}


class TrainedIds(SelectiveBackpropTrainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        self.trained = getattr(self, "trained", [])
        self.trained.append(inputs["index"].clone())
        return super().training_step(model, inputs, num_items_in_batch)


def train(output_dir, dataset=None, trainer_cls=TrainedIds, resume=None, **overrides):
    trainer = trainer_cls(
        model=TinyClassifier(),
        args=make_config(output_dir, per_device_train_batch_size=4, **overrides),
        train_dataset=dataset if dataset is not None else make_dataset(N),
    )
    if isinstance(dataset, CountingRows):
        dataset.loads.zero_()  # construction peeks at a row to see whether it carries ids
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def resume_inside_a_planned_epoch(output_dir, tmp_path, **settings):
    """Train uninterrupted, then again from a checkpoint taken inside an epoch planned before loading: both runs."""
    full = train(output_dir, **settings)
    partial_dir = str(tmp_path / "partial")
    train(partial_dir, save_strategy="steps", save_steps=5, **settings)
    checkpoints = [os.path.join(partial_dir, name) for name in os.listdir(partial_dir) if name.startswith("checkpoint")]
    states = {path: torch.load(os.path.join(path, STATE_FILE), weights_only=True) for path in checkpoints}
    inside = [path for path, state in states.items() if state["plan"] is not None and state["consumed"] > 0]
    assert inside, "no checkpoint inside a planned epoch"
    resumed = train(str(tmp_path / "resumed"), resume=inside[0], **settings)
    assert resumed.state.global_step == full.state.global_step
    for ours, theirs in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    return full, resumed


def test_uniform_loads_only_the_examples_it_trains(output_dir):
    rows = CountingRows()
    trainer = train(output_dir, rows, sb_strategy="uniform", num_train_epochs=2)
    stats = trainer.sb_stats
    assert int(rows.loads.sum()) == stats["examples_loaded"] == stats["kept"] == 2 * keep_count(1 / 3, N)
    assert stats["examples_seen"] == 2 * N and stats["selection_forwards"] == 0
    trained = torch.cat(trainer.trained)
    assert set(trained.tolist()) == set(rows.loads.nonzero().squeeze(1).tolist())


def test_a_stale_epoch_loads_only_the_examples_it_trains(output_dir):
    rows = CountingRows()
    trainer = train(output_dir, rows, sb_strategy="sb", sb_beta=1.0, sb_staleness=2, num_train_epochs=2)
    stats = trainer.sb_stats
    # Epoch 0 scores everything; the stale epoch 1 decides from stored losses and loads only the kept.
    stale_loads = int(rows.loads.sum()) - N
    assert 0 < stale_loads < N / 2 + 16
    assert stats["examples_loaded"] == N + stale_loads
    assert stats["selection_forwards"] == N and stats["stale_lookups"] == N
    assert stats["examples_seen"] == 2 * N


def test_a_strategy_defined_outside_the_package_trains_with_staleness_and_resumes(output_dir, tmp_path):
    settings = dict(sb_strategy="easiest", sb_keep=0.5, sb_staleness=2, num_train_epochs=3)
    full = train(output_dir, **settings)
    assert full.selector.calls > 0
    # It trains what its rule says: the lower-loss half, so its kept fraction is exactly a half.
    assert full.sb_stats["kept_fraction"] == pytest.approx(0.5, abs=0.02)

    partial_dir = str(tmp_path / "partial")
    train(partial_dir, save_strategy="steps", save_steps=15, max_steps=-1, **settings)
    checkpoints = [os.path.join(partial_dir, name) for name in os.listdir(partial_dir) if name.startswith("checkpoint")]
    states = {path: torch.load(os.path.join(path, STATE_FILE), weights_only=True) for path in checkpoints}
    # A checkpoint inside the stale epoch 1, whose decisions were made before loading.
    (checkpoint,) = [path for path, state in states.items() if state["epoch"] == 1 and state["consumed"] > 0]
    assert states[checkpoint]["plan"] is not None
    resumed = train(str(tmp_path / "resumed"), resume=checkpoint, **settings)
    assert resumed.state.global_step == full.state.global_step
    for ours, theirs in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    assert resumed.selector.calls == full.selector.calls
