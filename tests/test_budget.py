"""--sb_budget: a run sized to a share of the full run's cost, its schedule ending inside it."""

from __future__ import annotations

import json
import logging
import math
import shutil

import pytest
import torch
from launch import launch, resumes_cpu_processes
from tiny import TinyClassifier, make_config, make_dataset
from transformers import HfArgumentParser, TrainerCallback

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.engine.budget import DEFAULT_PHI
from hf_selective_backprop.engine.checkpoints import STATE_FILE
from hf_selective_backprop.trainer import STATS_FILE

N, BATCH, EPOCHS = 256, 8, 4
FULL_COST = EPOCHS * N  # plain training backpropagates every example read


class _LearningRates(TrainerCallback):
    """The learning rate after each optimizer step's scheduler step (what the next step would use)."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        self.seen.append(lr_scheduler.get_last_lr()[0])


def _train(output_dir, dataset=None, resume=None, **settings):
    settings = {"num_train_epochs": EPOCHS, "per_device_train_batch_size": BATCH, "lr_scheduler_type": "linear",
                "logging_steps": 5, **settings}
    if "sb_budget" in settings:
        # A plan independent of the clock, as these runs are a few dozen steps; sb_cost_phi=None measures it.
        settings.setdefault("sb_cost_phi", DEFAULT_PHI)
    rates = _LearningRates()
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), args=make_config(str(output_dir), **settings),
        train_dataset=dataset if dataset is not None else make_dataset(N), callbacks=[rates],
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer, rates.seen


def _counted(stats: dict) -> float:
    """The cost spent, at the phi the run priced it at."""
    return stats["backwards"] + stats["cost_phi"] * (stats["selection_forwards"] + stats["reference_forwards"])


@pytest.mark.parametrize("warmup_steps", [0.0, 0.25])
def test_none_with_half_the_budget_takes_half_the_steps_and_ends_its_schedule(tmp_path, warmup_steps):
    full, full_rates = _train(tmp_path / "full", sb_strategy="none", warmup_steps=warmup_steps)
    half, rates = _train(tmp_path / "half", sb_strategy="none", warmup_steps=warmup_steps, sb_budget=0.5)
    assert full.state.global_step == EPOCHS * N // BATCH
    assert half.state.global_step == full.state.global_step // 2
    # The schedule spans the shortened run: it reaches its end (0 for linear) at the last step, not half-way.
    assert rates[-1] == 0.0
    assert rates[len(rates) // 2 - 1] == pytest.approx(full_rates[len(full_rates) // 2 - 1], rel=1e-6)
    assert min(rates[:-1]) > 0.0
    logged = [log["sb/budget_spent"] for log in half.state.log_history if "sb/budget_spent" in log]
    assert logged and logged[-1] == pytest.approx(0.5)


@pytest.mark.parametrize("settings", [
    dict(sb_strategy="sb"),
    dict(sb_strategy="sb", sb_staleness=2),
    dict(sb_strategy="uniform", sb_keep=0.5),
    dict(sb_strategy="topk", sb_cost_phi=0.5),
    dict(sb_strategy="sb", sb_warmup_epochs=1, sb_budget=0.75),
    dict(sb_strategy="kath18"),
    dict(sb_strategy="infobatch"),
], ids=["sb", "stale-sb", "uniform", "topk-phi", "warmup", "kath18", "infobatch"])
def test_a_selective_run_spends_its_budget_within_two_percent(tmp_path, settings):
    settings = {"sb_budget": 0.5, **settings}
    trainer, rates = _train(tmp_path, **settings)
    stats = json.loads((tmp_path / STATS_FILE).read_text())
    target = settings["sb_budget"] * FULL_COST
    assert _counted(stats) == pytest.approx(target, rel=0.02)
    assert stats["budget_spent"] == pytest.approx(_counted(stats) / FULL_COST)
    assert stats["budget"] == settings["sb_budget"] and stats["cost_phi"] == settings.get("sb_cost_phi", DEFAULT_PHI)
    assert stats["cost_phi_source"] == "sb_cost_phi"
    assert rates[-1] == 0.0 and min(rates[:-1]) > 0.0  # the schedule ends at the last step, not before
    assert trainer.state.global_step == stats["optimizer_steps"] == len(rates)
    logged = [log["sb/budget_spent"] for log in trainer.state.log_history if "sb/budget_spent" in log]
    assert len(logged) >= 2 and logged == sorted(logged)


def test_a_max_steps_run_and_a_stream_are_sized_in_steps(tmp_path):
    stream = make_dataset(N, with_index=True).with_format(None).to_iterable_dataset(num_shards=4).with_format("torch")
    for name, dataset in (("map", None), ("stream", stream)):
        trainer, rates = _train(tmp_path / name, dataset, sb_strategy="sb", sb_budget=0.5, max_steps=200)
        stats = json.loads((tmp_path / name / STATS_FILE).read_text())
        assert _counted(stats) == pytest.approx(0.5 * 200 * BATCH, rel=0.02), name
        assert rates[-1] == 0.0, name


def test_resume_keeps_the_plan_and_ends_at_the_same_step_with_the_same_weights(tmp_path):
    settings = dict(sb_strategy="sb", sb_budget=0.5, save_strategy="steps", save_steps=5)
    whole, _ = _train(tmp_path / "whole", **settings)
    checkpoint = tmp_path / "whole" / "checkpoint-10"
    saved = torch.load(checkpoint / STATE_FILE, weights_only=True)
    assert saved["budget"] == whole.engine.budget.state_dict()
    assert 0 < saved["budget_spent"] < whole.engine.budget_spent
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(checkpoint, resumed_dir / "checkpoint-10")
    resumed, _ = _train(resumed_dir, resume=str(resumed_dir / "checkpoint-10"), **settings)
    assert resumed.state.global_step == whole.state.global_step
    assert resumed.engine.budget == whole.engine.budget
    assert resumed.engine.budget_spent == whole.engine.budget_spent
    for name, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_a_resumed_rholoss_run_keeps_the_schedule_the_reference_pass_shortened(tmp_path):
    """The resumed run does not score the reference pass again: its schedule is sized from the saved plan."""
    def run(output_dir, resume=None):
        trainer = SelectiveBackpropTrainer(
            model=TinyClassifier(), reference_model=TinyClassifier(seed=1), train_dataset=make_dataset(N),
            args=make_config(str(output_dir), sb_strategy="rholoss", sb_budget=0.5, sb_cost_phi=DEFAULT_PHI,
                             num_train_epochs=EPOCHS, lr_scheduler_type="linear", save_strategy="steps",
                             save_steps=5),
        )
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = run(tmp_path / "whole")
    shutil.copytree(tmp_path / "whole" / "checkpoint-10", tmp_path / "resumed" / "checkpoint-10")
    resumed = run(tmp_path / "resumed", str(tmp_path / "resumed" / "checkpoint-10"))
    assert resumed.state.global_step == whole.state.global_step
    assert resumed.lr_scheduler.get_last_lr() == whole.lr_scheduler.get_last_lr()
    for name, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_the_final_checkpoint_is_saved_and_a_resume_from_it_trains_no_more(tmp_path):
    settings = dict(sb_strategy="sb", sb_budget=0.5, save_strategy="steps", save_steps=50)
    whole, _ = _train(tmp_path, **settings)
    last = whole.state.global_step
    assert last % 50 and (tmp_path / f"checkpoint-{last}").is_dir()  # the budget's end, not a save step
    weights = {k: v.clone() for k, v in whole.model.state_dict().items()}
    again, rates = _train(tmp_path, resume=str(tmp_path / f"checkpoint-{last}"), **settings)
    assert again.state.global_step == last and rates == []
    assert all(torch.equal(v, again.model.state_dict()[k]) for k, v in weights.items())


@pytest.mark.parametrize("strategy", ["sb", "none"])
def test_a_resume_with_another_budget_or_none_is_refused(tmp_path, strategy):
    # A plain run (--sb_strategy none) resumed with another budget, or none, was accepted without a word: it
    # changed length and its learning rate jumped. Its budget now rides in trainer_state.json.
    _train(tmp_path, sb_strategy=strategy, sb_budget=0.5, save_strategy="steps", save_steps=5)
    checkpoint = str(tmp_path / "checkpoint-10")
    with pytest.raises(ValueError, match=rf"^Cannot resume from {checkpoint}: .*\n  --sb_budget: saved 0.5, now "
                       r"0.25\n"):
        _train(tmp_path, resume=checkpoint, sb_strategy=strategy, sb_budget=0.25)
    with pytest.raises(ValueError, match=r"\n  --sb_budget: saved 0.5, now None\n"):
        _train(tmp_path, resume=checkpoint, sb_strategy=strategy)
    # A budget run's full run (--num_train_epochs, or --max_steps) sets what the budget buys: the saved plan kept
    # it, while the warning said the run "continues with the new values".
    with pytest.raises(ValueError, match=r"\n  --num_train_epochs: saved 4, now 6 \(with --sb_budget: the full "
                       r"run whose cost the budget is a share of\)\n"):
        _train(tmp_path, resume=checkpoint, sb_strategy=strategy, sb_budget=0.5, num_train_epochs=6)
    resumed, _ = _train(tmp_path, resume=checkpoint, sb_strategy=strategy, sb_budget=0.5)  # the same: it continues
    assert resumed.state.global_step > 10


def test_a_plain_runs_checkpoint_without_a_budget_is_not_resumed_with_one(tmp_path):
    _train(tmp_path, sb_strategy="none", save_strategy="steps", save_steps=5, max_steps=10)
    with pytest.raises(ValueError, match=r"\n  --sb_budget: saved None, now 0.5\n"):
        _train(tmp_path, resume=str(tmp_path / "checkpoint-10"), sb_strategy="none", sb_budget=0.5)


@pytest.mark.parametrize("strategy", ["sb", "uniform", "none"])
def test_a_budget_too_small_for_one_optimizer_step_is_refused_before_any_step(tmp_path, strategy):
    # It took a step millions of times over the budget without a word.
    with pytest.raises(ValueError, match=r"^--sb_budget 1e-09 buys less than one optimizer step of this run: .*"
                       r"raise --sb_budget to at least "):
        _train(tmp_path, sb_strategy=strategy, sb_budget=1e-9)
    assert not (tmp_path / "checkpoint-1").exists()


def test_a_budget_within_the_warm_up_says_selection_never_starts(tmp_path):
    with pytest.warns(UserWarning, match=r"^--sb_budget 0.25 buys about 1.0 epochs of training, all within "
                      r"--sb_warmup_epochs 2: every example read is trained and --sb_strategy sb never selects"):
        trainer, _ = _train(tmp_path, sb_strategy="sb", sb_budget=0.25, sb_warmup_epochs=2)
    assert trainer.sb_stats["selection_forwards"] == 0


def test_a_run_that_ends_before_phi_is_measured_says_it_was_not(tmp_path):
    from hf_selective_backprop.engine.phi_meter import SKIPPED_STEPS, TIMED_STEPS

    trainer, _ = _train(tmp_path, sb_strategy="sb", sb_budget=0.03, sb_cost_phi=None)
    assert trainer.state.global_step < SKIPPED_STEPS + TIMED_STEPS  # over before the timing could end
    stats = json.loads((tmp_path / STATS_FILE).read_text())
    assert (stats["cost_phi_source"], stats["cost_phi"]) == ("not measured", DEFAULT_PHI)  # it said "measuring"
    trainer.create_model_card()
    assert "(the cost model's: the run ended before it was measured)" in (tmp_path / "README.md").read_text()


@resumes_cpu_processes
@pytest.mark.slow
def test_two_processes_agree_on_the_plan_spend_the_budget_and_resume_to_the_same_end(tmp_path):
    settings = ["--budget", "0.5", "--epochs", "4", "--examples", "1024", "--save-steps", "20"]
    first, second = launch(tmp_path / "whole", settings)
    # phi measured from both processes' times (summed): one plan, made anew at the same step on both.
    assert first["budget"] is not None and first["budget"]["phi_source"] == "measured"
    assert first["budget"] == second["budget"]
    assert first["budget_spent"] == second["budget_spent"]
    assert first["global_step"] == second["global_step"]
    stats = first["sb_stats"]  # summed over both ranks
    assert _counted(stats) == pytest.approx(0.5 * first["budget"]["full_cost"], rel=0.02)
    checkpoint = tmp_path / "whole" / "trainer" / "checkpoint-20"
    resumed = launch(tmp_path / "resumed", [*settings, "--resume", str(checkpoint)])
    for whole, again in zip((first, second), resumed, strict=True):
        assert again["global_step"] == whole["global_step"] and again["budget"] == whole["budget"]
        assert all(torch.equal(value, again["weights"][name]) for name, value in whole["weights"].items())


def test_the_model_card_states_the_budget(tmp_path):
    trainer, _ = _train(tmp_path, sb_strategy="uniform", sb_budget=0.5)
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert "| compute budget (`sb_budget`) | 0.5 of the full run's cost |" in card
    spent = trainer.sb_stats["budget_spent"]
    assert f"| budget spent (share of the full run's cost) | {spent:,.2f} |" in card


@pytest.mark.parametrize("flags, match", [
    (["--sb_budget", "0"], "--sb_budget must be in"),
    (["--sb_budget", "1.5"], "--sb_budget must be in"),
    (["--sb_budget", "nan"], "--sb_budget must be in"),
    (["--sb_budget", "0.5", "--sb_cost_phi", "0"], "--sb_cost_phi must be"),
    (["--sb_cost_phi", "0.5"], "--sb_cost_phi prices selection forwards for --sb_budget"),
])
def test_bad_values_are_refused_naming_the_flag(tmp_path, flags, match):
    parser = HfArgumentParser(SelectiveBackpropConfig)
    with pytest.raises(ValueError, match=match):
        parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), *flags])


def test_the_flag_parses(tmp_path):
    (config,) = HfArgumentParser(SelectiveBackpropConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--sb_budget", "0.5", "--sb_cost_phi", "0.4"]
    )
    assert (config.sb_budget, config.sb_cost_phi) == (0.5, 0.4)


@pytest.mark.parametrize("strategy", ["none", "sb"])
def test_a_stream_of_unknown_length_is_refused_naming_the_flag(tmp_path, strategy):
    stream = make_dataset(N, with_index=True).with_format(None).to_iterable_dataset(num_shards=4)
    with pytest.raises(ValueError, match="--sb_budget 0.5 is a share of the full run's cost"):
        SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=stream,
                                 args=make_config(str(tmp_path), sb_strategy=strategy, sb_budget=0.5))


def test_the_budget_plan_matches_the_cost_model():
    """SB keeping a third, phi 1/3: a trained row costs 1 + (1/3) x 3 = 2 steps' worth, so half the full run's
    cost buys a quarter of its rows trained, read over 3/4 of its epochs."""
    from hf_selective_backprop.engine.budget import plan
    from hf_selective_backprop.engine.run_length import RunLength
    from hf_selective_backprop.selectors import build_selector

    args = make_config("unused", sb_strategy="sb", sb_budget=0.5, num_train_epochs=4)
    length = RunLength(N, N // BATCH, BATCH, BATCH, 1 / 3, 1.0, 0)
    made = plan(args, length, build_selector(args), 1, True, 0)
    assert made.full_cost == FULL_COST and made.target == FULL_COST / 2
    assert made.steps == math.floor(FULL_COST / 4 / BATCH)
    assert made.epochs == pytest.approx(3.0)


def test_benchmark_runs_take_the_budget(tmp_path):
    from harness.cli import BenchmarkArguments

    (settings,) = HfArgumentParser(BenchmarkArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--sb_budget", "0.25", "--sb_cost_phi", "0.4"]
    )
    config = settings.run_settings().config(str(tmp_path), 2, {"sb_strategy": "none"})
    assert (config.sb_budget, config.sb_cost_phi) == (0.25, 0.4)
    assert settings.logged()["sb_budget"] == 0.25
    with pytest.raises(ValueError, match="--sb_budget must be in"):
        HfArgumentParser(BenchmarkArguments).parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--sb_budget", "2"]
        )


def test_the_benchmark_progress_names_the_budget_not_the_full_runs_epochs():
    from harness.cli import _run_length

    assert _run_length(6, None) == "6 epochs"
    assert _run_length(6, 0.5) == "budget 0.5 of a 6-epoch run"


def test_the_reference_pass_is_paid_from_the_budget(tmp_path):
    rates, n = _LearningRates(), 2 * N  # the run ends within half a step of the budget: 2 % of it at this size
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), reference_model=TinyClassifier(seed=1), callbacks=[rates],
        train_dataset=make_dataset(n),
        args=make_config(str(tmp_path), sb_strategy="rholoss", sb_budget=0.5, sb_cost_phi=DEFAULT_PHI,
                         num_train_epochs=EPOCHS, lr_scheduler_type="linear"),
    )
    trainer.train()
    stats, plan = trainer.sb_stats, trainer.engine.budget
    assert stats["reference_forwards"] == n and plan.before_training == pytest.approx(DEFAULT_PHI * n)
    assert _counted(stats) == pytest.approx(0.5 * EPOCHS * n, rel=0.02)
    seen = rates.seen
    assert seen[0] == pytest.approx(0.05 * (1 - 1 / plan.steps)) and seen[-1] == 0.0  # it starts after the pass


def test_infobatch_anneals_within_the_epochs_the_budget_buys(tmp_path):
    trainer, _ = _train(tmp_path, sb_strategy="infobatch", sb_budget=0.5)
    epochs = trainer.engine.budget.epochs
    assert epochs < 0.875 * EPOCHS  # counted in the configured run's epochs, it would never anneal
    assert trainer.selector.num_epochs == epochs
    stored = torch.linspace(0, 1, N)  # half of them below the mean: pruned before annealing
    assert trainer.selector.plan_epoch(stored, torch.Generator(), math.floor(0.875 * epochs)) is not None
    assert trainer.selector.plan_epoch(stored, torch.Generator(), math.ceil(0.875 * epochs)) is None


MEASURED_N = 1024  # long enough that the ten timed steps are a small part of the run, whatever phi this CPU gives


def _measured_run(output_dir, resume=None, **settings):
    return _train(output_dir, make_dataset(MEASURED_N), resume, sb_strategy="sb", sb_budget=0.5, sb_cost_phi=None,
                  **settings)


def test_a_run_given_no_phi_measures_it_and_spends_its_budget_at_it(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="hf_selective_backprop.engine.budget_meter"):
        trainer, rates = _measured_run(tmp_path)
    stats = trainer.sb_stats
    assert stats["cost_phi_source"] == "measured" and 0 < stats["cost_phi"] < math.inf
    assert stats["cost_phi"] != DEFAULT_PHI
    assert _counted(stats) == pytest.approx(0.5 * EPOCHS * MEASURED_N, rel=0.02)
    assert rates[-1] == 0.0 and min(rates[:-1]) > 0.0
    said = [r.getMessage() for r in caplog.records if "phi measured on optimizer steps" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("--sb_budget: phi measured on optimizer steps 3-12: ")
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert f"{stats['cost_phi']:.3f} (measured on the run's first optimizer steps)" in card


def test_a_strategy_without_selection_forwards_measures_nothing(tmp_path):
    trainer, _ = _train(tmp_path, sb_strategy="uniform", sb_keep=0.5, sb_budget=0.5, sb_cost_phi=None)
    assert trainer.engine.phi_meter is None
    assert (trainer.sb_stats["cost_phi_source"], trainer.sb_stats["cost_phi"]) == ("cost model", DEFAULT_PHI)


def test_a_resume_after_the_measurement_keeps_its_phi_and_one_before_it_measures_again(tmp_path):
    whole, _ = _measured_run(tmp_path / "whole", save_strategy="steps", save_steps=4)
    saved = {int(path.name.split("-")[1]): torch.load(path / STATE_FILE, weights_only=True)["budget"]
             for path in (tmp_path / "whole").glob("checkpoint-*")}
    assert saved[4]["phi_source"] == "measuring" and saved[4]["phi"] == DEFAULT_PHI
    after = min(step for step, plan in saved.items() if plan["phi_source"] == "measured")
    assert after < whole.state.global_step and saved[after] == whole.engine.budget.state_dict()

    shutil.copytree(tmp_path / "whole" / f"checkpoint-{after}", tmp_path / "after" / f"checkpoint-{after}")
    resumed, _ = _measured_run(tmp_path / "after", str(tmp_path / "after" / f"checkpoint-{after}"),
                               save_strategy="steps", save_steps=4)
    assert resumed.state.global_step == whole.state.global_step
    assert resumed.engine.budget == whole.engine.budget and resumed.engine.budget_spent == whole.engine.budget_spent
    for name, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name

    shutil.copytree(tmp_path / "whole" / "checkpoint-4", tmp_path / "before" / "checkpoint-4")
    again, _ = _measured_run(tmp_path / "before", str(tmp_path / "before" / "checkpoint-4"),
                             save_strategy="steps", save_steps=4)
    assert again.sb_stats["cost_phi_source"] == "measured"
    assert _counted(again.sb_stats) == pytest.approx(0.5 * EPOCHS * MEASURED_N, rel=0.02)
