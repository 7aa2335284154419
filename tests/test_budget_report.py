"""The budget study's report: accuracy per strategy and budget, the winner per budget, the frontier's figure."""

import json

import pytest

from harness.budget_report import (
    budget_table,
    load_budgets,
    summarize_budgets,
    time_table,
    winners,
    write_budget_report,
)


def write(root, budget, seed, strategy, error, label=None, seconds=None):
    folder = root / f"budget{budget}" / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    log = {"strategy": strategy, "label": label or strategy, "evals": [{"epoch": 1, "error": error}],
           "provenance": {"commit": "abc", "clean_tree": True, "versions": {}}}
    if seconds is not None:
        log["train_wall_seconds"] = seconds
    (folder / f"{strategy}.json").write_text(json.dumps(log))


@pytest.fixture
def root(tmp_path):
    for seed, noise in ((0, 0.0), (1, 0.02)):
        write(tmp_path, 0.5, seed, "traditional", 0.20 + noise, "Plain", seconds=100 + 100 * seed)
        write(tmp_path, 0.5, seed, "uniform-keep0.5", 0.22 + noise, "Uniform")
        write(tmp_path, 0.5, seed, "sb", 0.18 + noise, "SB", seconds=110 + 270 * seed)
    write(tmp_path, 0.25, 0, "traditional", 0.30, "Plain")
    write(tmp_path, 0.25, 0, "sb", 0.35, "SB")
    return tmp_path


def test_budgets_load_smallest_first_with_every_seed(root):
    budgets = load_budgets(str(root))
    assert list(budgets) == [0.25, 0.5]
    assert sorted(budgets[0.5]) == ["seed0", "seed1"] and list(budgets[0.25]) == ["seed0"]


def test_the_table_marks_the_most_accurate_at_each_budget_and_the_winners_give_margins(root):
    rows = summarize_budgets(load_budgets(str(root)))
    table = budget_table(rows)
    assert "| SB | 65.00 % | **81.00 ± 1.41 %** |" in table
    assert "| Plain | **70.00 %** | 79.00 ± 1.41 % |" in table
    text = winners(rows)
    assert "- budget 0.25: Plain (70.00 %)" in text
    assert "- budget 0.5: SB (81.00 %), +2.00 points over Plain, +4.00 points over Uniform" in text


def test_time_is_each_seeds_ratio_to_plain_training_at_the_same_budget(root):
    table = time_table(summarize_budgets(load_budgets(str(root))))
    # seed 0: 110 / 100, seed 1: 380 / 200; the mean of ratios (1.5), not the ratio of means (1.63)
    assert "| SB | - | 1.50x |" in table
    assert "| Plain | - | 1.00x |" in table and "| Uniform | - | - |" in table


def test_the_report_is_written_with_its_figure(root):
    path = write_budget_report(str(root), "Budget study")
    text = open(path).read()
    assert text.startswith("# Budget study") and (root / "error_vs_budget.png").is_file()
    assert "3 runs" not in text and "8 runs at 1 commit(s)" in text
