"""scripts/train.py end to end on the bundled digits: train, evaluate, save, card, reload."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageClassification, HfArgumentParser, Trainer, TrainingArguments

from hf_selective_backprop import SelectiveBackpropConfig
from hf_selective_backprop.data import DataArguments, load_image_data
from hf_selective_backprop.metrics import compute_metrics
from hf_selective_backprop.models import ModelArguments
from hf_selective_backprop.workflow import train_image_classifier

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


@pytest.mark.parametrize("script", ["train.py", "compare.py"])
def test_scripts_show_help(script):
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert "--sb_strategy" in completed.stdout or "--strategies" in completed.stdout
    assert "--dataset" in completed.stdout


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
