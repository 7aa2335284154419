"""Resuming with other settings or data than the checkpoint's.

What selection depends on (strategy and its settings, Stale-SB's staleness, seeds, the training
data) cannot change: a clear ValueError before the first training step, naming the setting, the
saved and the new value and what to do. Other training settings may change: one warning lists them.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from tiny import CLASSES, FEATURES, TinyClassifier, make_config, make_dataset
from transformers import PretrainedConfig, TrainerCallback

from hf_selective_backprop import SelectiveBackpropTrainer

N = 96
SAVED = dict(sb_strategy="sb", sb_beta=1.0, num_train_epochs=2, save_strategy="steps", save_steps=3)


class TrainingStarted(TrainerCallback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append("train_begin")

    def on_step_begin(self, args, state, control, **kwargs):
        self.events.append("step")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint in epoch 0 of a plain SB run on 96 examples."""
    output_dir = tmp_path_factory.mktemp("saved")
    SelectiveBackpropTrainer(
        model=TinyClassifier(), args=make_config(str(output_dir), **SAVED), train_dataset=make_dataset(N)
    ).train()
    return str(output_dir / "checkpoint-3")


def resume(checkpoint: str, output_dir: str, dataset=None, **changes) -> tuple[SelectiveBackpropTrainer, list]:
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(),
        args=make_config(output_dir, **{**SAVED, "save_strategy": "no", **changes}),
        train_dataset=dataset if dataset is not None else make_dataset(N),
    )
    started = TrainingStarted()
    trainer.add_callback(started)
    trainer.started = started.events
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(resume_from_checkpoint=checkpoint)
    return trainer, [str(w.message) for w in caught if "hf_selective_backprop" in w.filename]


WHAT_TO_DO = (
    r"Resume with the saved values, or start a new run from the checkpoint's weights \(load the model from "
    r".*checkpoint-3, e.g. with from_pretrained, and train without resume_from_checkpoint\)"
)
INCOMPATIBLE = {
    "strategy": (dict(sb_strategy="topk"), None, r"--sb_strategy: saved 'sb', now 'topk'"),
    "staleness": (dict(sb_staleness=2), None, r"--sb_staleness: saved 1, now 2"),
    # Used to fail deep in the restore with KeyError: 'tau' (kath18's state is not sb's).
    "kath18": (dict(sb_strategy="kath18"), None, r"--sb_strategy: saved 'sb', now 'kath18'"),
    # Used to continue as a plain run, skipping batches by its step count instead of the rows read.
    "no_selection": (dict(sb_strategy="none"), None, r"--sb_strategy: saved 'sb', now 'none'"),
    "strategy_setting": (dict(sb_beta=2.0), None, r"--sb_beta: saved 1.0, now 2.0"),
    "seed": (dict(seed=1), None, r"--seed: saved 0, now 1"),
    # Used to end in a bare StopIteration.
    "smaller_dataset": ({}, lambda: make_dataset(N - 16), r"training dataset: saved 96 examples, now 80"),
    # Used to continue without a word.
    "larger_dataset": ({}, lambda: make_dataset(N + 32), r"training dataset: saved 96 examples, now 128"),
    "other_dataset": (
        {}, lambda: make_dataset(N, seed=1),
        r"training dataset: saved data with fingerprint \w{12}, now \w{12} \(the same size, 96 examples, but other "
        r"examples\)",
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", list(INCOMPATIBLE))
def test_what_selection_depends_on_cannot_change_on_resume(case, checkpoint, tmp_path):
    changes, dataset, names_it = INCOMPATIBLE[case]
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(),
        args=make_config(str(tmp_path), **{**SAVED, **changes}),
        train_dataset=dataset() if dataset else make_dataset(N),
    )
    started = TrainingStarted()
    trainer.add_callback(started)
    with pytest.raises(ValueError) as error:
        trainer.train(resume_from_checkpoint=checkpoint)
    message = str(error.value)
    assert message.startswith(f"Cannot resume from {checkpoint}: this run differs from the saved one in what "
                              "selection depends on:")  # fmt: skip
    assert len(message.splitlines()) == 3  # the one difference, then what to do
    assert re.search(names_it, message.splitlines()[1]), message
    assert re.search(WHAT_TO_DO, message), message
    assert started.events == []  # refused before training began


def test_several_differences_are_named_in_one_error(checkpoint, tmp_path):
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(),
        args=make_config(str(tmp_path), **{**SAVED, "sb_staleness": 3, "sb_history_size": 64}),
        train_dataset=make_dataset(N + 1),
    )
    with pytest.raises(ValueError) as error:
        trainer.train(resume_from_checkpoint=checkpoint)
    assert str(error.value).splitlines()[1:4] == [
        "  --sb_history_size: saved 1024, now 64",
        "  --sb_staleness: saved 1, now 3",
        "  training dataset: saved 96 examples, now 97",
    ]


def test_other_training_settings_continue_with_one_warning_that_lists_them(checkpoint, tmp_path):
    trainer, ours = resume(
        checkpoint, str(tmp_path), per_device_train_batch_size=4, learning_rate=0.01, num_train_epochs=3,
        logging_steps=5,
    )  # fmt: skip
    assert len(ours) == 1, ours
    assert ours[0] == (
        f"Resuming from {checkpoint} with training settings that differ from the saved run's: "
        "per_device_train_batch_size: saved 8, now 4; learning_rate: saved 0.05, now 0.01 (no effect: the optimizer "
        "and learning-rate scheduler restored from the checkpoint keep the saved one); num_train_epochs: saved 2, "
        "now 3; logging_steps: saved 1000, now 5; save_strategy: saved 'steps', now 'no'. The run continues with "
        "the new values from here on."
    )
    assert trainer.started[0] == "train_begin" and trainer.state.global_step > 3
    assert trainer.sb_stats["examples_seen"] == 3 * N  # the three epochs now asked for
    assert set(trainer.lr_scheduler.base_lrs) == {0.05}  # as the warning says


def test_the_same_settings_resume_without_a_warning(checkpoint, tmp_path):
    _, ours = resume(checkpoint, str(tmp_path), save_strategy="steps", save_steps=3)
    assert ours == []


class SizedClassifier(TinyClassifier):
    """TinyClassifier with a config that states its hidden size, as a transformers model's does."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.config = PretrainedConfig(hidden_size=hidden)
        self.net[0], self.net[3] = torch.nn.Linear(FEATURES, hidden), torch.nn.Linear(hidden, CLASSES)


def test_a_resume_into_another_model_is_refused_naming_what_differs(tmp_path):
    # Loading the weights failed with torch's raw "size mismatch" (or, for the same shapes, not at all).
    settings = dict(SAVED, save_steps=3, max_steps=3)
    SelectiveBackpropTrainer(model=SizedClassifier(), args=make_config(str(tmp_path / "saved"), **settings),
                             train_dataset=make_dataset(N)).train()
    trainer = SelectiveBackpropTrainer(model=SizedClassifier(hidden=32), args=make_config(str(tmp_path / "out"),
                                       **settings), train_dataset=make_dataset(N))
    started = TrainingStarted()
    trainer.add_callback(started)
    with pytest.raises(ValueError, match=r"checkpoint-3: this run's model differs from the saved one:\n  the "
                       r"model's hidden_size: saved 16, now 32\n"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "saved" / "checkpoint-3"))
    assert started.events == []
