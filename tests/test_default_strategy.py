"""The default runs wherever Trainer runs: where selection cannot, the default strategy steps aside (one warning,
trained as `none`) while a chosen one is refused; the example record, a by-product, turns itself off instead of
stopping a run; a subset run trains exactly its subset; the logged loss stays the Trainer's."""

from __future__ import annotations

import logging
import math
import pickle

import pandas
import pytest
import torch
from datasets import Dataset
from tiny import CLASSES, FEATURES, TinyClassifier, make_config, make_dataset
from torch import nn
from transformers import HfArgumentParser

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.default_strategy import DEFAULT_STRATEGY, CannotSelect, StrategySteppedAside, is_default
from hf_selective_backprop.logged_loss import LoggedLoss
from hf_selective_backprop.losses import ExampleLoss, NoPerExampleLoss, weighted_loss, weighted_loss_and_estimate


class LossOnly(nn.Module):
    """A model of one's own that returns only its loss: the Trainer trains it, the automatic per-example loss
    cannot read it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(FEATURES, CLASSES)

    def forward(self, pixel_values, labels=None):
        return {"loss": nn.functional.cross_entropy(self.net(pixel_values), labels)}


class TupleRows(torch.utils.data.Dataset):
    """Rows as (features, label) tuples, which a data collator of one's own turns into a batch."""

    def __init__(self, n: int = 64):
        data = make_dataset(n)
        self.x, self.y = data["pixel_values"], data["labels"]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, position: int):
        return self.x[position], self.y[position]


def collate_tuples(rows):
    return {"pixel_values": torch.stack([row[0] for row in rows]), "labels": torch.stack([row[1] for row in rows])}


def default_config(output_dir: str, **overrides) -> SelectiveBackpropConfig:
    return make_config(output_dir, sb_strategy=DEFAULT_STRATEGY, **overrides)


def test_the_default_is_told_apart_from_the_same_strategy_chosen():
    parser = HfArgumentParser(SelectiveBackpropConfig)
    (parsed,) = parser.parse_args_into_dataclasses(["--output_dir", "out"])
    (chosen,) = parser.parse_args_into_dataclasses(["--output_dir", "out", "--sb_strategy", "infobatch"])
    assert parsed.sb_strategy == chosen.sb_strategy == "infobatch"
    assert is_default(parsed) and not is_default(chosen)
    assert is_default(SelectiveBackpropConfig("out"))
    assert not is_default(SelectiveBackpropConfig("out", sb_strategy="infobatch"))
    assert is_default(pickle.loads(pickle.dumps(parsed)))  # training_args.bin keeps the mark
    assert parsed.to_dict()["sb_strategy"] == "infobatch"


@pytest.mark.parametrize("case", ["tuple rows", "loss-only model"])
def test_where_selection_cannot_run_the_default_steps_aside_and_a_chosen_strategy_is_refused(tmp_path, case):
    def trainer(args):
        if case == "tuple rows":
            return SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=TupleRows(),
                                            data_collator=collate_tuples)
        return SelectiveBackpropTrainer(model=LossOnly(), args=args, train_dataset=make_dataset(64))

    reason = "rows are tuples" if case == "tuple rows" else "automatic per-example loss"
    with pytest.raises(CannotSelect, match=reason):
        trainer(make_config(str(tmp_path / "chosen"), sb_strategy="infobatch"))
    args = default_config(str(tmp_path / "default"))
    with pytest.warns(StrategySteppedAside, match=reason) as caught:
        run = trainer(args)
    assert len([w for w in caught if w.category is StrategySteppedAside]) == 1
    assert args.sb_strategy == "none" and run.selector is None
    metrics = run.train().metrics
    assert metrics["sb/backwards"] == 2 * 64  # every example, each epoch: the Trainer's own loop


def test_a_loss_only_model_trains_under_none_with_the_record_turned_off_once(tmp_path, caplog):
    args = make_config(str(tmp_path / "out"), sb_strategy="none", save_strategy="no")
    trainer = SelectiveBackpropTrainer(model=LossOnly(), args=args, train_dataset=make_dataset(64))
    with caplog.at_level(logging.WARNING):
        trainer.train()
    offs = [r for r in caplog.records if "example record is off" in r.getMessage()]
    assert len(offs) == 1 and "per_example_loss_func" in offs[0].getMessage()
    assert not (tmp_path / "out" / "example_record.parquet").exists()
    plain = make_config(str(tmp_path / "plain"), sb_strategy="none", sb_record=False)
    reference = SelectiveBackpropTrainer(model=LossOnly(), args=plain, train_dataset=make_dataset(64))
    reference.train()
    # training went on exactly as without the record
    for mine, theirs in zip(trainer.model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs)


def test_tuple_rows_train_under_none_with_the_record_off_and_one_warning(tmp_path, caplog):
    args = make_config(str(tmp_path / "out"), sb_strategy="none")
    with caplog.at_level(logging.WARNING):
        trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=TupleRows(),
                                           data_collator=collate_tuples)
        trainer.train()
    offs = [r for r in caplog.records if "example record is off" in r.getMessage()]
    assert len(offs) == 1 and "tuples" in offs[0].getMessage()
    assert not (tmp_path / "out" / "example_record.parquet").exists()


def test_a_stream_without_ids_stops_the_record_with_one_warning(tmp_path, caplog):
    args = make_config(str(tmp_path / "out"), sb_strategy="none", max_steps=6)
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args,
                                       train_dataset=make_dataset(64).to_iterable_dataset())
    with caplog.at_level(logging.WARNING):
        trainer.train()
    record_warnings = [r for r in caplog.records if "record" in r.getMessage()]
    assert len(record_warnings) == 1 and "carry no 'index' column" in record_warnings[0].getMessage()
    assert trainer.state.global_step == 6


def test_the_default_trains_max_steps_on_a_stream_by_stepping_aside(tmp_path):
    args = default_config(str(tmp_path / "out"), max_steps=5)
    with pytest.warns(StrategySteppedAside, match="stream"):
        trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args,
                                           train_dataset=make_dataset(64).to_iterable_dataset())
    trainer.train()
    assert trainer.state.global_step == 5


def test_the_default_steps_aside_on_a_torch_stream_whose_columns_are_unknown(tmp_path):
    # Whether its rows carry ids shows only at the first batch, too late to step aside: it stopped the run there.
    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            data = make_dataset(64)
            yield from (data[i] for i in range(64))

    args = default_config(str(tmp_path / "out"), max_steps=5)
    with pytest.warns(StrategySteppedAside, match="does not say its columns before it is read"):
        trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=Rows())
    trainer.train()
    assert trainer.state.global_step == 5


def test_with_a_subset_the_default_trains_exactly_the_subset(tmp_path):
    full = make_config(str(tmp_path / "full"), sb_strategy="none", num_train_epochs=2, save_strategy="no")
    SelectiveBackpropTrainer(model=TinyClassifier(), args=full, train_dataset=make_dataset(100)).train()
    # as docs/record.md quotes it: no --sb_strategy, the recommended score by default
    args = default_config(str(tmp_path / "subset"), sb_subset_from=str(tmp_path / "full"), sb_subset_keep=0.7)
    assert args.sb_strategy == "none" and args.sb_subset_by == "variability"
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset(100))
    assert len(trainer.train_dataset) == 70
    assert trainer.train().metrics["sb/backwards"] == 2 * 70
    chosen = make_config(str(tmp_path / "chosen"), sb_strategy="infobatch", sb_subset_from=str(tmp_path / "full"),
                         sb_subset_keep=0.7)
    assert chosen.sb_strategy == "infobatch"  # named on purpose: it selects within the subset


def test_the_record_keys_examples_by_the_datasets_own_idx_column(tmp_path):
    data = make_dataset(64).remove_columns([]).add_column("idx", [1000 + 7 * i for i in range(64)])
    data = data.shuffle(seed=3)
    args = make_config(str(tmp_path / "out"), sb_strategy="none")
    SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=data).train()
    record = pandas.read_parquet(tmp_path / "out" / "example_record.parquet")
    assert sorted(record["index"]) == [1000 + 7 * i for i in range(64)]


def test_own_ids_that_cannot_key_examples_fall_back_to_positions_with_a_warning(tmp_path, caplog):
    data = Dataset.from_dict({**make_dataset(16).to_dict(), "id": [f"row{i}" for i in range(16)]})
    args = make_config(str(tmp_path / "out"), sb_strategy="none")
    with caplog.at_level(logging.WARNING):
        SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=data.with_format("torch"))
    assert any("own 'id' column cannot key" in r.getMessage() for r in caplog.records)


def test_the_weighted_mean_estimates_the_mean_loss_where_weights_rescale_a_pruned_batch():
    loss_fn = ExampleLoss("classification")
    logits = torch.randn(6, CLASSES)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    weights = torch.tensor([1.0, 1.0, 1.0, 2.0, 2.0, 2.0])
    objective, per_example, estimate = weighted_loss_and_estimate(loss_fn, {"logits": logits}, labels, weights)
    assert torch.allclose(objective, weighted_loss(loss_fn, {"logits": logits}, labels, weights)[0])
    assert torch.allclose(objective * estimate, (weights * per_example).sum() / weights.sum())
    unweighted = weighted_loss_and_estimate(loss_fn, {"logits": logits}, labels, torch.ones(6))
    assert float(unweighted[2]) == pytest.approx(1.0)


def test_logged_loss_reports_the_weighted_mean_and_the_objective_under_its_own_name():
    logged = LoggedLoss()
    assert logged.step_loss(torch.tensor(2.0)) == 2.0  # nothing weighted: the Trainer's own value
    logged.pending = torch.tensor(0.5)
    assert logged.step_loss(torch.tensor(3.0)) == 1.5
    logs = {"loss": 1.5}
    logged.add_to(logs, global_step=1, parallel_mode=None)
    assert logs[LoggedLoss.KEY] == 3.0


def test_under_infobatch_the_logged_loss_stays_below_the_weighted_objective(tmp_path):
    args = make_config(str(tmp_path / "out"), sb_strategy="infobatch", sb_prune_ratio=0.7, num_train_epochs=4,
                       logging_steps=4, per_device_train_batch_size=16)
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset(128))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h and LoggedLoss.KEY in h]
    assert logs
    later = [h for h in logs if h["epoch"] > 1.5]  # pruning started after the first epoch
    assert later and all(h["loss"] < h[LoggedLoss.KEY] for h in later)


def test_a_resumed_run_logs_the_weighted_objective_as_the_uninterrupted_one(tmp_path):
    # The objective per step since the last log: a resumed run counted its steps from 0, halving its first log.
    def run(folder, **overrides):
        args = make_config(str(tmp_path / folder), sb_strategy="infobatch", sb_prune_ratio=0.7, num_train_epochs=4,
                           logging_steps=4, save_strategy="steps", save_steps=8, **overrides)
        trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset(128))
        return trainer

    whole = run("whole")
    whole.train()
    checkpoint = sorted((tmp_path / "whole").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[1]
    resumed = run("resumed")
    resumed.train(resume_from_checkpoint=str(checkpoint))
    step = int(checkpoint.name.split("-")[1])

    def objectives(trainer):
        return {h["step"]: h[LoggedLoss.KEY] for h in trainer.state.log_history if LoggedLoss.KEY in h}

    after = {s: v for s, v in objectives(whole).items() if s > step}
    assert after
    assert {s: v for s, v in objectives(resumed).items() if s > step} == pytest.approx(after, rel=1e-3)


def test_early_prune_warns_without_keep_and_refuses_two_end_knobs(tmp_path):
    with pytest.warns(UserWarning, match="without --sb_keep keeps 0.333"):
        make_config(str(tmp_path), sb_strategy="early_prune")
    with pytest.raises(ValueError, match="--sb_end 0.8 and --sb_anneal_delta 0.5 both"):
        make_config(str(tmp_path), sb_strategy="early_prune", sb_keep=0.5, sb_end=0.8, sb_anneal_delta=0.5)
    with pytest.warns(UserWarning, match="on 2 epochs, 0.8 prunes none"):
        make_config(str(tmp_path), sb_strategy="early_prune", sb_keep=0.5, sb_end=0.8)


class AtChance(TinyClassifier):
    """A classifier whose answer stays uniform: every logit zero."""

    def __init__(self):
        super().__init__()
        for parameter in self.parameters():
            nn.init.zeros_(parameter)
        self.config = type("Config", (), {"num_labels": CLASSES, "problem_type": None})()


def test_early_prune_warns_when_it_ranks_by_losses_at_chance(tmp_path, caplog):
    args = make_config(str(tmp_path / "out"), sb_strategy="early_prune", sb_keep=0.5, learning_rate=0.0)
    trainer = SelectiveBackpropTrainer(model=AtChance(), args=args, train_dataset=make_dataset(64))
    assert trainer.selector.chance_loss == pytest.approx(math.log(CLASSES))
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert any("near chance" in r.getMessage() for r in caplog.records)


def test_a_per_example_loss_that_cannot_be_read_is_its_own_error():
    with pytest.raises(NoPerExampleLoss, match="per_example_loss_func"):
        ExampleLoss("classification")({"loss": torch.tensor(1.0)}, torch.tensor([0]))


class Configured(TinyClassifier):
    """TinyClassifier with a config that names its 3 labels, as transformers' classifiers have."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"num_labels": CLASSES, "problem_type": None})()


@pytest.mark.parametrize("strategy", [DEFAULT_STRATEGY, "none"])
def test_a_label_outside_the_classes_is_named_with_its_column_range_and_example(tmp_path, strategy):
    rows = make_dataset(64).to_dict()
    rows["labels"][37] = 7
    data = Dataset.from_dict(rows).with_format("torch")
    args = make_config(str(tmp_path / "out"), sb_strategy=strategy)
    trainer = SelectiveBackpropTrainer(model=Configured(), args=args, train_dataset=data)
    with pytest.raises(ValueError, match=r"'labels' column holds \[7\], outside the model's 3 classes.*'index' is 37"):
        trainer.train()
