"""The fine-tuning benchmark's harness: strategies at another kept fraction, controls matched from their logs,
and the report's redundancy and target tables."""

import json

import pytest

from harness.cli import matched_control
from harness.paper_regime import redundancy_table, summarize, target_table
from harness.strategies import build_strategy


def test_a_keep_suffix_sets_that_strategys_kept_fraction_only():
    strategy = build_strategy("sb-keep0.5", 1 / 3, 3, 1)
    assert strategy.name == "sb-keep0.5" and strategy.overrides == {"sb_strategy": "sb", "sb_keep": 0.5}
    assert build_strategy("topk-keep0.25", 1 / 3, 3, 1).overrides == {"sb_strategy": "topk", "sb_keep": 0.25}
    assert build_strategy("sb", 1 / 3, 3, 1).overrides["sb_keep"] == pytest.approx(1 / 3)


def test_early_pruning_and_its_random_control_take_a_kept_fraction():
    prune = build_strategy("early-prune-keep0.6", 1 / 3, 3, 1)
    assert prune.overrides == {"sb_strategy": "early_prune", "sb_keep": 0.6}
    assert build_strategy("early-random-keep0.6", 1 / 3, 3, 1).overrides == {"sb_strategy": "early_random",
                                                                             "sb_keep": 0.6}
    assert prune.label == "Early prune (highest first-epoch loss), keep 0.6"


@pytest.mark.parametrize("name, message", [
    ("infobatch-keep0.5", "infobatch has no kept fraction"), ("sb-keephalf", "must be a number"),
])
def test_a_keep_suffix_that_cannot_apply_is_refused(name, message):
    with pytest.raises(ValueError, match=message):
        build_strategy(name, 1 / 3, 3, 1)


def test_knobs_chain_and_each_sets_its_own_flag():
    stale = build_strategy("stale-sb-n2-keep0.5", 1 / 3, 3, 1)
    assert stale.overrides == {"sb_strategy": "sb", "sb_keep": 0.5, "sb_staleness": 2}
    assert stale.label == "Stale-SB (n=2), keep 0.5" and stale.cycle == 2
    info = build_strategy("infobatch-r0.3-delta0.75", 1 / 3, 3, 1)
    assert info.overrides == {"sb_strategy": "infobatch", "sb_prune_ratio": 0.3, "sb_anneal_delta": 0.75}
    assert info.label == "InfoBatch, r 0.3, delta 0.75"
    early = build_strategy("early-prune-keep0.6-delta0.9", 1 / 3, 3, 1)
    assert early.overrides == {"sb_strategy": "early_prune", "sb_keep": 0.6, "sb_anneal_delta": 0.9}
    weighted = build_strategy("sb-weighted-keep0.5", 1 / 3, 3, 1)
    assert weighted.overrides == {"sb_strategy": "sb", "sb_keep": 0.5, "sb_importance_weighting": True}
    assert build_strategy("stale-sb-anneal-n2-keep0.5", 1 / 3, 3, 1).label == "Stale-SB (n=2) keep 0.50, annealed"
    annealed = build_strategy("sb-anneal-end0.75", 1 / 3, 3, 1)
    assert annealed.overrides["sb_end"] == 0.75 and annealed.overrides["sb_keep"] == pytest.approx(1 / 3)
    # A one-letter knob followed by letters is part of a strategy's name, not a knob.
    assert build_strategy("stale-rholoss", 0.5, 3, 1, reference_model="ref").overrides["sb_staleness"] == 3


@pytest.mark.parametrize("name, message", [
    ("sb-n2", "sb has no staleness"), ("sb-r0.5", "sb has no prune ratio"),
    ("stale-sb-delta0.5", "stale-sb has no annealing delta"), ("infobatch-deltahalf", "must be a number"),
    ("stale-sb-n2.5", "must be a whole number"),
])
def test_a_knob_a_strategy_lacks_or_a_knob_without_a_number_is_refused(name, message):
    with pytest.raises(ValueError, match=message):
        build_strategy(name, 1 / 3, 3, 1)


def test_a_control_takes_the_backward_fraction_its_strategy_realised_in_the_same_folder(tmp_path):
    control = build_strategy("uniform-for-sb-keep0.5", 1 / 3, 3, 1)
    assert matched_control(control, str(tmp_path)) is control  # no log yet: --keep, as before
    (tmp_path / "sb-keep0.5.json").write_text(json.dumps({"stats": {"backwards": 120, "examples_seen": 300}}))
    matched = matched_control(control, str(tmp_path))
    assert matched.name == "uniform-for-sb-keep0.5"
    assert matched.overrides == {"sb_strategy": "uniform", "sb_keep": pytest.approx(0.4)}
    assert "0.40" in matched.label and "sb-keep0.5" in matched.label
    other = build_strategy("sb", 1 / 3, 3, 1)
    assert matched_control(other, str(tmp_path)) is other


def run(strategy, errors, seconds, backwards, low=None, below=None):
    evals = []
    for i, (error, at) in enumerate(zip(errors, seconds, strict=True)):
        entry = {"epoch": i + 1, "error": error, "accuracy": 1 - error, "train_wall_seconds": at}
        if low is not None:
            entry.update(train_low_loss_share=low[i], train_below_first_median_share=below[i],
                         train_accuracy=1 - error)
        evals.append(entry)
    return {"strategy": strategy, "label": strategy.upper(), "evals": evals, "train_wall_seconds": seconds[-1],
            "train_cpu_seconds": seconds[-1],
            "stats": {"backwards": backwards, "examples_seen": 100, "selection_forwards": 0}}


def seeds():
    result = {}
    for seed, (base_error, margin) in enumerate([(0.10, 0.6), (0.12, 0.4)]):
        result[f"seed{seed}"] = {
            "traditional": run("traditional", [0.2, base_error], [10, 20], 100, low=[0.4, 0.6 + seed / 10],
                               below=[0.5, 0.7]),
            "fast": run("fast", [0.2, base_error], [5, 10], 40),
            "slow": run("slow", [0.3, base_error - 0.01], [10, 19], 90),
            "uniform-for-fast": run("uniform-for-fast", [0.2, base_error + margin / 100], [4, 8], 40),
            "uniform-for-slow": run("uniform-for-slow", [0.3, base_error + 0.02], [9, 18], 90),
        }
    return result


def test_the_redundancy_table_averages_traditionals_shares_over_seeds():
    table = redundancy_table(seeds())
    assert "| 1 | 40.0 ± 0.0 % | 50.0 ± 0.0 % | 80.0 ± 0.0 % |" in table
    assert "| 2 | 65.0 ± 7.1 % | 70.0 ± 0.0 % |" in table
    assert redundancy_table({"seed0": {"sb": run("sb", [0.1], [1], 10)}}) == ""


def test_the_redundancy_table_names_an_evaluation_a_step_past_a_quarter_epoch_by_the_quarter():
    base = run("traditional", [0.3, 0.2], [5, 10], 100, low=[0.1, 0.2], below=[0.5, 0.6])
    base["evals"][0]["epoch"], base["evals"][1]["epoch"] = 0.250356, 0.500238
    table = redundancy_table({"seed0": {"traditional": base}})
    assert "| 0.25 | 10.0 ± 0.0 % |" in table and "| 0.5 | 20.0 ± 0.0 % |" in table


def test_the_target_needs_accuracy_speed_and_a_margin_over_the_control_in_every_seed():
    data = seeds()
    table = target_table(summarize(data), data)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    # FAST: as accurate, 2x sooner, but only 0.4 points over its control in seed 1.
    assert "yes (2.00x)" in rows["FAST"] and "no (+0.40)" in rows["FAST"] and rows["FAST"].endswith("| no |")
    # SLOW: 1 point more accurate and 3 points over its control in both seeds, but not 1.3x sooner.
    assert "no (1.05x)" in rows["SLOW"] and "yes (+3.00)" in rows["SLOW"]
    data["seed1"]["uniform-for-fast"] = run("uniform-for-fast", [0.2, 0.13], [4, 8], 40)
    table = target_table(summarize(data), data)
    assert "**met**" in next(line for line in table.splitlines() if line.startswith("| FAST"))


def test_an_image_run_measures_its_fit_of_the_first_training_rows_at_every_evaluation(tmp_path):
    from harness.runner import RunSettings, run_strategy
    from harness.workloads import image_workload
    from hf_selective_backprop.data import DataArguments
    from hf_selective_backprop.models import ModelArguments

    data_args = DataArguments(dataset="digits", max_train_samples=64, max_eval_samples=32, image_size=16)
    workload = image_workload(data_args, ModelArguments(model="test_resnet"), seed=0)
    settings = RunSettings(output_dir=str(tmp_path), num_train_epochs=2, batch_size=16, eval_batch_size=8,
                           train_eval_samples=20)
    log = run_strategy(build_strategy("traditional", 1.0, 1, 0), workload, settings, 2)
    assert len(log["evals"]) == 2
    for entry in log["evals"]:  # 20 rows in batches of 8: whole shares of 20
        for share in ("train_accuracy", "train_low_loss_share", "train_below_first_median_share"):
            assert entry[share] * 20 == pytest.approx(round(entry[share] * 20))
    assert log["evals"][0]["train_below_first_median_share"] == pytest.approx(9 / 20)


def test_a_strategy_name_becomes_the_trainer_flags_a_script_takes():
    from strategy_flags import flags

    assert flags("stale-sb-n2-keep0.5") == ["--sb_strategy", "sb", "--sb_keep", "0.5", "--sb_staleness", "2"]
    assert flags("sb-weighted-keep0.5")[-2:] == ["--sb_importance_weighting", "true"]
    assert flags("traditional") == ["--sb_strategy", "none"]
    with pytest.raises(ValueError, match="realised"):
        flags("uniform-for-sb")
