"""`time_training`: the harness's throughput run (no evaluation) that benchmarks/bench_selection_pass.py times with."""

import time

import torch
from tiny import TinyClassifier, make_dataset

from harness.runner import RunSettings, time_training
from harness.strategies import Strategy

N, BATCH, EPOCHS = 64, 8, 2


def settings(tmp_path) -> RunSettings:
    return RunSettings(
        output_dir=str(tmp_path), num_train_epochs=EPOCHS, seed=0, batch_size=BATCH, learning_rate=0.05,
        lr_scheduler_type="constant", use_cpu=True,
    )


def test_no_evaluation_setting_turns_the_trainers_evaluation_off(tmp_path):
    settings = RunSettings(output_dir=str(tmp_path), num_train_epochs=1, evals_per_epoch=0)
    config = settings.config(str(tmp_path), 1, {"sb_strategy": "none"})
    assert config.eval_strategy == "no"


def test_overrides_win_over_the_settings_and_the_benchmarks_fixed_choices(tmp_path):
    settings = RunSettings(output_dir=str(tmp_path), num_train_epochs=1, seed=3, use_cpu=True)
    config = settings.config(str(tmp_path), 2, {"sb_strategy": "uniform", "logging_steps": 10, "seed": 0,
                                               "accelerator_config": {"non_blocking": False}})
    assert (config.sb_strategy, config.logging_steps, config.seed, config.data_seed) == ("uniform", 10, 0, 3)
    assert config.num_train_epochs == 2 and config.optim_args == "momentum=0.9" and config.save_strategy == "no"
    assert not config.accelerator_config.non_blocking
    # What a log records: every field but the output folder.
    assert settings.logged()["seed"] == 3 and "output_dir" not in settings.logged()


def test_time_training_counts_the_strategys_examples_and_times_only_the_loop(tmp_path):
    model = TinyClassifier()
    before = [p.detach().clone() for p in model.parameters()]
    runs = {}
    for strategy in (Strategy("none", "Traditional", {"sb_strategy": "none"}),
                     Strategy("uniform", "Uniform", {"sb_strategy": "uniform", "sb_keep": 0.5})):
        start = time.perf_counter()
        # No eval_dataset: a run that tried to evaluate would fail here.
        runs[strategy.name] = time_training(strategy, settings(tmp_path), model, make_dataset(N), EPOCHS)
        runs[strategy.name]["outer_seconds"] = time.perf_counter() - start
    none, uniform = runs["none"], runs["uniform"]
    assert none["examples"] == uniform["examples"] == EPOCHS * N
    assert none["trained"] == EPOCHS * N
    assert uniform["trained"] == EPOCHS * N // 2  # the strategy's overrides reach the trainer: 4 of every 8
    # Traditional's counters get the data and selection timers selective runs keep (bench_selection_pass reads them).
    assert none["stats"]["data_seconds"] > 0 and none["stats"]["selection_forward_seconds"] == 0.0
    for run in runs.values():
        # The loop's time: positive, and less than the call's (the Trainer's set-up is left out).
        assert 0 < run["wall_seconds"] < run["outer_seconds"]
        assert run["examples_per_second"] == run["examples"] / run["wall_seconds"]
    # The caller's model is the one trained (bench_selection_pass reloads its initial weights before each run).
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
