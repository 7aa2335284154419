"""Numerical faults and hostile inputs (issue 6): what the trainer does with bad data.

Policy (docs/reliability.md): an example whose selection loss is NaN/inf is counted in
``nonfinite_losses``, never enters the loss history or the Stale-SB store and is never trained;
an epoch in which every scored loss is non-finite stops the run with a RuntimeError; inputs that
selection cannot use fail before training with an error naming the column or flag to change.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from datasets import Dataset
from tiny import CLASSES, FEATURES, TinyClassifier, make_config, make_dataset
from transformers import TrainerCallback

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.engine.queue import BatchQueue
from hf_selective_backprop.losses import check_class_labels, cross_entropy_per_example
from hf_selective_backprop.trainer import STATS_FILE

NAN_MARK, INF_MARK = 100.0, -100.0


class PoisonedClassifier(TinyClassifier):
    """NaN logits where the first feature is NAN_MARK; logits [0, -inf, -inf] where it is INF_MARK
    (an infinite loss for the rows labelled 1 or 2 that carry that mark)."""

    def forward(self, pixel_values, labels=None):
        logits = self.net(pixel_values)
        nan_rows = (pixel_values[:, 0] == NAN_MARK)[:, None]
        inf_rows = (pixel_values[:, 0] == INF_MARK)[:, None]
        logits = torch.where(nan_rows, torch.full_like(logits, float("nan")), logits)
        one_class = torch.full_like(logits, float("-inf"))
        one_class[:, 0] = 0.0
        logits = torch.where(inf_rows, one_class, logits)
        outputs = {"logits": logits}
        if labels is not None:
            outputs["loss"] = torch.nn.functional.cross_entropy(logits, labels)
        return outputs


class RecordingTrainer(SelectiveBackpropTrainer):
    """Keeps the ids (read before compute_loss pops them) and size of every training micro-batch."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.micro_batches = getattr(self, "micro_batches", [])
        self.sizes = getattr(self, "sizes", [])
        if self.args.sb_index_column in inputs:  # a stream has no ids
            self.micro_batches.append(inputs[self.args.sb_index_column].clone())
        self.sizes.append(len(inputs["labels"]))
        return super().training_step(model, inputs, num_items_in_batch)


def tensors(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=generator)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def dataset(x, y, **extra) -> Dataset:
    columns = {"pixel_values": x.tolist(), "labels": y.tolist(), **extra}
    return Dataset.from_dict(columns).with_format("torch")


def poisoned(n: int = 96, nan: int = 8, inf: int = 4) -> Dataset:
    """Rows 0..nan-1 give NaN losses, the next ``inf`` rows +inf losses."""
    x, y = tensors(n)
    x[:nan, 0] = NAN_MARK
    x[nan : nan + inf, 0] = INF_MARK
    y[nan : nan + inf] = 1
    return dataset(x, y)


def train(output_dir, data, model=None, trainer_cls=RecordingTrainer, **overrides):
    settings = dict(sb_strategy="sb", sb_beta=1.0, per_device_train_batch_size=4, num_train_epochs=3)
    settings.update(overrides)
    trainer = trainer_cls(model=model or PoisonedClassifier(), args=make_config(output_dir, **settings),
                          train_dataset=data)
    trainer.train()
    return trainer


def all_finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


# ---- non-finite losses ----------------------------------------------------------------------


@pytest.mark.parametrize("staleness", [1, 3])
def test_nonfinite_examples_are_counted_never_stored_and_never_trained(staleness, output_dir):
    trainer = train(output_dir, poisoned(), sb_staleness=staleness)
    trained = torch.cat(trainer.micro_batches)
    assert trainer.state.global_step > 0
    assert not bool(torch.isin(trained, torch.arange(12)).any())
    assert all_finite(trainer.model)
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    with open(os.path.join(output_dir, STATS_FILE)) as handle:
        stats = json.load(handle)
    # Every epoch scores the 12 poisoned rows once: a Stale-SB epoch finds no stored loss for them.
    assert stats["nonfinite_losses"] == 12 * 3
    history = trainer.selector.history.values()
    assert bool(torch.isfinite(history).all()) and history.numel() == (96 - 12) * 3
    if staleness > 1:
        losses, epochs = trainer.engine.store.lookup(torch.arange(96))
        assert bool(torch.isnan(losses[:12]).all()) and bool((epochs[:12] == -1).all())
        assert bool(torch.isfinite(losses[12:]).all())
        assert stats["selection_forwards"] == 96 + 2 * 12
        assert stats["stale_lookups"] == 2 * (96 - 12)
    else:
        assert len(trainer.engine.store) == 0


def test_an_all_nan_selection_batch_is_skipped(output_dir):
    # Sequential order and selection batches of 8: the first selection batch of each epoch is all NaN.
    trainer = train(output_dir, poisoned(nan=8, inf=0), sb_selection_batch_size=8, num_train_epochs=2,
                    train_sampling_strategy="sequential")
    trained = torch.cat(trainer.micro_batches)
    assert trainer.state.global_step > 0
    assert int(trained.min()) >= 8
    assert trainer.sb_stats["nonfinite_losses"] == 16
    assert all_finite(trainer.model)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("length", [dict(num_train_epochs=2), dict(max_steps=5)], ids=["epochs", "max_steps"])
def test_every_loss_nonfinite_fails_fast_instead_of_hanging(length, output_dir):
    trainer = RecordingTrainer(
        model=PoisonedClassifier(),
        args=make_config(output_dir, sb_strategy="sb", per_device_train_batch_size=4, **length),
        train_dataset=poisoned(n=32, nan=32, inf=0),
    )
    with pytest.raises(RuntimeError, match=r"every per-example loss scored in epoch 0 was NaN or inf"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all_finite(trainer.model)


class DivergingClassifier(TinyClassifier):
    """NaN logits once ``diverged`` is set (at the end of the first epoch), its weights staying finite."""

    diverged = False

    def forward(self, pixel_values, labels=None):
        if self.diverged:
            pixel_values = torch.full_like(pixel_values, float("nan"))
        return super().forward(pixel_values, labels)


class DivergesAfterFirstEpoch(TrainerCallback):
    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        model.diverged = True


@pytest.mark.parametrize("settings", [dict(sb_strategy="infobatch"), dict(sb_strategy="sb", sb_staleness=3)],
                         ids=["infobatch", "stale-sb-planned-epoch"])
def test_a_model_diverging_where_the_strategy_decides_before_loading_stops_the_run(settings, output_dir):
    # InfoBatch and a planned Stale-SB epoch decide from stored losses, without a selection forward: the
    # divergence shows first in the training loss, which once finished the run with every weight NaN.
    trainer = SelectiveBackpropTrainer(
        model=DivergingClassifier(), args=make_config(output_dir, per_device_train_batch_size=4, num_train_epochs=3,
                                                      **settings),
        train_dataset=make_dataset(64), callbacks=[DivergesAfterFirstEpoch()],
    )
    with pytest.raises(RuntimeError, match=r"the training loss of step \d+ was NaN or inf .*stopped before the "
                       r"optimizer step.*The model's outputs are non-finite \(diverged weights, a too-high learning "
                       r"rate"):
        trainer.train()
    assert trainer.model.diverged and trainer.state.epoch == pytest.approx(1.0)  # stopped in the second epoch
    assert all_finite(trainer.model)  # no step was taken on the non-finite loss
    assert trainer.engine.stats.nonfinite_losses == 1  # the first micro-batch that was non-finite


# ---- hostile inputs ---------------------------------------------------------------------------


def test_rows_labelled_minus_100_train_and_rank_lowest(output_dir):
    x, y = tensors(96)
    y[::4] = -100  # 24 ignored rows: loss 0, the lowest percentile
    trainer = train(output_dir, dataset(x, y), model=TinyClassifier(), per_device_train_batch_size=8)
    trained = torch.cat(trainer.micro_batches)
    ignored = int((trained % 4 == 0).sum())
    assert trainer.state.global_step > 0 and all_finite(trainer.model)
    assert ignored / trained.numel() < 0.25  # kept less often than their 25 % share of the data
    assert trainer.sb_stats["nonfinite_losses"] == 0


@pytest.mark.parametrize("bad", [CLASSES, 7, -2])
def test_out_of_range_label_names_the_column_and_the_range(bad, output_dir):
    x, y = tensors(64)
    y[5] = bad
    with pytest.raises(ValueError, match=rf"'labels' column holds \[{bad}\].*\[0, {CLASSES - 1}\].*-100"):
        train(output_dir, dataset(x, y), model=TinyClassifier())


def test_label_check_names_a_custom_label_column():
    logits = torch.zeros(3, 4)
    with pytest.raises(ValueError, match=r"'target' column holds \[4\]"):
        cross_entropy_per_example({"logits": logits}, torch.tensor([0, 4, -100]), label_name="target")
    check_class_labels(torch.tensor([0, 3, -100]), 4)  # in range: no error
    check_class_labels(torch.rand(3, 4), 4)  # soft labels are not class indices: not checked


def test_empty_dataset_is_a_clear_error(output_dir):
    with pytest.raises(ValueError, match="the training dataset is empty"):
        train(output_dir, make_dataset(0))


def test_dataset_smaller_than_one_batch_fails_before_training(output_dir):
    with pytest.raises(ValueError, match=r"an epoch of 3 examples .* fewer than one optimizer step"):
        train(output_dir, make_dataset(3), per_device_train_batch_size=8)


def test_selection_batches_smaller_than_the_training_batch_fill_every_micro_batch(output_dir):
    trainer = train(output_dir, make_dataset(96), model=TinyClassifier(), per_device_train_batch_size=8,
                    sb_selection_batch_size=3, gradient_accumulation_steps=2, num_train_epochs=2)
    assert {len(ids) for ids in trainer.micro_batches} == {8}
    assert len(trainer.micro_batches) == 2 * trainer.state.global_step > 0
    assert trainer.sb_stats["backwards"] == trainer.sb_stats["kept"] - len(trainer.engine.queue)


def test_index_column_with_gaps_works_under_stale_sb(output_dir):
    x, y = tensors(64)
    ids = [10 * i + 7 for i in range(64)]
    trainer = train(output_dir, dataset(x, y, index=ids), model=TinyClassifier(), sb_staleness=2,
                    num_train_epochs=2)
    assert len(trainer.engine.store) == max(ids) + 1
    stored = torch.isfinite(trainer.engine.store.losses).nonzero().squeeze(1)
    assert stored.tolist() == ids
    assert trainer.sb_stats["stale_lookups"] == 64
    assert set(torch.cat(trainer.micro_batches).tolist()) <= set(ids)


@pytest.mark.parametrize(
    "ids, match",
    [
        ([0, 1, 2, 3] * 16, r"--sb_index_column 'index' holds 60 duplicate ids"),
        (list(range(-1, 63)), r"--sb_index_column 'index' holds -1 at row 0: ids must be non-negative"),
        ([*range(63), 10**10], r"--sb_index_column 'index' holds 10000000000 at row 63: .* 111.8 GiB per process"),
        ([float(i) + 0.5 for i in range(64)], r"--sb_index_column 'index' must hold one non-negative integer id"),
    ],
    ids=["duplicates", "negative", "huge", "float"],
)
def test_bad_index_column_fails_fast_under_stale_sb(ids, match, output_dir):
    x, y = tensors(64)
    trainers = []
    with pytest.raises(ValueError, match=match):  # at construction, or at train() before the first step
        trainers.append(RecordingTrainer(model=TinyClassifier(), train_dataset=dataset(x, y, index=ids),
                                         args=make_config(output_dir, sb_strategy="sb", sb_staleness=3)))
        trainers[0].train()
    assert all(trainer.state.global_step == 0 for trainer in trainers)


def test_rows_repeated_by_select_are_duplicates_too(output_dir):
    data = make_dataset(64, with_index=True).shuffle(seed=1).select(list(range(64)) + [5])
    # The example record keys by the ids: refused when the trainer is built (without it, when Stale-SB's store is).
    with pytest.raises(ValueError, match="holds 1 duplicate ids"):
        RecordingTrainer(model=TinyClassifier(), train_dataset=data,
                         args=make_config(output_dir, sb_strategy="sb", sb_staleness=2))
    trainer = RecordingTrainer(model=TinyClassifier(), train_dataset=data,
                               args=make_config(output_dir, sb_strategy="sb", sb_staleness=2, sb_record=False))
    with pytest.raises(ValueError, match="holds 1 duplicate ids"):
        trainer.train()


def test_duplicate_ids_are_harmless_without_stale_sb(output_dir):
    x, y = tensors(64)
    # Without the example record, which keys by them (tests/test_record_trust.py refuses them with it).
    trainer = RecordingTrainer(model=TinyClassifier(), train_dataset=dataset(x, y, index=[0, 1] * 32),
                               args=make_config(output_dir, sb_strategy="sb", sb_record=False))
    trainer.get_train_dataloader()  # no id check: plain SB never looks ids up


def test_iterable_dataset_without_max_steps_is_the_trainers_clear_error(output_dir):
    with pytest.raises(ValueError, match="max_steps"):
        train(output_dir, make_dataset(64).to_iterable_dataset())


def test_iterable_dataset_with_max_steps_trains_full_micro_batches(output_dir):
    trainer = train(output_dir, make_dataset(64).to_iterable_dataset(), model=TinyClassifier(), max_steps=6,
                    gradient_accumulation_steps=2, sb_selection_batch_size=5)
    assert trainer.state.global_step == 6
    assert trainer.sizes == [4] * 12
    assert all_finite(trainer.model)


def test_length_grouped_sampling_is_refused_with_selection(output_dir):
    with pytest.raises(ValueError, match=r"--train_sampling_strategy group_by_length \(--group_by_length\)"):
        SelectiveBackpropConfig(output_dir=output_dir, sb_strategy="sb", train_sampling_strategy="group_by_length")
    with pytest.raises(ValueError, match="batch_rebalance"):
        SelectiveBackpropConfig(output_dir=output_dir, sb_strategy="uniform", train_sampling_strategy="batch_rebalance")
    SelectiveBackpropConfig(output_dir=output_dir, sb_strategy="none", train_sampling_strategy="group_by_length")


def test_rows_padded_to_different_lengths_cannot_share_a_batch():
    queue = BatchQueue()
    queue.push({"input_ids": torch.zeros(3, 7, dtype=torch.long), "labels": torch.zeros(3, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"column 'input_ids' has rows of shape \(9,\) here and \(7,\).*max_length"):
        queue.push({"input_ids": torch.zeros(2, 9, dtype=torch.long), "labels": torch.zeros(2, dtype=torch.long)})
    assert len(queue) == 3
