"""Drop-in trust: selection ranks by the loss the user's model defines, a user's compute_loss override trains or
gets a named error, the id column never replaces a column the model reads, and selection off is the Trainer."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from tiny import TinyClassifier, make_config, make_dataset
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel, Trainer

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.engine import console
from hf_selective_backprop.engine.accounting import STATS_FILE
from hf_selective_backprop.losses import logits_of, per_example_loss_for
from hf_selective_backprop.record import DATA_MAP_FILE, RECORD_FILE
from hf_selective_backprop.record.keeper import RECORD_STATE_FILE, RecordCallback


class RegressionConfig(PretrainedConfig):
    model_type = "sb-test-regression"

    def __init__(self, a: float = 0.0, b: float = 0.0, loss: str = "mse", **kwargs):
        super().__init__(**kwargs)
        self.a, self.b, self.loss = a, b, loss


class RegressionModel(PreTrainedModel):
    """As transformers' own trainer tests write one: ``(loss, predictions)`` for float labels, and a config that
    keeps the default ``num_labels=2``."""

    config_class = RegressionConfig
    base_model_prefix = "regression"

    def __init__(self, config):
        super().__init__(config)
        self.a = nn.Parameter(torch.tensor(float(config.a)))
        self.b = nn.Parameter(torch.tensor(float(config.b)))
        self.post_init()

    def _init_weights(self, module):
        pass  # a and b come from the config

    def forward(self, input_x, labels=None, **kwargs):
        predictions = input_x * self.a + self.b
        if labels is None:
            return (predictions,)
        loss = getattr(nn.functional, f"{self.config.loss}_loss")(predictions, labels)
        return (loss, predictions)


def regression_data(n: int = 64) -> Dataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=generator)
    return Dataset.from_dict({"input_x": x.tolist(), "labels": (2 * x + 3).tolist()}).with_format("torch")


def regression_trainer(output_dir, loss="mse", **kwargs):
    return SelectiveBackpropTrainer(
        model=RegressionModel(RegressionConfig(loss=loss)), train_dataset=regression_data(),
        args=make_config(output_dir, per_device_train_batch_size=8, learning_rate=0.2, sb_keep=0.5,
                         num_train_epochs=5),
        **kwargs,
    )


# ---- the model's own loss ------------------------------------------------------------------------


def test_a_regression_model_with_the_default_label_count_is_scored_by_squared_error():
    model = RegressionModel(RegressionConfig(a=1.0))
    assert model.config.num_labels == 2 and model.config.problem_type is None
    labels = torch.tensor([1.0, 3.0, 5.0])
    outputs = model(input_x=torch.zeros(3), labels=labels)
    losses = per_example_loss_for(model)(outputs, labels)
    torch.testing.assert_close(losses, torch.tensor([1.0, 9.0, 25.0]))  # not binary cross-entropy
    torch.testing.assert_close(losses.mean(), outputs[0])


def _regression_error(model) -> float:
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(torch.tensor([1.0, -1.0]))[0], torch.tensor([5.0, 1.0])))


def test_a_regression_model_trains_with_selection_by_its_own_loss(output_dir):
    trainer = regression_trainer(output_dir)
    before = _regression_error(trainer.model)
    trainer.train()
    assert _regression_error(trainer.model) < before / 4
    assert 0 < trainer.sb_stats["backwards"] < trainer.sb_stats["examples_seen"]


def test_a_model_whose_loss_is_not_the_automatic_one_is_refused_with_both_values(output_dir):
    with pytest.raises(ValueError, match=r"regression.*RegressionModel.*averages [\d.]+ .*model's own loss is "
                                         r"[\d.]+.*per_example_loss_func"):
        regression_trainer(output_dir, loss="l1")
    # Its own per-example loss is accepted.
    trainer = regression_trainer(output_dir, loss="l1", per_example_loss_func=lambda out, y: (logits_of(out) - y).abs())
    trainer.train()
    assert trainer.sb_stats["backwards"] > 0


class DoubledLossClassifier(TinyClassifier):
    def forward(self, pixel_values, labels=None):
        outputs = super().forward(pixel_values, labels)
        if labels is not None:
            outputs["loss"] = 2 * outputs["loss"]
        return outputs


def test_a_classifier_whose_loss_differs_from_cross_entropy_is_refused(output_dir):
    with pytest.raises(ValueError, match="single_label_classification.*DoubledLossClassifier"):
        SelectiveBackpropTrainer(model=DoubledLossClassifier(), args=make_config(output_dir),
                                 train_dataset=make_dataset(32))
    # Selection off, or a strategy without a selection forward, does not score the model.
    SelectiveBackpropTrainer(model=DoubledLossClassifier(), args=make_config(output_dir, sb_strategy="none"),
                             train_dataset=make_dataset(32))


# ---- compute_loss overrides ----------------------------------------------------------------------


class DocsOverrideTrainer(SelectiveBackpropTrainer):
    """transformers' documented override: the model called on the inputs, no super()."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)  # TinyClassifier.forward takes no **kwargs: an id column would fail here
        loss = nn.functional.cross_entropy(outputs["logits"], labels)
        return (loss, outputs) if return_outputs else loss


def test_an_override_without_super_trains_plain_selection(output_dir):
    trainer = DocsOverrideTrainer(model=TinyClassifier(), args=make_config(output_dir, sb_keep=0.5),
                                  train_dataset=make_dataset(64))
    trainer.train()
    assert 0 < trainer.sb_stats["backwards"] < trainer.sb_stats["examples_seen"]


@pytest.mark.parametrize("overrides, lost", [
    (dict(sb_importance_weighting=True), "its example weights"),
    (dict(sb_staleness=2), "the refresh of its stored losses"),
])
def test_an_override_without_super_is_stopped_where_selection_needs_it(output_dir, overrides, lost):
    trainer = DocsOverrideTrainer(model=TinyClassifier(), args=make_config(output_dir, sb_keep=0.5, **overrides),
                                  train_dataset=make_dataset(64))
    with pytest.raises(RuntimeError, match=f"DocsOverrideTrainer.compute_loss did not call .*lost {lost}.*"
                                           r"super\(\).compute_loss"):
        trainer.train()
    assert trainer.state.global_step == 0


# ---- the id column -------------------------------------------------------------------------------


@pytest.mark.parametrize("column, what", [
    ("labels", "a label column"), ("label", "a label column"),
    ("pixel_values", "a required input of TinyClassifier"),
])
def test_the_id_column_never_takes_a_column_the_model_reads(output_dir, column, what):
    with pytest.raises(ValueError, match=f"--sb_index_column '{column}' names {what}: the example ids need a column"):
        SelectiveBackpropTrainer(model=TinyClassifier(), args=make_config(output_dir, sb_index_column=column),
                                 train_dataset=make_dataset(16))


def test_numbering_rows_under_a_named_id_column_is_said(output_dir, caplog):
    with caplog.at_level(logging.INFO, logger="hf_selective_backprop.engine.indexing"):
        SelectiveBackpropTrainer(model=TinyClassifier(), args=make_config(output_dir, sb_index_column="row_id"),
                                 train_dataset=make_dataset(16))
    warning = [r for r in caplog.records if "--sb_index_column 'row_id' is not a column" in r.getMessage()]
    assert len(warning) == 1 and warning[0].levelno == logging.WARNING and "0..15" in warning[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_selective_backprop.engine.indexing"):
        SelectiveBackpropTrainer(model=TinyClassifier(), args=make_config(output_dir), train_dataset=make_dataset(16))
    assert [r.levelno for r in caplog.records if "'index' is not a column" in r.getMessage()] == [logging.INFO]


# ---- selection off is the Trainer ----------------------------------------------------------------


def _run(trainer_class, output_dir: Path, **overrides):
    (output_dir / "checkpoint-1").mkdir(parents=True)  # a user's folder named like a checkpoint
    (output_dir / "checkpoint-1" / "notes.txt").write_text("mine")
    args = make_config(str(output_dir), sb_strategy="none", save_strategy="steps", save_steps=2, save_total_limit=2,
                       **overrides)
    trainer = trainer_class(model=TinyClassifier(), args=args, train_dataset=make_dataset(64))
    trainer.train()
    return trainer


def _console_base(callback_class: type) -> type:
    return callback_class.__bases__[0] if callback_class.__module__ == console.__name__ else callback_class


def _files(folder: Path) -> list[str]:
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*"))


@pytest.mark.parametrize("recorded", [False, True])
def test_selection_off_keeps_the_trainers_callbacks_state_and_rotation(tmp_path, recorded):
    """Without selection the trainer is the Trainer, with its counters in sb_stats.json; the example record (on by
    default) adds its callback, its table and data map in the output folder and its state in each checkpoint."""
    ours = _run(SelectiveBackpropTrainer, tmp_path / "ours", sb_record=recorded)
    theirs = _run(Trainer, tmp_path / "theirs")
    # The console's callbacks print fewer sb/* counters (engine/console.py): the Trainer's, subclassed.
    callbacks = [[_console_base(type(cb)) for cb in trainer.callback_handler.callbacks] for trainer in (ours, theirs)]
    assert callbacks[0] == callbacks[1] + ([RecordCallback] if recorded else [])
    added = {STATS_FILE} | ({RECORD_FILE, DATA_MAP_FILE} if recorded else set())
    ours_files = set(_files(tmp_path / "ours"))
    assert ours_files - {path for path in ours_files if path.endswith(RECORD_STATE_FILE)} == set(
        _files(tmp_path / "theirs")) | added
    for checkpoint in (tmp_path / "theirs").glob("checkpoint-*"):
        state = [json.loads((tmp_path / side / checkpoint.name / "trainer_state.json").read_text())
                 for side in ("ours", "theirs")]
        assert state[0]["stateful_callbacks"] == state[1]["stateful_callbacks"]
        assert state[0]["global_step"] == state[1]["global_step"]
        assert (tmp_path / "ours" / checkpoint.name / RECORD_STATE_FILE).is_file() == (
            recorded and checkpoint.name != "checkpoint-1")


def test_selection_off_keeps_the_counters_in_sb_stats_the_logs_and_sb_stats_json(tmp_path):
    args = make_config(str(tmp_path / "full"), sb_strategy="none", logging_steps=3, save_strategy="steps",
                       save_steps=5)
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset(64))
    metrics = trainer.train().metrics
    stats = trainer.sb_stats
    assert (stats["backwards"], stats["selection_forwards"], stats["kept_fraction"]) == (2 * 64, 0, 1.0)
    assert stats["optimizer_steps"] == trainer.state.global_step == 16 and metrics["sb/backwards"] == 128
    assert json.loads((tmp_path / "full" / STATS_FILE).read_text())["backwards"] == 128
    logged = [log["sb/backwards"] for log in trainer.state.log_history if "loss" in log]
    assert logged == [24, 48, 72, 96, 120]
    resumed = SelectiveBackpropTrainer(model=TinyClassifier(), args=make_config(
        str(tmp_path / "resumed"), sb_strategy="none"), train_dataset=make_dataset(64))
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-10"))
    assert resumed.sb_stats["backwards"] == 128


def test_resume_true_without_checkpoints_keeps_the_trainers_words(output_dir):
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=make_config(output_dir),
                                       train_dataset=make_dataset(16))
    with pytest.raises(ValueError, match=r"^No valid checkpoint found in output directory"):
        trainer.train(resume_from_checkpoint=True)


# ---- what the log says -----------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_an_epoch_too_small_for_a_step_is_said_once_as_carried_over_not_as_a_stop(output_dir, caplog):
    trainer_log = _Records()
    logging.getLogger("transformers.trainer").addHandler(trainer_log)
    try:
        with caplog.at_level(logging.WARNING, logger="hf_selective_backprop.engine.callback"):
            trainer = SelectiveBackpropTrainer(
                model=TinyClassifier(), train_dataset=make_dataset(16),
                args=make_config(output_dir, sb_keep=0.5, num_train_epochs=6),
            )
            trainer.train()
    finally:
        logging.getLogger("transformers.trainer").removeHandler(trainer_log)
    assert not [m for m in trainer_log.messages if "not to be a single sample" in m]
    said = [r.getMessage() for r in caplog.records if "fewer rows than one optimizer step" in r.getMessage()]
    assert len(said) == 1 and "stay queued" in said[0]
    assert trainer.state.global_step > 0 and trainer.sb_stats["examples_seen"] == 6 * 16
    # Outside a selective run the Trainer's logger is as it was.
    assert not logging.getLogger("transformers.trainer").filters


def test_kept_rows_the_run_ended_before_training_are_counted_and_said(output_dir, caplog):
    # Fewer rows than one step left queued is how a selective run ends: said in the log at INFO, not a warning.
    with caplog.at_level(logging.INFO, logger="hf_selective_backprop"):
        trainer = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(40),
                                           args=make_config(output_dir, sb_keep=0.5, num_train_epochs=1))
        trainer.train()
    stats = trainer.sb_stats
    assert stats["queued_at_end"] > 0
    assert stats["backwards"] + stats["queued_at_end"] == stats["kept"]
    said = [r for r in caplog.records if "still queued when the run ended" in r.getMessage()]
    assert len(said) == 1 and said[0].getMessage().startswith(f"{stats['queued_at_end']} rows")
    assert "fewer than one optimizer step takes (8 rows)" in said[0].getMessage()
    assert said[0].levelno == logging.INFO
    assert json.loads((Path(output_dir) / "sb_stats.json").read_text())["queued_at_end"] == stats["queued_at_end"]
    card = Path(trainer.create_model_card()).read_text()
    row = "kept rows left untrained when the run ended"
    assert f"| {row} | {stats['queued_at_end']} |" in card


def test_kept_rows_a_step_based_run_ended_before_are_counted_in_optimizer_steps(output_dir, caplog):
    # One step from a selection batch of 256: the rows left were several steps' worth, said to be less than one.
    # Whole steps' worth of kept rows untrained changes what the run trained: a warning.
    with caplog.at_level(logging.INFO, logger="hf_selective_backprop"):
        trainer = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(256), args=make_config(
            output_dir, sb_keep=0.5, max_steps=1, sb_selection_batch_size=256))
        trainer.train()
    queued = trainer.sb_stats["queued_at_end"]
    assert queued >= 2 * 8
    records = [r for r in caplog.records if "still queued when the run ended" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.WARNING]
    said = [r.getMessage() for r in records]
    assert len(said) == 1 and "fewer than one optimizer step" not in said[0]
    assert f"{queued} rows that selection kept were still queued when the run ended, {queued / 8:.1f} optimizer " \
           "steps' worth (8 rows a step) that the run ended before taking" in said[0]


def test_global_step_never_exceeds_the_max_steps_the_state_reports(output_dir):
    # An epoch-based run's max_steps is the expected step count: this run keeps more and makes 9 steps of 8.
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(64), args=make_config(
        output_dir, sb_strategy="kath18", num_train_epochs=3, save_strategy="steps", save_steps=1))
    trainer.train()
    assert trainer.sb_stats["expected_steps"] < trainer.state.global_step <= trainer.state.max_steps
    for folder in Path(output_dir).glob("checkpoint-*"):
        saved = json.loads((folder / "trainer_state.json").read_text())
        assert saved["global_step"] <= saved["max_steps"], folder.name


@pytest.mark.parametrize(("strategy", "epochs"), [("kath18", 1), ("sb", 3)], ids=["more-than-expected", "fewer"])
def test_the_progress_bar_ends_at_the_steps_the_run_took(output_dir, capsys, strategy, epochs):
    # The bar opens at the expected steps. Kath18 trains a step from every selection batch, the last (128 of 512
    # rows) too, so it takes 3 where a third of 512 rows makes 2 (the bar used to end "2/2 100%" and then "3it");
    # SB on this data keeps fewer than a third and takes 6 of the 8 expected (it used to end at "6/8").
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(512), args=make_config(
        output_dir, sb_strategy=strategy, sb_keep=1 / 3 if strategy == "sb" else None, num_train_epochs=epochs,
        per_device_train_batch_size=64, disable_tqdm=False))
    trainer.train()
    steps, expected = trainer.state.global_step, trainer.sb_stats["expected_steps"]
    assert (steps > expected) if strategy == "kath18" else (steps < expected)
    last = capsys.readouterr().err.split("\r")[-1]
    assert "100%" in last and f" {steps}/{steps} [" in last, last
    assert not re.search(r"\d+it \[", last), last


def test_a_kept_fraction_well_below_the_expected_one_is_explained():
    from hf_selective_backprop.engine.accounting import end_of_run_notes

    notes = end_of_run_notes({"kept_fraction": 0.14, "considered": 100, "queued_at_end": 0}, 1 / 3, 1024)
    assert len(notes) == 1 and notes[0][0] == logging.WARNING
    assert "kept 0.140" in notes[0][1] and "expected 0.333" in notes[0][1] and "--sb_history_size" in notes[0][1]
    assert not end_of_run_notes({"kept_fraction": 0.30, "considered": 100, "queued_at_end": 0}, 1 / 3, 1024)


# ---- which checkpoints a resume takes ----------------------------------------------------------------


def _saved_run(output_dir, **overrides):
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), train_dataset=make_dataset(64),
        args=make_config(output_dir, sb_keep=0.5, save_strategy="steps", save_steps=2, **overrides),
    )
    trainer.train()
    return sorted(Path(output_dir).glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))


@pytest.mark.parametrize("damaged, damage", [
    ("model.safetensors", lambda data: data[: len(data) // 2]),
    ("optimizer.pt", lambda data: b"garbage" * 10),
    ("sb_state.pt", lambda data: data[:-100]),
    ("trainer_state.json", lambda data: data[: len(data) // 2]),  # passed over without a word
    # A header length of 10^12 bytes: reading the header ended in a raw MemoryError.
    pytest.param("model.safetensors", lambda data: (10**12).to_bytes(8, "little") + data[8:], id="garbage-header"),
])
def test_an_unreadable_file_sends_resume_true_to_the_previous_checkpoint_and_an_explicit_resume_to_an_error(
        output_dir, caplog, damaged, damage):
    checkpoints = _saved_run(output_dir)
    newest, previous = checkpoints[-1], checkpoints[-2]
    path = newest / damaged
    path.write_bytes(damage(path.read_bytes()))
    resumed = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(64),
                                       args=make_config(output_dir, sb_keep=0.5, num_train_epochs=3))
    with pytest.raises(ValueError, match=rf"resume_from_checkpoint '.*{newest.name}': {damaged} cannot be read"):
        resumed.train(resume_from_checkpoint=str(newest))
    with caplog.at_level(logging.WARNING, logger="hf_selective_backprop.engine.checkpoints"):
        resumed.train(resume_from_checkpoint=True)
    assert any(f"passing over {newest}: {damaged} cannot be read" in r.getMessage() for r in caplog.records)
    assert resumed.state.global_step > int(previous.name.split("-")[1])


def test_a_save_only_model_checkpoint_is_refused_for_resume(output_dir):
    checkpoint = _saved_run(output_dir, save_only_model=True)[-1]
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(64),
                                       args=make_config(output_dir, sb_keep=0.5, num_train_epochs=3))
    with pytest.raises(ValueError, match=r"has no optimizer.pt: it was saved with save_only_model=True") as refused:
        trainer.train(resume_from_checkpoint=str(checkpoint))
    # The advice names what exists where it is read: the Python API has no --model_name_or_path.
    assert f"the model loaded with from_pretrained('{checkpoint}') and no resume_from_checkpoint" in str(refused.value)
    assert "--" not in str(refused.value)


def test_the_save_only_model_refusal_of_the_scripts_names_flags_they_have(output_dir):
    from dataclasses import fields

    from hf_selective_backprop.engine.checkpoints import require_resumable
    from hf_selective_backprop.text_models import TextModelArguments

    checkpoint = _saved_run(output_dir, save_only_model=True)[-1]
    with pytest.raises(ValueError, match=rf"saved with --save_only_model.*\(--model_name_or_path {checkpoint} and "
                       r"no --resume_from_checkpoint\)") as refused:
        require_resumable(str(checkpoint), "--resume_from_checkpoint")
    named = set(re.findall(r"--(\w+)", str(refused.value)))
    flags = {f.name for f in fields(TextModelArguments)} | {f.name for f in fields(SelectiveBackpropConfig)}
    assert named <= flags, named - flags  # scripts/train_text.py and train_sft.py have each


def test_warmup_that_covers_the_whole_run_is_warned_of(output_dir):
    with pytest.warns(UserWarning, match="--sb_warmup_epochs 3 covers the whole run .*never selects"):
        make_config(output_dir, sb_warmup_epochs=3, num_train_epochs=2)


def test_a_full_disk_during_a_save_says_so_naming_the_file_and_the_free_space(tmp_path, monkeypatch):
    # torch's writer turns the failed write into "unexpected pos ...", naming neither the file nor the cause.
    import errno
    import io
    import os

    from hf_selective_backprop.engine import checkpoints

    class FullDisk(io.FileIO):
        written = 0

        def write(self, data):
            self.written += len(data)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)

    monkeypatch.setattr(checkpoints, "open", lambda path, mode: FullDisk(path, mode), raising=False)
    target = tmp_path / "sb_state.pt"
    with pytest.raises(OSError, match=rf"^saving {target} failed \(no space left on device\); [\d.]+ MiB are free on "
                       r"its disk: free space \(or lower save_total_limit\)") as failed:
        checkpoints.atomic_save({"store": torch.zeros(10_000)}, str(target))
    assert "unexpected pos" not in str(failed.value)
    assert not list(tmp_path.iterdir())  # no partial file left behind


def test_a_failed_save_without_an_os_error_names_the_file_and_the_free_space(tmp_path, monkeypatch):
    from hf_selective_backprop.engine import checkpoints

    def full(obj, handle):
        handle.write(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 128 vs 64")

    monkeypatch.setattr(checkpoints.torch, "save", full)
    target = tmp_path / "sb_state.pt"
    with pytest.raises(OSError, match=rf"saving {target} failed \(RuntimeError: .*unexpected pos.*\); [\d.]+ MiB are "
                                      r"free on its disk"):
        checkpoints.atomic_save({"a": 1}, str(target))
    assert not list(tmp_path.iterdir())  # no partial file left behind


def test_a_checkpoint_file_replaces_a_link_in_its_place_and_at_the_old_temporary_name(tmp_path):
    """The selection state is written as the record is (`written_in_place_of`): a link at the file or at the
    fixed temporary name it once used (``sb_state.pt.partial``) is never followed; the file gets the permissions
    open() gives, not only its owner's."""
    from hf_selective_backprop.engine import checkpoints

    users_file = tmp_path / "users_file"
    users_file.write_text("mine")
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    (folder / "sb_state.pt").symlink_to(users_file)
    (folder / "sb_state.pt.partial").symlink_to(users_file)
    checkpoints.atomic_save({"a": 1}, str(folder / "sb_state.pt"))
    assert users_file.read_text() == "mine"
    assert not (folder / "sb_state.pt").is_symlink() and torch.load(folder / "sb_state.pt") == {"a": 1}
    plain = folder / "plain"
    plain.write_text("")
    assert (folder / "sb_state.pt").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    assert sorted(os.listdir(folder)) == ["plain", "sb_state.pt", "sb_state.pt.partial"]


def test_a_torn_temporary_leaves_a_checkpoint_folder_the_runs_own(tmp_path):
    """A save killed mid-write leaves ``.sb_state.pt.<random>.partial``: the folder still holds only checkpoint
    files for the rotation, and nothing else passes for such a temporary."""
    from hf_selective_backprop.engine.checkpoints import partial_target
    from hf_selective_backprop.engine.rotation import _holds_only_checkpoint_files

    assert partial_target(".sb_state.pt.1a2b3c4d.partial") == "sb_state.pt"
    assert partial_target("sb_state.pt.partial") is None and partial_target(".partial") is None
    own, torn = tmp_path / "checkpoint-2", tmp_path / "checkpoint-4"
    for folder in (own, torn):
        folder.mkdir()
        (folder / "trainer_state.json").write_text("{}")
    (own / "sb_state.pt").write_text("")
    (torn / ".sb_state.pt.1a2b3c4d.partial").write_text("half")
    assert _holds_only_checkpoint_files(str(torn), str(own))
    (torn / "notes.txt").write_text("a user's")
    assert not _holds_only_checkpoint_files(str(torn), str(own))


def test_sb_keep_given_to_infobatch_is_warned_of_as_not_applying(output_dir):
    with pytest.warns(UserWarning, match=r"--sb_keep 0.5 does not apply to --sb_strategy infobatch.*--sb_prune_ratio"):
        make_config(output_dir, sb_strategy="infobatch", sb_keep=0.5)


@pytest.mark.parametrize("given", ["keyword", "positional None"])
def test_without_arguments_the_trainer_makes_its_default_as_the_trainer_does(tmp_path, monkeypatch, given):
    """Trainer(model=...) makes TrainingArguments(output_dir="tmp_trainer"); so does the selective trainer, with the
    sb_* defaults, instead of refusing its own default arguments."""
    monkeypatch.chdir(tmp_path)
    data = make_dataset(64)
    plain = Trainer(model=TinyClassifier(), train_dataset=data)
    args = (TinyClassifier(),) if given == "keyword" else (TinyClassifier(), None)
    ours = SelectiveBackpropTrainer(*args, train_dataset=data)
    assert isinstance(ours.args, SelectiveBackpropConfig) and ours.args.sb_strategy == "infobatch"
    assert ours.args.output_dir == plain.args.output_dir == "tmp_trainer"
    for name in ("num_train_epochs", "learning_rate", "per_device_train_batch_size", "save_strategy", "report_to"):
        assert getattr(ours.args, name) == getattr(plain.args, name), name
    ours.train()
    assert ours.sb_stats["optimizer_steps"] == ours.state.global_step > 0
