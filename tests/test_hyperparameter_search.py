"""`Trainer.hyperparameter_search` with the selective trainer (Optuna, `model_init`): each trial trains with its
own `sb_*` values, and writes its record, data map and counters into its own trial folder, beside its checkpoints;
an sqlite study resumes with new trials in new folders."""

from __future__ import annotations

import json

import pytest
from tiny import TinyClassifier, make_config, make_dataset

from hf_selective_backprop import SelectiveBackpropTrainer

optuna = pytest.importorskip("optuna")

KEEPS = [0.25, 0.5, 0.75]


def search(tmp_path, trials: int):
    args = make_config(str(tmp_path / "search"), sb_strategy="uniform", sb_keep=1.0, num_train_epochs=2,
                       eval_strategy="no")
    trainer = SelectiveBackpropTrainer(model_init=lambda trial=None: TinyClassifier(), args=args,
                                       train_dataset=make_dataset(64), eval_dataset=make_dataset(32, seed=1))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return trainer.hyperparameter_search(
        hp_space=lambda trial: {"sb_keep": trial.suggest_categorical("sb_keep", KEEPS)}, n_trials=trials,
        backend="optuna", direction="minimize", study_name="keep", storage=f"sqlite:///{tmp_path / 'study.db'}",
        load_if_exists=True, sampler=optuna.samplers.GridSampler({"sb_keep": KEEPS}),
    )


def test_each_trial_trains_its_own_keep_and_writes_its_own_folder(tmp_path):
    search(tmp_path, trials=2)
    search(tmp_path, trials=1)  # the study resumes from its sqlite file: a third trial, a third folder
    study = optuna.load_study(study_name="keep", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert len(study.trials) == 3
    for trial in study.trials:
        folder = tmp_path / "search" / f"run-{trial.number}"
        assert (folder / "example_record.parquet").is_file() and (folder / "data_map.png").is_file()
        stats = json.loads((folder / "sb_stats.json").read_text())
        # uniform at the trial's keep: its share of every epoch's 64 examples backpropagated
        assert stats["backwards"] == pytest.approx(2 * 64 * trial.params["sb_keep"], abs=16)
    assert not (tmp_path / "search" / "example_record.parquet").exists()
    assert sorted(trial.params["sb_keep"] for trial in study.trials) == KEEPS
