"""The SFT benchmark's report: throughput from each run's files, and each strategy beside its uniform control."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.sft_report import load_run, load_seeds, render, render_seeds

REPO = Path(__file__).resolve().parents[1]


def write_run(folder: Path, loss, accuracy, seconds, backwards, selection_forwards=0, kept=1.0):
    """What scripts/train_sft.py leaves in a run folder: 1,000 sequences of 10,000 tokens an epoch, 2 epochs."""
    folder.mkdir(parents=True)
    stats = {"train_seconds": seconds, "training_seconds": seconds * 0.8, "backwards": backwards,
             "examples_seen": 2000, "kept_fraction": kept,
             "selection_forwards": selection_forwards,
             "selection_forward_seconds": seconds * 0.1 if selection_forwards else 0.0}
    (folder / "sb_stats.json").write_text(json.dumps(stats))
    (folder / "eval_results.json").write_text(json.dumps({"eval_loss": loss, "eval_mean_token_accuracy": accuracy}))
    (folder / "train_results.json").write_text(json.dumps(
        {"num_train_epochs": 2, "train_tokens_per_epoch": 10_000, "train_sequences_per_epoch": 1_000}))
    return folder


@pytest.fixture
def runs(tmp_path):
    return [
        write_run(tmp_path / "none", 0.40, 0.80, seconds=100.0, backwards=2000),
        write_run(tmp_path / "sb", 0.45, 0.78, seconds=50.0, backwards=700, selection_forwards=2000, kept=0.35),
        write_run(tmp_path / "infobatch", 0.39, 0.81, seconds=80.0, backwards=1400, kept=0.7),
        write_run(tmp_path / "uniform-for-sb", 0.50, 0.75, seconds=40.0, backwards=700, kept=0.35),
        write_run(tmp_path / "uniform-for-infobatch", 0.38, 0.82, seconds=75.0, backwards=1400, kept=0.7),
    ]


def test_a_run_reads_its_throughput_over_the_epochs_it_read(runs):
    stats = load_run(str(runs[1]))
    assert stats["tokens_per_second"] == pytest.approx(20_000 / 50.0)
    assert stats["sequences_per_second"] == pytest.approx(2_000 / 50.0)
    assert (stats["eval_loss"], stats["eval_token_accuracy"]) == (0.45, 0.78)


def test_each_strategy_stands_beside_its_uniform_control(runs):
    report = render([(path.name, load_run(str(path))) for path in runs])
    assert "| none | 200 | 20.0 | 1.00x |" in report
    against = report.split("Against the uniform control")[1]
    # SB: a loss 0.05 below its control's, 3 points more accurate; InfoBatch: 0.01 above, 1 point less.
    assert "| sb | 2.00x | 2.50x | -0.0500 | +3.00 | yes |" in against
    assert "| infobatch | 1.25x | 1.33x | +0.0100 | -1.00 | no |" in against
    # One row a strategy that has a control; the controls themselves get none.
    named = [line.split(" | ")[0] for line in against.splitlines() if line.startswith("| ")]
    assert named[1:] == ["| sb", "| infobatch"]


def test_without_controls_the_report_is_the_throughput_table_alone(runs):
    report = render([(path.name, load_run(str(path))) for path in runs[:3]])
    assert "Against the uniform control" not in report
    assert report.count("\n| ") == 3  # a row a run, after the header


def test_the_script_prints_the_report(runs):
    result = subprocess.run([sys.executable, "benchmarks/sft_report.py", "--runs", *map(str, runs)], cwd=REPO,
                            capture_output=True, text=True, check=True)
    assert "| sb | 2.00x | 2.50x | -0.0500 | +3.00 | yes |" in result.stdout


def write_seed(folder: Path, traditional_loss, sb_loss, control_loss, sb_seconds=50.0):
    write_run(folder / "none", traditional_loss, 0.80, seconds=100.0, backwards=2000)
    write_run(folder / "sb", sb_loss, 0.78, seconds=sb_seconds, backwards=700, selection_forwards=2000, kept=0.35)
    write_run(folder / "uniform-for-sb", control_loss, 0.75, seconds=40.0, backwards=700, kept=0.35)


def test_over_seeds_each_run_is_a_mean_and_sd_and_each_strategy_meets_the_target_or_says_why_not(tmp_path):
    write_seed(tmp_path / "seed0", 0.40, 0.42, 0.45)
    write_seed(tmp_path / "seed1", 0.44, 0.43, 0.46, sb_seconds=100 / 1.5)
    (tmp_path / "seed2" / "sb").mkdir(parents=True)  # a seed whose Traditional run has not finished: left out
    report = render_seeds(load_seeds(str(tmp_path)))
    assert "2 seed(s) (seed0, seed1)" in report
    assert "| none | 0.4200 ± 0.0283 | 80.00 ± 0.00 | 1.00x | 1.00 |" in report
    assert "| sb | 0.4250 ± 0.0071 | 78.00 ± 0.00 | 1.75x | 0.35 |" in report
    # Traditional's mean + sd is 0.4483: SB's 0.4250 is inside it, at 1.75x, below its control in both seeds.
    assert "| sb | -0.0300, -0.0300 | +3.00, +3.00 | yes (0.4250) | yes (1.75x) | yes | yes |" in report
    assert "Traditional's training time: 100 ± 0 s." in report
    # The largest lossless saving: SB's; its control (0.4550 on average) is outside Traditional's spread.
    assert "- strategies: sb, 1.75x\n- uniform random subsets: none" in report
    stricter = render_seeds(load_seeds(str(tmp_path)), target=2.0)
    assert "| yes (0.4250) | no (1.75x) | yes | no |" in stricter


def test_a_run_without_token_accuracy_shows_none_rather_than_zero(tmp_path):
    write_seed(tmp_path / "seed0", 0.40, 0.42, 0.45)
    stats = tmp_path / "seed0" / "sb" / "eval_results.json"
    stats.write_text(json.dumps({"eval_loss": 0.42}))
    report = render_seeds(load_seeds(str(tmp_path)))
    assert "| sb | 0.4200 ± 0.0000 | - | 2.00x | 0.35 |" in report
    assert "| sb | -0.0300 | - | no (0.4200) |" in report  # one seed: the bar is Traditional's 0.40


def test_a_strategy_above_its_control_in_one_seed_misses_the_target(tmp_path):
    write_seed(tmp_path / "seed0", 0.40, 0.42, 0.45)
    write_seed(tmp_path / "seed1", 0.40, 0.47, 0.46)
    report = render_seeds(load_seeds(str(tmp_path)))
    row = next(line for line in report.splitlines() if line.startswith("| sb | -0.0300, +0.0100 |"))
    assert row.endswith("| no | no |")


def test_a_root_without_a_finished_seed_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no seed"):
        render_seeds(load_seeds(str(tmp_path)))
