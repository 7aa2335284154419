"""Model outputs the automatic per-example loss reads (tuples, dicts) and the ones it refuses at construction."""

import logging

import pytest
import torch
from datasets import Dataset
from text_tiny import padded_batch, sequence_classifier
from tiny import FEATURES, TinyClassifier, make_config, make_dataset
from torch import nn
from transformers import default_data_collator

from hf_selective_backprop import SelectiveBackpropTrainer, loss_check


class TupleClassifier(TinyClassifier):
    """The Trainer's return_dict=False convention: (loss, logits) with labels, (logits,) without."""

    def forward(self, pixel_values, labels=None):
        outputs = super().forward(pixel_values, labels)
        return (outputs["loss"], outputs["logits"]) if labels is not None else (outputs["logits"],)


class Regressor(nn.Module):
    """Float labels and one output per example, squeezed to 1-D: nothing the automatic loss knows."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(FEATURES, 1)

    def forward(self, pixel_values, labels=None):
        prediction = self.net(pixel_values).squeeze(-1)
        outputs = {"prediction": prediction}
        if labels is not None:
            outputs["loss"] = nn.functional.mse_loss(prediction, labels)
        return outputs


class TwoHeads(TinyClassifier):
    def forward(self, pixel_values, labels=None):
        outputs = super().forward(pixel_values, labels)
        return {"loss": outputs.get("loss"), "scores": outputs["logits"], "features": pixel_values}


def regression_data(n: int = 32):
    data = make_dataset(n)
    return data.map(lambda row: {"labels": float(row["pixel_values"][0])}).with_format("torch")


def test_stale_sb_trains_a_model_that_returns_a_loss_logits_tuple(output_dir):
    trainer = SelectiveBackpropTrainer(model=TupleClassifier(), train_dataset=make_dataset(64),
                                       args=make_config(output_dir, sb_staleness=2, num_train_epochs=3))
    trainer.train()
    stats = trainer.sb_stats
    assert stats["stale_lookups"] > 0 and stats["backwards"] > 0
    # The store holds the per-example cross-entropies of the training forwards, not the batch loss.
    losses, _ = trainer.engine.store.lookup(torch.arange(64))
    assert torch.isfinite(losses).sum() >= stats["backwards"] // 2 and losses.unique().numel() > 8


@pytest.mark.parametrize(
    "model, data, message",
    [
        (TwoHeads, lambda: make_dataset(32), r"TwoHeads.*per_example_loss_func.*no 'logits'"),
    ],
)
def test_outputs_the_automatic_loss_does_not_fit_are_refused_at_construction(output_dir, model, data, message):
    with pytest.raises(ValueError, match=message):
        SelectiveBackpropTrainer(model=model(), train_dataset=data(), args=make_config(output_dir))
    # A strategy that reads no loss needs none.
    SelectiveBackpropTrainer(model=model(), train_dataset=data(), args=make_config(output_dir, sb_strategy="uniform"))
    # With a per-example loss of one's own it trains.
    trainer = SelectiveBackpropTrainer(
        model=model(), train_dataset=data(), args=make_config(output_dir, num_train_epochs=1),
        per_example_loss_func=lambda outputs, labels: torch.ones(len(labels)),
    )
    trainer.train()
    assert trainer.sb_stats["backwards"] > 0


def sentences(n: int = 8) -> Dataset:
    columns = {name: values.tolist() for name, values in padded_batch([6] * n).items()}
    return Dataset.from_dict({**columns, "labels": [i % 2 for i in range(n)]}).with_format("torch")


@pytest.mark.parametrize("model, data, kind", [
    (TinyClassifier, make_dataset, "TinyClassifier"),  # was refused, blaming per_example_loss_func
    (sequence_classifier, sentences, "BertForSequenceClassification"),  # was not checked, without a word
])
def test_the_construction_check_says_when_and_why_it_is_skipped(output_dir, caplog, model, data, kind):
    """Under DeepSpeed or FSDP on GPUs the model stays on the host until training starts, while the rows the check
    scores are prepared on the GPU (here: the model on another device than the rows)."""
    trainer = SelectiveBackpropTrainer(model=model(), train_dataset=data(8), args=make_config(output_dir))
    trainer.model.to("meta")
    with caplog.at_level(logging.WARNING, logger="hf_selective_backprop.loss_check"):
        loss_check.check_on_first_rows(trainer)
    assert (f"the automatic per-example loss is not checked against {kind}'s own loss when the trainer is built: "
            "its weights are on meta and the rows on cpu until training starts") in caplog.text


def test_a_regression_module_with_float_labels_is_scored_by_squared_error(output_dir):
    """Float labels beside one output per example: the automatic loss is squared error, which the check finds
    equal to the module's own MSE, so it trains without a per-example loss of its own."""
    trainer = SelectiveBackpropTrainer(model=Regressor(), train_dataset=regression_data(),
                                       args=make_config(output_dir, num_train_epochs=1))
    with torch.no_grad():
        outputs = trainer.model(torch.ones(3, FEATURES), labels=torch.zeros(3))
        torch.testing.assert_close(trainer.per_example_loss_func(outputs, torch.zeros(3)), outputs["prediction"] ** 2)
    trainer.train()
    assert 0 < trainer.sb_stats["backwards"] < trainer.sb_stats["examples_seen"]


def test_the_check_changes_neither_the_random_state_nor_the_model(output_dir, monkeypatch):
    def construct():
        torch.manual_seed(7)
        model = TinyClassifier(batch_norm=True)
        before = {key: value.clone() for key, value in model.state_dict().items()}
        SelectiveBackpropTrainer(model=model, train_dataset=make_dataset(32), args=make_config(output_dir))
        after = model.state_dict()
        assert all(torch.equal(before[key], after[key]) for key in before)  # BatchNorm statistics too
        return torch.rand(3)

    calls = []
    check = loss_check.check_per_example_loss
    monkeypatch.setattr(loss_check, "check_per_example_loss", lambda *args: calls.append(check(*args)))
    checked = construct()
    monkeypatch.setattr(loss_check, "check_per_example_loss", lambda *args: None)
    assert len(calls) == 1 and torch.equal(construct(), checked)


def test_a_batch_entry_that_is_not_one_row_per_example_is_named_before_the_first_step(output_dir):
    def collate(features):
        return {**default_data_collator(features), "max_length_q": 5}

    message = r"batch entry 'max_length_q' \(int\) is not one row per example"
    with pytest.raises(ValueError, match=message):  # the construction's check of the automatic loss
        SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(32), data_collator=collate,
                                 args=make_config(output_dir))
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(32), data_collator=collate,
                                       args=make_config(output_dir), per_example_loss_func=lambda o, y: y.float())
    with pytest.raises(ValueError, match=message):  # the first selection batch, for a model the check skips
        trainer.train()
    assert trainer.state.global_step == 0
