"""The convergence-regime report: cost-model time, plateau evidence, controls, the budget sweep's frontier."""

import json
import statistics

import pytest
import torch

from harness.paper_regime import (
    cost_model_seconds,
    pareto_front,
    plateau,
    summarize,
    unit_costs,
    write_paper_regime_report,
)
from harness.seeds import load_seeds


def log(strategy, errors, seconds, backwards, seen, forwards=0, forward_seconds=0.0, train=None, epochs=None):
    evals = []
    for i, (error, at) in enumerate(zip(errors, seconds, strict=True)):
        entry = {"epoch": i + 1, "error": error, "accuracy": 1 - error, "train_wall_seconds": at,
                 "train_cpu_seconds": at}
        if train is not None:
            entry["train_accuracy"], entry["train_low_loss_share"] = train[i], train[i] - 0.05
        evals.append(entry)
    return {
        "strategy": strategy, "label": strategy.upper(), "evals": evals, "num_train_epochs": epochs or len(errors),
        "stats": {"backwards": backwards, "examples_seen": seen, "selection_forwards": forwards,
                  "selection_forward_seconds": forward_seconds},
        "train_wall_seconds": seconds[-1], "train_cpu_seconds": seconds[-1],
    }


def write(folder, *logs):
    folder.mkdir(parents=True)
    for entry in logs:
        (folder / f"{entry['strategy']}.json").write_text(json.dumps(entry))


def seed_logs(noise=0.0):
    trad = log("traditional", [0.5, 0.3, 0.2 + noise, 0.2 + noise], [10, 20, 30, 40], backwards=400, seen=400,
               train=[0.9, 0.97, 0.985, 0.99])
    # SB: a backward pass for a quarter of the rows, a selection forward for all; 25 s of selection forwards.
    sb = log("sb", [0.45, 0.25, 0.22, 0.21], [6, 12, 18, 25], backwards=100, seen=400, forwards=400,
             forward_seconds=10.0)
    control = log("uniform-for-sb", [0.5, 0.35, 0.3, 0.28], [3, 6, 9, 10], backwards=100, seen=400)
    return trad, sb, control


def test_cost_model_time_counts_passes_at_the_same_seeds_unit_costs():
    trad, sb, _ = seed_logs()
    units = unit_costs({"traditional": trad, "sb": sb})
    assert units == {"backward": pytest.approx(0.1), "forward": pytest.approx(0.025)}
    assert cost_model_seconds(sb, units) == pytest.approx(100 * 0.1 + 400 * 0.025)
    assert cost_model_seconds(trad, units) == pytest.approx(40.0)


def test_plateau_needs_both_a_fitted_training_set_and_a_flat_test_curve():
    trad, _, _ = seed_logs()
    flat = plateau(trad)
    assert flat["converged"] and flat["train_accuracy_min"] == pytest.approx(0.99)
    # Still improving over the last fifth (2 of 10 evaluations): 5 points from its final value.
    errors = [0.5, 0.45, 0.4, 0.35, 0.3, 0.3, 0.3, 0.3, 0.25, 0.2]
    climbing = log("traditional", errors, list(range(1, 11)), 10, 10, train=[0.99] * 10)
    assert not plateau(climbing)["converged"]
    underfit = log("traditional", [0.5, 0.2, 0.2, 0.2], [1, 2, 3, 4], 4, 4, train=[0.9, 0.95, 0.97, 0.97])
    assert not plateau(underfit)["converged"]


def test_summary_ratios_and_time_to_target_are_per_seed(tmp_path):
    for seed in range(2):
        write(tmp_path / f"seed{seed}", *seed_logs(noise=0.01 * seed))
    rows = {row["strategy"]: row for row in summarize(load_seeds(str(tmp_path)))}
    sb = rows["sb"]
    assert sb["wall_ratio"] == pytest.approx((1.6, 0.0))
    assert sb["model_ratio"] == pytest.approx((2.0, 0.0))
    assert sb["backward_fraction"] == pytest.approx(0.25)
    # 1.2x Trad. error: seed 0's 0.24 (SB 18 s, Trad 30 s), seed 1's 0.252 (SB 12 s, Trad 30 s).
    speedups = [30 / 18, 30 / 12]
    assert sb["to_target"][1.2]["speedup"] == pytest.approx((statistics.fmean(speedups), statistics.stdev(speedups)))
    # 1.0x: SB never reaches 0.2 in seed 0; in seed 1 it reaches 0.21 at 25 s (Trad. at 30 s).
    assert sb["to_target"][1.0]["reached"] == 1 and sb["to_target"][1.0]["of"] == 2


def test_pareto_front_keeps_only_points_no_other_beats():
    points = [
        {"seconds": 10, "error": 0.3}, {"seconds": 12, "error": 0.35}, {"seconds": 20, "error": 0.2},
        {"seconds": 20, "error": 0.25}, {"seconds": 30, "error": 0.21}, {"seconds": 40, "error": 0.1},
    ]
    assert [(p["seconds"], p["error"]) for p in pareto_front(points)] == [(10, 0.3), (20, 0.2), (40, 0.1)]


def test_report_has_every_section_and_figure(tmp_path):
    write(tmp_path / "seed0", *seed_logs())
    trad, sb, control = seed_logs()
    short = [dict(entry, num_train_epochs=2, evals=entry["evals"][:2], train_wall_seconds=entry["evals"][1][
        "train_wall_seconds"]) for entry in (trad, sb, control)]
    write(tmp_path / "sweep" / "epochs2", *short)
    path = write_paper_regime_report(str(tmp_path), "T")
    text = open(path).read()
    for heading in ("Every strategy over seeds", "uniform control", "Did Traditional converge?", "Budget sweep"):
        assert heading in text
    # SB against its control: 7 points more accurate (error 0.21 vs 0.28).
    assert "+7.00" in text
    for figure in ("error_vs_time.png", "error_vs_epoch.png", "error_vs_budget_pareto.png"):
        assert (tmp_path / figure).stat().st_size > 0
    # The fastest run (the 2-epoch control, 6 s) starts the frontier; Traditional's 4 epochs (0.2) ends it.
    frontier = text.split("strategy owning the frontier")[1]
    assert frontier.index("UNIFORM-FOR-SB") < frontier.index("TRADITIONAL")


def test_report_leaves_out_the_convergence_section_when_no_run_measured_its_training_rows(tmp_path):
    _, sb, control = seed_logs()
    trad = log("traditional", [0.5, 0.3, 0.2, 0.2], [10, 20, 30, 40], backwards=400, seen=400)
    write(tmp_path / "seed0", trad, sb, control)
    text = open(write_paper_regime_report(str(tmp_path), "T")).read()
    assert "Did Traditional converge?" not in text and "How redundant" not in text
    assert "Every strategy over seeds" in text and "uniform control" in text


def test_fit_rows_are_the_first_rows_unaugmented_in_evaluation_batches_and_refuse_bad_counts():
    from tiny import make_image_dataset

    from harness.runner import _fit_rows
    from harness.workloads import Workload

    dataset = make_image_dataset(16)
    workload = Workload(train=dataset, eval=dataset, dataset_id="tiny", model_name="tiny", build_model=None)
    batches = _fit_rows(workload, 5, batch_size=2)
    assert [len(batch["labels"]) for batch in batches] == [2, 2, 1]
    plain = dataset.without_augmentation()
    pixels = torch.cat([batch["pixel_values"] for batch in batches])
    assert torch.equal(pixels, torch.stack([plain[i]["pixel_values"] for i in range(5)]))
    assert torch.equal(torch.cat([batch["labels"] for batch in batches]), dataset.labels[:5])
    # Unaugmented: the same rows twice give the same pixels (the training view crops and flips at random).
    assert torch.equal(torch.cat([batch["pixel_values"] for batch in _fit_rows(workload, 5, 2)]), pixels)
    with pytest.raises(ValueError, match="more than the 16 training rows"):
        _fit_rows(workload, 17, 2)
