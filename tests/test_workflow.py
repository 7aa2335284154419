"""scripts/train.py end to end on the bundled digits: train, evaluate, save, card, reload."""

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageClassification, HfArgumentParser, Trainer, TrainingArguments

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.data import DataArguments, load_image_data
from hf_selective_backprop.metrics import compute_metrics
from hf_selective_backprop.models import ModelArguments
from hf_selective_backprop.workflow import resume_checkpoint, train_image_classifier

ROOT = Path(__file__).resolve().parents[1]


def run_digits(output_dir, **overrides):
    parser = HfArgumentParser((SelectiveBackpropConfig, DataArguments, ModelArguments))
    settings = dict(
        output_dir=output_dir, dataset="digits", model="resnet18", image_size=16, max_train_samples=480,
        max_eval_samples=120, per_device_train_batch_size=32, per_device_eval_batch_size=120, num_train_epochs=2,
        learning_rate=2e-3, use_cpu=True, report_to="none", save_strategy="no", eval_strategy="epoch",
        disable_tqdm=True, sb_strategy="sb", sb_beta=2.0,
    )
    settings.update(overrides)
    config, data_args, model_args = parser.parse_dict(settings)
    return train_image_classifier(config, data_args, model_args), data_args


def test_train_evaluate_save_card_and_reload_with_the_same_accuracy(tmp_path):
    output_dir = str(tmp_path / "run")
    result, data_args = run_digits(output_dir)
    assert os.path.isfile(os.path.join(output_dir, "model.safetensors"))
    stats = json.loads(Path(output_dir, "sb_stats.json").read_text())
    assert stats["backwards"] == stats["optimizer_steps"] * 32
    assert [entry["epoch"] for entry in result.eval_history][:2] == [1.0, 2.0]  # evaluated every epoch

    card = Path(output_dir, "README.md").read_text()
    assert "sb_beta" in card and "selective-backprop" in card
    assert f"{100 * result.accuracy:.2f}" in card

    reloaded = AutoModelForImageClassification.from_pretrained(output_dir)
    data = load_image_data(data_args)
    evaluator = Trainer(
        model=reloaded, compute_metrics=compute_metrics,
        args=TrainingArguments(output_dir=str(tmp_path / "eval"), use_cpu=True, report_to="none",
                               per_device_eval_batch_size=120),
    )
    metrics = evaluator.evaluate(data.eval)
    assert metrics["eval_accuracy"] == pytest.approx(result.accuracy)


def test_traditional_run_reports_full_pass_costs(tmp_path):
    result, _ = run_digits(str(tmp_path / "none"), sb_strategy="none", eval_strategy="no", num_train_epochs=1)
    assert result.stats["backwards"] == 480
    assert result.stats["selection_forwards"] == 0


@pytest.mark.parametrize(("script", "own"), [
    ("train.py", ["--model MODEL", "--dataset DATASET", "--overwrite_output_dir"]),
    ("train_text.py", ["--model_name_or_path", "--dataset DATASET", "--task", "--overwrite_output_dir"]),
    ("train_sft.py", ["--model_name_or_path", "--dataset DATASET", "--overwrite_output_dir"]),
    ("pretrain_lm.py", ["--dataset DATASET", "--objective", "--vocab_size", "--overwrite_output_dir"]),
    ("compare.py", ["--strategies", "--model MODEL", "--dataset DATASET", "--overwrite_output_dir"]),
])
def test_scripts_list_their_own_flags_first_in_help(script, own, monkeypatch, capsys):
    # As the Hugging Face example scripts do: the script's model and data flags, then the Trainer's hundreds.
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "scripts" / script), run_name="__main__")
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out.split("options:", 1)[1]
    trainer_flags = shown.index("\n  --output_dir")
    assert all(0 <= shown.find(f"\n  {flag}") < trainer_flags for flag in own), script


def test_train_script_runs_from_the_command_line(tmp_path):
    output_dir = tmp_path / "cli"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--dataset", "digits", "--model", "resnet18",
         "--image_size", "16", "--max_train_samples", "256", "--max_eval_samples", "64",
         "--per_device_train_batch_size", "32", "--num_train_epochs", "1", "--sb_strategy", "sb", "--sb_staleness", "2",
         "--output_dir", str(output_dir), "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "strategy=sb accuracy=" in completed.stdout
    assert (output_dir / "README.md").is_file() and (output_dir / "sb_stats.json").is_file()
    torch.testing.assert_close(
        json.loads((output_dir / "sb_stats.json").read_text())["examples_seen"], 256
    )


# ---- paths checked before any data is decoded ------------------------------------------------


@pytest.fixture
def no_data(monkeypatch):
    """Fails the test if the workflow starts loading data: path errors must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("the data was loaded before the error")

    monkeypatch.setattr("hf_selective_backprop.workflow.load_image_data", refuse)


def test_output_dir_that_is_a_file_is_refused_and_left_as_it_is(tmp_path, no_data):
    mine = tmp_path / "results.txt"
    mine.write_text("the user's own file")
    with pytest.raises(ValueError, match=r"^--output_dir '.*results\.txt' is a file, not a folder; choose another"):
        run_digits(str(mine))
    with pytest.raises(ValueError, match=r"^--output_dir '.*results\.txt/run' cannot be created: .*results\.txt is a "
                       r"file, not a folder"):
        run_digits(str(mine / "run"))
    assert mine.read_text() == "the user's own file"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["results.txt"]


def test_output_dir_under_a_read_only_folder_is_refused(tmp_path, no_data, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.geteuid() == 0:
        # Permission bits do not bind root: report what any other user would be told by the OS.
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    try:
        with pytest.raises(ValueError, match=rf"^--output_dir '{locked}/a/run': its parent {locked} is not writable by "
                           r"this user; choose a writable --output_dir"):
            run_digits(str(locked / "a" / "run"))
        with pytest.raises(ValueError, match=rf"^--output_dir '{locked}' is not writable by this user"):
            run_digits(str(locked))
    finally:
        locked.chmod(0o700)


def fake_checkpoint(folder: Path, *files: str, state: str = "{}") -> Path:
    """A checkpoint folder holding ``files``: trainer_state.json holds ``state``, a torch file an empty dict
    (readable, as a complete checkpoint's are), anything else nothing."""
    folder.mkdir(parents=True)
    for name in files:
        if name.endswith(".pt"):
            torch.save({}, folder / name)
        else:
            (folder / name).write_text(state if name == "trainer_state.json" else "")
    return folder


def resume_config(output_dir, resume, **overrides) -> SelectiveBackpropConfig:
    return SelectiveBackpropConfig(
        output_dir=str(output_dir), resume_from_checkpoint=resume, use_cpu=True, report_to="none", **overrides
    )


@pytest.mark.parametrize("value", ["True", "true", "last"])
def test_resume_true_or_last_takes_the_last_complete_checkpoint(tmp_path, value):
    complete = fake_checkpoint(tmp_path / "checkpoint-20", "trainer_state.json", "sb_state.pt", "optimizer.pt")
    fake_checkpoint(tmp_path / "checkpoint-100", "trainer_state.json", "sb_state.pt", state='{"glob')  # torn
    fake_checkpoint(tmp_path / "checkpoint-30", "sb_state.pt")  # torn
    assert resume_checkpoint(resume_config(tmp_path, value)) == str(complete)
    # A plain run saves no sb_state.pt; like Trainer.train(True) it takes the highest checkpoint-N.
    plain = fake_checkpoint(tmp_path / "checkpoint-200", "trainer_state.json", "optimizer.pt")
    assert resume_checkpoint(resume_config(tmp_path, value, sb_strategy="none")) == str(plain)
    assert resume_checkpoint(resume_config(tmp_path, None)) is None


def test_resume_true_without_a_complete_checkpoint_names_the_flag_and_the_folder(tmp_path):
    fake_checkpoint(tmp_path / "run" / "checkpoint-10", "sb_state.pt")
    for output_dir in (tmp_path / "run", tmp_path / "nowhere"):
        with pytest.raises(ValueError, match=rf"^--resume_from_checkpoint 'True': no complete checkpoint \(a "
                           rf"checkpoint-N folder with trainer_state.json and sb_state.pt\) in --output_dir "
                           rf"'{output_dir}'; drop the flag to start a new run"):
            resume_checkpoint(resume_config(output_dir, "True"))


@pytest.mark.parametrize(
    "target, strategy, message",
    [
        ("nowhere", "sb", r"'.*nowhere': no such folder; pass a checkpoint-N folder of an earlier run, or True"),
        (".", "sb", r"'.*' is not a complete checkpoint: it lacks trainer_state.json, sb_state.pt; it holds "
                    r"checkpoint-5, checkpoint-10: pass one of them, or True"),
        ("checkpoint-5", "sb", r"'.*checkpoint-5' is not a complete checkpoint: it lacks sb_state.pt; it was saved by "
                               r"a run without selection .*: resume it with --sb_strategy none$"),
        ("checkpoint-10", "none", r"'.*checkpoint-10': its trainer_state.json is not valid JSON"),
    ],
)
def test_a_resume_path_that_is_not_a_checkpoint_names_the_flag_and_what_to_pass(tmp_path, target, strategy, message):
    fake_checkpoint(tmp_path / "checkpoint-5", "trainer_state.json")
    fake_checkpoint(tmp_path / "checkpoint-10", "trainer_state.json", "sb_state.pt", state="{")
    with pytest.raises(ValueError, match=rf"^--resume_from_checkpoint {message}"):
        resume_checkpoint(resume_config(tmp_path, str(tmp_path / target), sb_strategy=strategy))


@pytest.mark.parametrize("strategy", ["sb", "none"])
def test_a_checkpoint_with_selection_state_but_no_sb_state_is_refused_as_damaged(tmp_path, strategy):
    # It was taken for a run without selection's ("resume it with --sb_strategy none"), and following that advice
    # silently turned the selective run into a plain one.
    fake_checkpoint(tmp_path / "checkpoint-7", "trainer_state.json", "sb_rank_state_0.pt", "optimizer.pt")
    with pytest.raises(ValueError, match=r"^--resume_from_checkpoint '.*checkpoint-7': it holds sb_rank_state_0.pt, "
                       r"the selection state of a run with selection, but lacks sb_state.pt: it is damaged \(a run "
                       r"without selection would not continue it\); pass an earlier checkpoint, or True"):
        resume_checkpoint(resume_config(tmp_path, str(tmp_path / "checkpoint-7"), sb_strategy=strategy))


def test_a_bad_resume_path_fails_before_the_data_is_loaded(tmp_path, no_data):
    with pytest.raises(ValueError, match="--resume_from_checkpoint '.*nowhere': no such folder"):
        run_digits(str(tmp_path / "run"), resume_from_checkpoint=str(tmp_path / "nowhere"))


def test_evaluating_every_epoch_without_an_eval_split_fails_before_the_data_is_loaded(tmp_path, no_data):
    # Used to fail in the Trainer, after decoding the data and building the model.
    with pytest.raises(ValueError, match="^--eval_split none leaves nothing to evaluate, but --eval_strategy is "
                       "'epoch'; add --eval_strategy no"):
        run_digits(str(tmp_path / "run"), eval_split="none", eval_strategy="epoch")


def test_train_script_resumes_with_resume_from_checkpoint_true(tmp_path, monkeypatch):
    """The command line passes the string 'True': it resumes from the last complete checkpoint,
    skipping one a killed run left half written, and ends with the uninterrupted run's weights."""
    output_dir = tmp_path / "run"
    argv = ["train.py", "--dataset", "digits", "--model", "resnet18", "--image_size", "16", "--max_train_samples",
            "96", "--eval_split", "none", "--eval_strategy", "no", "--per_device_train_batch_size", "16",
            "--num_train_epochs", "2", "--sb_strategy", "sb", "--augment", "False", "--save_strategy", "epoch",
            "--use_cpu", "--disable_tqdm", "true", "--output_dir", str(output_dir)]
    steps = []
    training_step = SelectiveBackpropTrainer.training_step

    def counting_step(self, *args, **kwargs):
        steps.append(self.state.global_step)
        return training_step(self, *args, **kwargs)

    monkeypatch.setattr(SelectiveBackpropTrainer, "training_step", counting_step)
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(ROOT / "scripts" / "train.py"), run_name="__main__")
    uninterrupted = load_file(output_dir / "model.safetensors")
    first, last = sorted(output_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    (last / "trainer_state.json").unlink()  # killed while saving the second epoch
    first_epoch_steps = json.loads((first / "trainer_state.json").read_text())["global_step"]
    steps_of_the_full_run = len(steps)

    steps.clear()
    monkeypatch.setattr(sys, "argv", [*argv, "--resume_from_checkpoint", "True"])
    runpy.run_path(str(ROOT / "scripts" / "train.py"), run_name="__main__")
    assert steps and steps[0] == first_epoch_steps  # started after the first epoch, not from step 0
    assert len(steps) == steps_of_the_full_run - first_epoch_steps
    resumed = load_file(output_dir / "model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for name, tensor in uninterrupted.items():
        assert torch.equal(resumed[name], tensor), name
