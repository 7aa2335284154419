"""The record benchmark's report (benchmarks/record_report.py) from run folders, and the label-issue metrics of
benchmarks/label_issues.py, and bench_record.py's clock of the record's own calls."""

import json
import time
from types import SimpleNamespace

import numpy
import pyarrow
import pyarrow.parquet
import pytest
from bench_record import RecordClock
from label_issues import build_parser, cross_validated_probabilities, text_rows
from record_report import pruning_rows, record_ranking_rows
from text_tiny import NEGATIVE, POSITIVE, word_tokenizer

from harness.label_metrics import auroc, ranking_metrics
from hf_selective_backprop.record.keeper import RecordKeeper


def _run(folder, accuracy, seconds, backwards):
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"loss": 1.0}, {"train_runtime": seconds}, {"eval_accuracy": accuracy / 100, "epoch": 6}]}))
    (folder / "sb_stats.json").write_text(json.dumps({"backwards": backwards}))


def test_pruning_rows_give_each_settings_accuracy_savings_and_whether_it_is_lossless(tmp_path):
    for seed, offset in ((0, -0.5), (1, 0.5)):
        root = tmp_path / f"seed{seed}"
        _run(root / "full", 90 + offset, 100.0, 1000)
        _run(root / "epoch1", 70, 30.0, 200)
        _run(root / "epoch1-mean_loss-keep0.5", 90 + offset, 50.0, 500)  # level with Traditional: lossless
        _run(root / "proxy_small", 60, 10.0, 200)  # a smaller proxy: a scoring run, not a setting
        _run(root / "random-keep0.5", 88, 50.0, 500)
    rows = pruning_rows(str(tmp_path))
    assert "lossless means at least 89.29 %" in rows[0]  # mean 90 minus sd 0.71
    assert rows[0].endswith("Scoring runs alone: 'epoch1' (2 seeds) 70.00 ± 0.00 % (30 s), 'proxy_small' (2 seeds) "
                            "60.00 ± 0.00 % (10 s).")
    assert not any(row.startswith("| proxy_small ") for row in rows)
    pruned = next(row for row in rows if row.startswith("| epoch1-mean_loss-keep0.5 "))
    # End to end: 1000 examples / (500 + its scoring run's 200), 100 s / (50 s + its 30 s); 89.5 and 90.5 against
    # the random subset's 88 in the same seed
    assert "| 90.00 ± 0.71 | yes | 2.00x | 2.00x | 1.43x | 1.25x | +2.00 (+1.50, +2.50) |" in pruned
    random = next(row for row in rows if row.startswith("| random-keep0.5 "))
    assert "| 88.00 ± 0.00 | no | 2.00x | 2.00x | 2.00x | 2.00x | - |" in random  # no scoring run to add
    assert "| epoch1-mean_loss-keep0.5 | 2.00x | 2.00x | 1.43x | 1.25x | no |" in rows  # lossless; random is not


def test_where_no_score_is_lossless_the_report_says_whether_the_random_subset_was(tmp_path):
    # It said "no pruned run kept Traditional's accuracy" while the random subset had.
    for seed, offset in ((0, -0.5), (1, 0.5)):
        root = tmp_path / f"seed{seed}"
        _run(root / "full", 90 + offset, 100.0, 1000)
        _run(root / "full-mean_loss-keep0.7", 85, 70.0, 700)
        _run(root / "random-keep0.7", 90 + offset, 70.0, 700)
        _run(root / "random-keep0.5", 88, 50.0, 500)
    assert pruning_rows(str(tmp_path))[-1] == ("None: no subset a score chose kept Traditional's accuracy; the random "
                                               "subset did, at kept share 0.7.")


def test_a_replications_seeds_pool_with_the_first_ones_and_the_same_seed_twice_is_refused(tmp_path):
    first, replication = tmp_path / "first", tmp_path / "replication"
    for root, seed, accuracy in ((first, 0, 89.0), (first, 1, 91.0), (replication, 2, 93.0)):
        _run(root / f"seed{seed}" / "full", accuracy, 100.0, 1000)
        _run(root / f"seed{seed}" / "full-variability-keep0.5", accuracy - 1, 50.0, 500)
    rows = pruning_rows(str(first), str(replication))
    assert rows[0].startswith("Traditional ('full', 3 seeds): 91.00 ± 2.00 %")
    assert "| full-variability-keep0.5 | 3 | 90.00 ± 2.00 | yes |" in next(row for row in rows if "keep0.5" in row)
    _run(replication / "seed1" / "full", 90.0, 100.0, 1000)
    with pytest.raises(ValueError, match=r"same seed folders \(seed1\)"):
        pruning_rows(str(first), str(replication))


def test_auroc_and_precision_at_the_flip_count():
    flipped = numpy.array([True, True, False, False, False])
    perfect = numpy.array([0.9, 0.8, 0.1, 0.2, 0.3])
    assert auroc(perfect, flipped) == 1.0 and auroc(-perfect, flipped) == 0.0
    assert auroc(numpy.zeros(5), flipped) == pytest.approx(0.5)  # all tied
    metrics = ranking_metrics(numpy.array([0.9, 0.1, 0.8, 0.2, 0.3]), numpy.array([1, 0, 1, 0, 0], bool), flipped)
    assert metrics["precision_at_flips"] == 0.5 and metrics["recall_flagged"] == 0.5
    assert metrics["precision_flagged"] == 0.5 and metrics["auroc"] == pytest.approx(3 / 6)  # 0.9 beats 3, 0.1 none


def test_every_ranking_of_a_noisy_runs_record_is_scored_beside_cleanlabs(tmp_path):
    run = tmp_path / "noise0.2" / "seed0" / "full"
    run.mkdir(parents=True)
    flipped = numpy.array([3, 7], dtype=numpy.int64)
    ids = numpy.arange(10)
    is_flipped = numpy.isin(ids, flipped)
    pyarrow.parquet.write_table(pyarrow.table({
        "index": ids,
        "confidence": numpy.where(is_flipped, 0.1, 0.9),  # finds both flips
        "mean_loss": numpy.where(is_flipped, 0.1, 2.0),  # ranks them last
        "first_loss": ids.astype(float), "last_loss": ids.astype(float), "correctness": ids / 10.0,
        "first_learned_epoch": numpy.where(is_flipped, -1, 1),  # never learned: the likeliest issues
        "forgetting_events": numpy.zeros(10, dtype=numpy.int32),
    }), run / "example_record.parquet")
    flipped.tofile(run / "noisy_indices.int64")
    (run.parent / "cleanlab").mkdir()
    (run.parent / "cleanlab" / "label_issues.json").write_text(json.dumps(
        {"cleanlab": {"precision_at_flips": 0.5, "auroc": 0.75, "trainings": 5}}))
    rows = record_ranking_rows(str(tmp_path))
    assert "| lowest mean confidence (by='confidence') | 1.000 ± 0.000 (1.000) | 1.000 ± 0.000 (1.000) |" in rows
    assert "| highest mean loss (by='mean_loss') | 0.000 ± 0.000 (0.000) | 0.000 ± 0.000 (0.000) |" in rows
    assert "| latest first learned (never: last) | 1.000 ± 0.000 (1.000) | 1.000 ± 0.000 (1.000) |" in rows
    assert "| most forgetting events | 0.000 ± 0.000 (0.000) | 0.500 ± 0.000 (0.500) |" in rows  # all tied
    assert "| cleanlab 5-fold (5 trainings) | 0.500 ± 0.000 (0.500) | 0.750 ± 0.000 (0.750) |" in rows
    assert not any("area under the margin" in row for row in rows)  # this record predates the aum column


def test_the_record_clock_adds_up_the_time_inside_the_records_calls_and_puts_them_back():
    original = RecordKeeper.flush
    keeper = SimpleNamespace(feed=SimpleNamespace(flush=lambda record: time.sleep(0.05)), record=None, stopped=None)
    with RecordClock() as clock:
        RecordKeeper.flush(keeper)
        RecordKeeper.flush(keeper)
    assert 0.1 <= clock.seconds < 1.0
    assert RecordKeeper.flush is original


def test_the_cross_validation_trains_with_the_training_scripts_defaults(tmp_path):
    config, *_ = build_parser().parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--record", str(tmp_path), "--learning_rate", "0.05"])
    assert config.per_device_train_batch_size == 128 and config.optim == "sgd"  # not TrainingArguments' 8 and AdamW
    assert config.learning_rate == 0.05  # a flag given still wins


def test_the_text_cross_validation_predicts_each_row_once_from_a_fold_that_did_not_train_on_it(review_folder, tmp_path):
    run = tmp_path / "run"
    word_tokenizer([*POSITIVE, *NEGATIVE], max_length=16).save_pretrained(run)  # what the noisy run saved
    config, data_args, model_args, _ = build_parser("text").parse_args_into_dataclasses([
        "--output_dir", str(tmp_path / "cv"), "--record", str(run), "--dataset", str(review_folder),
        "--label_column", "sentiment", "--label_noise", "0.25", "--vocab_size", "80", "--hidden_size", "16",
        "--num_heads", "2", "--num_layers", "1", "--intermediate_size", "32", "--max_length", "16",
        "--per_device_train_batch_size", "8", "--num_train_epochs", "1", "--use_cpu", "--disable_tqdm", "true"])
    assert config.per_device_train_batch_size == 8 and config.weight_decay == 0.01  # train_text.py's defaults
    data = text_rows(config, data_args, model_args, str(run))
    assert data.num_labels == 2 and data.ids.tolist() == list(range(96)) and data.labels.sum() not in (0, 96)
    trained, predicted = [], []
    cut = data.rows

    def watched(positions, to_predict):
        (predicted if to_predict else trained).append(set(positions.tolist()))
        return cut(positions, to_predict)

    data.rows = watched
    probabilities, seconds = cross_validated_probabilities(config, data, folds=3)
    assert probabilities.shape == (96, 2) and numpy.allclose(probabilities.sum(1), 1) and seconds > 0
    assert sorted(row for fold in predicted for row in fold) == list(range(96))
    for held, fit in zip(predicted, trained, strict=True):
        assert not held & fit and len(held | fit) == 96


def test_the_record_clock_counts_the_per_example_loss_only_where_the_record_alone_asks_for_it():
    def slow_loss(outputs, labels):
        time.sleep(0.05)
        return labels

    plain, selecting = (SimpleNamespace(selector=selector, per_example_loss_func=slow_loss) for selector in (None, 1))
    for trainer, counted in ((plain, True), (selecting, False)):
        with RecordClock(trainer) as clock:
            trainer.per_example_loss_func(None, 1)
        assert (clock.seconds >= 0.05) is counted
        assert trainer.per_example_loss_func is slow_loss


def test_the_record_clock_counts_the_margins_with_selection_and_without():
    class SlowLoss:
        def __call__(self, outputs, labels):
            return labels

        def margins(self, outputs, labels):
            time.sleep(0.05)
            return labels

    for selector in (None, 1):
        loss = SlowLoss()
        trainer = SimpleNamespace(selector=selector, per_example_loss_func=loss)
        with RecordClock(trainer) as clock:
            trainer.per_example_loss_func.margins(None, 1)  # as compute_loss reads it
            loss.margins(None, 1)  # as the selection forward's scorer reads it
        assert clock.seconds >= 0.1
        assert trainer.per_example_loss_func is loss and "margins" not in vars(loss)

