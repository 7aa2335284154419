"""The benchmark runner on a text workload: padded batches, evaluations at fractions of an epoch."""

import json

import pytest

from harness.cli import BenchmarkArguments, main
from harness.workloads import text_workload
from hf_selective_backprop.data.text import TextDataArguments
from hf_selective_backprop.text_models import TextModelArguments

TINY_BERT = TextModelArguments(vocab_size=80, hidden_size=16, num_heads=2, num_layers=1, intermediate_size=32)
ROWS = 96  # the review folder's training rows


def benchmark(folder, output_dir, strategies: str, **settings):
    args = BenchmarkArguments(
        output_dir=output_dir, strategies=strategies, num_train_epochs=1, evals_per_epoch=4, batch_size=8,
        eval_batch_size=16, learning_rate=1e-3, optim="adamw_torch", seed=0, **settings,
    )
    data_args = TextDataArguments(dataset=str(folder), label_column="sentiment", max_length=16)
    return main(args, lambda seed: text_workload(data_args, TINY_BERT, seed))


def test_text_benchmark_evaluates_every_strategy_at_the_same_fractions_of_its_data(review_folder, tmp_path):
    report = benchmark(review_folder, str(tmp_path), "traditional,uniform", keep=0.5)
    logs = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in ("traditional", "uniform")}
    # Traditional steps every 8 rows read (1/12 of an epoch), uniform every 16 read (it keeps 4 of 8).
    for log, rows_per_step in ((logs["traditional"], 8), (logs["uniform"], 16)):
        epochs = [e["epoch"] for e in log["evals"]]
        assert len(epochs) == 4 and epochs[-1] == pytest.approx(1.0)
        for mark, epoch in zip((0.25, 0.5, 0.75, 1.0), epochs, strict=True):
            assert mark - 1e-9 <= epoch < mark + rows_per_step / ROWS
        assert log["settings"]["optim"] == "adamw_torch" and log["model"].startswith("bert-1x16")
        seconds = [e["train_wall_seconds"] for e in log["evals"]]
        assert seconds == sorted(seconds) and 0 < seconds[0]
    assert logs["traditional"]["stats"]["backwards"] == ROWS
    # Uniform keeps half of every selection batch of 8, so it backpropagates half the rows.
    assert logs["uniform"]["stats"]["backwards"] == ROWS // 2
    text = (tmp_path / "report.md").read_text()
    assert report == str(tmp_path / "report.md") and "Uniform" in text and "adamw_torch lr 0.001 wd" in text


def test_text_benchmark_measures_the_fit_of_the_first_training_rows_padded_as_it_trains(review_folder, tmp_path):
    benchmark(review_folder, str(tmp_path), "traditional", train_eval_samples=20)
    evals = json.loads((tmp_path / "traditional.json").read_text())["evals"]
    # 20 rows in evaluation batches of 16: whole shares of 20. Strictly below the first evaluation's median, then:
    # at most 9 of them (torch's median of an even count is the lower middle value). Not exactly 9: the folder
    # repeats 8 sentences, and copies in differently padded batches tie at the median on some CPUs, not on others.
    for entry in evals:
        for share in ("train_accuracy", "train_low_loss_share", "train_below_first_median_share"):
            assert (entry[share] * 20) == pytest.approx(round(entry[share] * 20))
    assert 0 < evals[0]["train_below_first_median_share"] <= 9 / 20
    medians = {entry["train_first_median_loss"] for entry in evals}
    assert len(medians) == 1 and 0 < medians.pop() < 5


def test_text_benchmark_refuses_a_language_model_task_before_training(review_folder, tmp_path):
    args = BenchmarkArguments(output_dir=str(tmp_path), strategies="traditional")
    data_args = TextDataArguments(dataset=str(review_folder), task="causal-lm")
    with pytest.raises(ValueError, match="--task 'causal-lm'"):
        main(args, lambda seed: text_workload(data_args, TINY_BERT, seed))
    assert not (tmp_path / "traditional.json").exists()
