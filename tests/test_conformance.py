"""Drop-in behaviour: what a user of transformers' Trainer relies on, with selection off and on.

Callback events (the final checkpoint and evaluation included), the files of the output folder,
train()'s metrics, a scheduler stepped by hand, and the log history of a resumed run. Tiny models,
seconds per test.
"""

from __future__ import annotations

import os

import pytest
import torch
from tiny import TinyClassifier, make_config, make_dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.cards import training_costs
from hf_selective_backprop.engine.accounting import STATS_FILE
from hf_selective_backprop.record import DATA_MAP_FILE, RECORD_FILE
from hf_selective_backprop.record.keeper import RECORD_STATE_FILE
from hf_selective_backprop.selectors import register_strategy
from hf_selective_backprop.selectors.uniform import UniformSelector

# The end of a run in the Trainer's order: its last step saves and evaluates, then the epoch and the
# training end. A selective run whose data runs out after its last step (which could not know it was
# the last) ends its epoch first, as the Trainer does with an epoch-based schedule.
AT_THE_LAST_STEP = ["step_end", "log", "evaluate", "save", "epoch_end", "log", "train_end"]
AFTER_THE_LAST_EPOCH = ["step_end", "epoch_end", "log", "evaluate", "save", "log", "train_end"]


def _without_clock(entry: dict) -> dict:
    # transformers' own resume tests leave these out too: only the clock (and, for train_loss, the
    # steps this train() call made) sets them.
    return {k: v for k, v in entry.items() if not k.endswith(("_runtime", "_per_second")) and k != "train_loss"}


class EventRecorder(TrainerCallback):
    """Every callback event that says where the run is, with its step."""

    def __init__(self):
        self.events = []

    def _record(name):
        def record(self, args, state, control, **kwargs):
            self.events.append((name, state.global_step))

        return record

    on_train_begin = _record("train_begin")
    on_epoch_begin = _record("epoch_begin")
    on_step_end = _record("step_end")
    on_evaluate = _record("evaluate")
    on_save = _record("save")
    on_log = _record("log")
    on_epoch_end = _record("epoch_end")
    on_train_end = _record("train_end")


def _files(folder: str) -> set[str]:
    return {
        os.path.relpath(os.path.join(root, name), folder) for root, _, names in os.walk(folder) for name in names
    }


def _run(trainer_cls, args, examples: int = 64, resume=None):
    recorder = EventRecorder()
    trainer = trainer_cls(
        model=TinyClassifier(), args=args, train_dataset=make_dataset(examples),
        eval_dataset=make_dataset(16, seed=1), callbacks=[recorder],
    )
    output = trainer.train(resume_from_checkpoint=resume)
    return trainer, output, recorder.events


SCHEDULE = dict(
    per_device_train_batch_size=8, num_train_epochs=2, learning_rate=0.05, report_to=[], use_cpu=True,
    disable_tqdm=True, seed=0, save_strategy="steps", save_steps=5, eval_strategy="steps", eval_steps=3,
    logging_steps=2,
)


def test_selection_off_is_the_trainer_in_events_files_metrics_and_logs(tmp_path):
    theirs, their_output, their_events = _run(Trainer, TrainingArguments(str(tmp_path / "trainer"), **SCHEDULE))
    ours, our_output, our_events = _run(
        SelectiveBackpropTrainer, make_config(str(tmp_path / "ours"), sb_strategy="none", **SCHEDULE)
    )
    assert our_events == their_events
    assert ("save", 16) in our_events and ("evaluate", 16) in our_events  # the final ones
    # Added: the counters (sb_stats.json, sb/* in metrics and logs) and the example record (its table and data map,
    # its state in each checkpoint).
    ours_files = _files(str(tmp_path / "ours"))
    assert {path for path in ours_files if not path.endswith(RECORD_STATE_FILE)} == _files(
        str(tmp_path / "trainer")) | {STATS_FILE, RECORD_FILE, DATA_MAP_FILE}
    assert {key for key in our_output.metrics if not key.startswith("sb/")} == their_output.metrics.keys()
    assert [{key for key in entry if not key.startswith("sb/")} for entry in ours.state.log_history] == [
        entry.keys() for entry in theirs.state.log_history]
    # The counters a comparison with selective runs reads are computed from the Trainer's own state.
    costs = training_costs(ours)
    assert costs["strategy"] == "none" and costs["backwards"] == 2 * 64 and costs["optimizer_steps"] == 16


def test_selection_off_with_save_strategy_no_leaves_the_output_folder_as_the_trainer_does(tmp_path):
    settings = {**SCHEDULE, "save_strategy": "no", "eval_strategy": "no"}
    _run(Trainer, TrainingArguments(str(tmp_path / "trainer"), **settings))
    _run(SelectiveBackpropTrainer, make_config(str(tmp_path / "ours"), sb_strategy="none", **settings))
    assert _files(str(tmp_path / "trainer")) == set()
    assert _files(str(tmp_path / "ours")) == {STATS_FILE, RECORD_FILE, DATA_MAP_FILE}  # the run's counters and record


@pytest.mark.parametrize(
    "epochs, expected_steps, order",
    [(3, 16, AFTER_THE_LAST_EPOCH), (1.5, 8, AT_THE_LAST_STEP)],
    ids=["data_runs_out_after_the_last_step", "last_step_reads_the_last_batch"],
)
def test_a_run_that_ends_short_of_its_estimate_saves_and_evaluates_at_its_last_step(
    tmp_path, epochs, expected_steps, order
):
    # 128 examples, batch 8, keep 1/3: 16 steps expected over 3 epochs, fewer made (the queue's
    # remainder is not trained). save_steps and eval_steps 500: only the final save and evaluation.
    args = make_config(str(tmp_path), num_train_epochs=epochs, save_strategy="steps", save_steps=500,
                       eval_strategy="steps", eval_steps=500)
    trainer, _, events = _run(SelectiveBackpropTrainer, args, examples=128)
    last = trainer.state.global_step
    assert 0 < last < trainer.state.max_steps == expected_steps
    assert [event for event in events if event[0] in ("evaluate", "save")] == [("evaluate", last), ("save", last)]
    assert {name for name in os.listdir(tmp_path) if name.startswith("checkpoint-")} == {f"checkpoint-{last}"}
    assert [name for name, _ in events[events.index(("step_end", last)):]] == order


class _UnderestimatedUniform(UniformSelector):
    """Keeps half, but tells the schedule a quarter: the run makes about twice its expected steps."""

    def expected_keep_fraction(self) -> float:
        return self.keep / 2


register_strategy("test-underestimated", lambda args: _UnderestimatedUniform(args.sb_keep_fraction))


def test_a_run_longer_than_its_estimate_saves_and_evaluates_on_schedule_only(tmp_path):
    args = make_config(str(tmp_path), sb_strategy="test-underestimated", sb_keep=0.5, save_strategy="steps",
                       save_steps=3, eval_strategy="steps", eval_steps=4)
    trainer, _, events = _run(SelectiveBackpropTrainer, args)
    last, expected = trainer.state.global_step, trainer.sb_stats["expected_steps"]
    assert last > expected + 3
    assert trainer.state.max_steps == last  # the estimate, outlived, raised to the steps taken
    saves = [step for name, step in events if name == "save"]
    evaluations = [step for name, step in events if name == "evaluate"]
    assert saves == [*range(3, last + 1, 3), *([last] if last % 3 else [])]
    assert evaluations == [*range(4, last + 1, 4), *([last] if last % 4 else [])]


@pytest.mark.parametrize("strategy", ["none", "sb"])
def test_a_scheduler_stepped_by_hand_outside_training_follows_its_own_steps(tmp_path, strategy):
    settings = dict(per_device_train_batch_size=8, learning_rate=0.1, lr_scheduler_type="linear", report_to=[],
                    use_cpu=True)
    reference = Trainer(model=TinyClassifier(), args=TrainingArguments(str(tmp_path / "t"), **settings),
                        train_dataset=make_dataset(64))
    ours = SelectiveBackpropTrainer(model=TinyClassifier(), args=make_config(str(tmp_path / "o"), sb_strategy=strategy,
                                    **settings), train_dataset=make_dataset(64))
    rates = []
    for trainer in (reference, ours):
        trainer.create_optimizer_and_scheduler(10)
        steps = []
        for _ in range(5):
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
            steps.append(trainer.lr_scheduler.get_last_lr()[0])
        rates.append(steps)
    assert rates[1] == rates[0] == pytest.approx([0.09, 0.08, 0.07, 0.06, 0.05])


@pytest.mark.parametrize("strategy", ["none", "sb"])
def test_a_resumed_run_has_the_uninterrupted_runs_log_history_and_state(tmp_path, strategy):
    settings = {**SCHEDULE, "save_steps": 4}
    args = make_config(str(tmp_path / "full"), sb_strategy=strategy, **settings)
    full, _, _ = _run(SelectiveBackpropTrainer, args)
    resumed_args = make_config(str(tmp_path / "resumed"), sb_strategy=strategy, **settings)
    resumed, _, _ = _run(SelectiveBackpropTrainer, resumed_args, resume=str(tmp_path / "full" / "checkpoint-4"))
    assert resumed.state.global_step == full.state.global_step
    assert resumed.state.epoch == full.state.epoch

    assert [_without_clock(entry) for entry in resumed.state.log_history] == [
        _without_clock(entry) for entry in full.state.log_history
    ]
    if strategy == "sb":
        assert any("sb/backwards" in entry for entry in full.state.log_history)
        assert not any(key.endswith("_seconds") for entry in full.state.log_history for key in entry)
        assert full.sb_stats["train_seconds"] > 0  # timings: in the final summary
    for theirs, ours in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(theirs, ours)
