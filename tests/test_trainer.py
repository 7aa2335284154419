"""End-to-end behaviour of SelectiveBackpropTrainer on a tiny model (CPU, seconds)."""

import json
import os

import pytest
import torch
from tiny import TinyClassifier, make_config, make_dataset
from transformers import Trainer, TrainingArguments

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.cards import training_costs
from hf_selective_backprop.engine.scoring import SelectionScorer
from hf_selective_backprop.losses import cross_entropy_per_example


class RecordingTrainer(SelectiveBackpropTrainer):
    """Keeps the size and ids of every training micro-batch."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.micro_batches = getattr(self, "micro_batches", [])
        self.micro_batches.append(inputs["index"].clone())
        return super().training_step(model, inputs, num_items_in_batch)


def train(output_dir, trainer_cls=RecordingTrainer, dataset=None, model=None, **overrides):
    trainer = trainer_cls(
        model=model or TinyClassifier(),
        args=make_config(output_dir, **overrides),
        train_dataset=dataset if dataset is not None else make_dataset(),
    )
    trainer.train()
    return trainer


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.cpu_kernels
def test_none_is_exactly_the_trainer(output_dir):
    reference_args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=8, num_train_epochs=2, learning_rate=0.05,
        report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0,
    )
    reference = Trainer(model=TinyClassifier(), args=reference_args, train_dataset=make_dataset())
    reference.train()
    ours = train(output_dir, trainer_cls=SelectiveBackpropTrainer, sb_strategy="none")
    assert ours.state.global_step == reference.state.global_step
    assert torch.equal(weights(ours.model), weights(reference.model))


def test_every_micro_batch_is_full_and_backwards_equal_kept_minus_remainder(output_dir):
    trainer = train(
        output_dir, sb_strategy="sb", sb_beta=1.0, gradient_accumulation_steps=3,
        per_device_train_batch_size=4, sb_selection_batch_size=10, num_train_epochs=3,
    )
    sizes = {len(ids) for ids in trainer.micro_batches}
    assert sizes == {4}
    assert len(trainer.micro_batches) == 3 * trainer.state.global_step
    stats = trainer.sb_stats
    assert stats["backwards"] == stats["kept"] - len(trainer.engine.queue)
    assert stats["backwards"] == stats["optimizer_steps"] * 4 * 3
    assert stats["examples_seen"] == 3 * 256


def test_trained_rows_are_selected_rows_of_this_epoch_at_most_once(output_dir):
    trainer = train(output_dir, sb_strategy="sb", sb_beta=1.0, num_train_epochs=1)
    trained = torch.cat(trainer.micro_batches)
    assert trained.unique().numel() == trained.numel()
    assert 0 <= int(trained.min()) and int(trained.max()) < 256


def test_sb_stats_json_and_kept_fraction(output_dir):
    # A small learning rate keeps the loss distribution nearly stationary, so the realized
    # kept fraction is the rule's expectation 1/(beta+1) up to sampling noise.
    trainer = train(output_dir, sb_strategy="sb", sb_beta=2.0, learning_rate=1e-3, num_train_epochs=4,
                    dataset=make_dataset(1024))
    with open(os.path.join(output_dir, "sb_stats.json")) as handle:
        stats = json.load(handle)
    for key in ("selection_forwards", "training_forwards", "backwards", "optimizer_steps", "kept_fraction"):
        assert key in stats
    assert 0.25 <= stats["kept_fraction"] <= 0.42
    assert stats["backwards"] == stats["optimizer_steps"] * 8
    assert stats["selection_forwards"] == 4 * 1024
    logged = [entry for entry in trainer.state.log_history if "sb/kept_fraction" in entry]
    assert logged and logged[-1]["sb/backwards"] == stats["backwards"]


def test_stale_sb_forwards_one_epoch_in_three(output_dir):
    trainer = train(output_dir, sb_strategy="sb", sb_staleness=3, num_train_epochs=3)
    stats = trainer.sb_stats
    assert stats["selection_forwards"] == 256
    assert stats["stale_lookups"] == 2 * 256
    assert stats["examples_seen"] == 3 * 256


def test_stale_sb_store_holds_each_examples_own_loss(output_dir):
    # Loss = the example's id: any misalignment between ids and losses shows up directly.
    def loss_is_id(outputs, labels):
        return labels.float() + outputs["logits"].sum(dim=1) * 0

    dataset = make_dataset(96)
    dataset = dataset.map(lambda row, i: {"labels": i % 3}, with_indices=True)
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), train_dataset=dataset, per_example_loss_func=lambda o, y: loss_is_id(o, y),
        args=make_config(output_dir, sb_strategy="sb", sb_staleness=2, num_train_epochs=2, sb_selection_mode="eval",
                         dataloader_num_workers=0),
    )
    trainer.train()
    ids = torch.arange(96)
    losses, epochs = trainer.engine.store.lookup(ids)
    assert torch.equal(losses, (ids % 3).float())
    assert bool((epochs >= 0).all())


def test_index_column_is_added_and_kept_through_remove_unused_columns(output_dir):
    trainer = train(output_dir, sb_strategy="sb", num_train_epochs=1)
    assert "index" in trainer.train_dataset.column_names
    assert torch.equal(trainer.train_dataset[:]["index"], torch.arange(256))
    assert torch.cat(trainer.micro_batches).dtype == torch.int64


def test_epoch_based_run_reads_every_epoch_and_ends_its_schedule(output_dir):
    trainer = train(output_dir, sb_strategy="sb", sb_beta=2.0, num_train_epochs=3, logging_steps=1)
    assert trainer.state.epoch == pytest.approx(3.0)
    assert trainer.sb_stats["examples_seen"] == 3 * 256
    rates = [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]
    # Linear decay that follows data progress ends near zero whatever the realized step count.
    assert rates[-1] < 0.05 * 0.1


def test_max_steps_makes_exactly_that_many_steps_across_epochs(output_dir):
    trainer = train(output_dir, sb_strategy="sb", sb_beta=2.0, max_steps=25)
    assert trainer.state.global_step == 25
    assert trainer.sb_stats["examples_seen"] > 256  # 25 steps at keep 1/3 need more than one epoch


def test_warmup_epochs_train_on_everything(output_dir):
    trainer = train(output_dir, sb_strategy="sb", sb_warmup_epochs=1, num_train_epochs=2)
    stats = trainer.sb_stats
    assert stats["considered"] == 256
    assert stats["selection_forwards"] == 256


def test_selection_pass_in_eval_mode_leaves_batch_norm_and_mode_untouched():
    model = TinyClassifier(batch_norm=True).train()
    before = model.net[1].running_mean.clone()
    scorer = SelectionScorer(cross_entropy_per_example, mode="eval")
    batch = make_dataset(16)[:16]
    losses = scorer(model, {"pixel_values": batch["pixel_values"], "labels": batch["labels"]})
    assert model.training
    assert torch.equal(model.net[1].running_mean, before)
    model.eval()
    expected = torch.nn.functional.cross_entropy(model(batch["pixel_values"])["logits"], batch["labels"],
                                                 reduction="none")
    assert torch.allclose(losses, expected)


def test_train_mode_selection_updates_batch_norm():
    model = TinyClassifier(batch_norm=True).train()
    before = model.net[1].running_mean.clone()
    batch = make_dataset(16)[:16]
    SelectionScorer(cross_entropy_per_example, mode="train")(model, dict(batch))
    assert not torch.equal(model.net[1].running_mean, before)


def test_per_example_loss_matches_model_loss_with_label_smoothing():
    logits = torch.randn(6, 5)
    labels = torch.tensor([0, 4, 2, -100, 1, 3])
    per_example = cross_entropy_per_example({"logits": logits}, labels, label_smoothing=0.1)
    model_loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1)
    assert per_example[3] == 0
    assert torch.allclose(per_example.sum() / 5, model_loss)


def test_compute_loss_func_without_per_example_loss_is_refused(output_dir):
    with pytest.raises(ValueError, match="per_example_loss_func"):
        SelectiveBackpropTrainer(
            model=TinyClassifier(), args=make_config(output_dir), train_dataset=make_dataset(),
            compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs["logits"].mean(),
        )


def test_plain_training_arguments_are_refused(output_dir):
    with pytest.raises(TypeError, match="SelectiveBackpropConfig"):
        SelectiveBackpropTrainer(model=TinyClassifier(), args=TrainingArguments(output_dir=output_dir, use_cpu=True))


def test_dataset_too_small_for_one_step_fails_before_training(output_dir):
    with pytest.raises(ValueError, match="fewer than one optimizer step"):
        train(output_dir, sb_strategy="sb", dataset=make_dataset(16), per_device_train_batch_size=8)


def test_resume_reaches_the_same_weights(tmp_path):
    settings = dict(sb_strategy="sb", sb_beta=1.0, num_train_epochs=3, gradient_accumulation_steps=2,
                    sb_selection_batch_size=6)
    full = train(str(tmp_path / "full"), **settings)
    partial_dir = str(tmp_path / "partial")
    train(partial_dir, save_strategy="steps", save_steps=7, max_steps=-1, **settings)
    checkpoint = os.path.join(partial_dir, "checkpoint-7")
    resumed = RecordingTrainer(model=TinyClassifier(), args=make_config(partial_dir, **settings),
                               train_dataset=make_dataset())
    resumed.train(resume_from_checkpoint=checkpoint)
    assert resumed.state.global_step == full.state.global_step
    assert torch.equal(weights(resumed.model), weights(full.model))
    assert resumed.sb_stats["examples_seen"] == full.sb_stats["examples_seen"]



def test_traditional_reports_the_same_counters(output_dir):
    trainer = train(output_dir, trainer_cls=SelectiveBackpropTrainer, sb_strategy="none")
    stats = training_costs(trainer)
    assert stats["strategy"] == "none" and stats["selection_forwards"] == 0
    assert stats["examples_seen"] == stats["backwards"] == 2 * 256
    assert stats["optimizer_steps"] == trainer.state.global_step == 2 * 256 // 8
    # Computed from the Trainer's own state, and written as a selective run's are.
    with open(os.path.join(output_dir, "sb_stats.json")) as handle:
        assert json.load(handle) == trainer.sb_stats


@pytest.mark.parametrize("epochs", [0.5, 1.5])
def test_a_fractional_epoch_count_reads_exactly_that_share_of_the_data(output_dir, epochs):
    # 128 examples in selection batches of 8: half an epoch is 8 batches, and no ninth is read
    # for a step that the fraction's rows could not fill.
    trainer = train(output_dir, dataset=make_dataset(128), num_train_epochs=epochs)
    assert trainer.sb_stats["examples_seen"] == trainer.sb_stats["examples_loaded"] == epochs * 128
    assert trainer.state.epoch == epochs


@pytest.mark.parametrize("selection_batch", [64, 100])
def test_a_selection_batch_holding_the_whole_epoch_is_refused_before_training(output_dir, selection_batch):
    # It used to make one step of its last epoch and leave the rest of the kept rows untrained (8 of 32).
    trainer = RecordingTrainer(
        model=TinyClassifier(), args=make_config(output_dir, num_train_epochs=1, sb_keep=0.5,
                                                 sb_selection_batch_size=selection_batch),
        train_dataset=make_dataset(64),
    )
    with pytest.raises(ValueError, match=rf"--sb_selection_batch_size {selection_batch} reads a whole epoch \(64 "
                                         r"examples per process\).*at most 32, or --max_steps"):
        trainer.train()
    assert not hasattr(trainer, "micro_batches")  # refused before any step


def test_a_selection_batch_holding_the_whole_epoch_trains_with_max_steps(output_dir):
    trainer = train(output_dir, dataset=make_dataset(64), max_steps=6, sb_keep=0.5, sb_selection_batch_size=64)
    assert trainer.state.global_step == 6
