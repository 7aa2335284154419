"""Aggregation over seeds: means, spreads and per-seed time-to-target against that seed's Traditional."""

import json

import pytest

from harness.seeds import load_seeds, provenance_summary, seeds_table, summarize_seeds


def log(strategy, errors, seconds, kept=1.0):
    evals = [
        {"epoch": i + 1, "error": e, "train_wall_seconds": t, "train_cpu_seconds": t}
        for i, (e, t) in enumerate(zip(errors, seconds, strict=True))
    ]
    return {"strategy": strategy, "label": strategy, "evals": evals, "stats": {"kept_fraction": kept},
            "train_wall_seconds": seconds[-1], "train_cpu_seconds": seconds[-1]}


def write(root, seed, *logs):
    folder = root / f"seed{seed}"
    folder.mkdir(parents=True)
    for entry in logs:
        (folder / f"{entry['strategy']}.json").write_text(json.dumps(entry))


def test_time_to_target_is_read_against_the_same_seeds_traditional(tmp_path):
    trad = [10, 20, 30]
    write(tmp_path, 1, log("traditional", [0.5, 0.3, 0.2], trad), log("fast", [0.4, 0.2, 0.19], [5, 10, 15], 0.5))
    write(tmp_path, 2, log("traditional", [0.5, 0.4, 0.3], trad), log("fast", [0.45, 0.35, 0.32], [5, 10, 15], 0.7))
    rows = {row["strategy"]: row for row in summarize_seeds(load_seeds(str(tmp_path)))}
    fast = rows["fast"]
    assert fast["seeds"] == 2
    assert fast["accuracy"] == pytest.approx((74.5, 13 / 2**0.5), rel=1e-6)  # 81 and 68 %
    assert fast["time_ratio"] == pytest.approx((2.0, 0.0))
    assert fast["kept_fraction"] == pytest.approx(0.6)
    # Seed 1 reaches Traditional's 0.2 at 10 s (Traditional: 30 s); seed 2 never reaches 0.3.
    assert fast["to_target"][1.0]["reached"] == 1 and fast["to_target"][1.0]["speedup"] == pytest.approx((3.0, 0.0))
    # 1.2 x: seed 1's target 0.24 at 10 s (Traditional 30 s), seed 2's 0.36 at 10 s (Traditional 30 s).
    assert fast["to_target"][1.2]["speedup"] == pytest.approx((3.0, 0.0))
    assert "not reached" not in seeds_table(list(rows.values())).splitlines()[3]


def test_report_names_every_commit_and_every_modified_tree(tmp_path):
    versions = {"torch": "2.14.1"}
    runs = (
        [("traditional", "a" * 40, True), ("fast", "b" * 40, True)],
        [("traditional", "a" * 40, False), ("fast", "c" * 40, True)],
    )
    for seed, strategies in enumerate(runs):
        entries = []
        for name, commit, clean in strategies:
            entry = log(name, [0.5], [10])
            entry["provenance"] = {"commit": commit, "clean_tree": clean, "versions": versions}
            entries.append(entry)
        write(tmp_path, seed, *entries)
    summary = provenance_summary(load_seeds(str(tmp_path)))
    assert "4 runs at 3 commit(s)" in summary
    assert f"{'a' * 10} (2), {'b' * 10} (1), {'c' * 10} (1)" in summary
    assert "Tree modified or unknown in: seed1/traditional." in summary
    assert "in every run" in summary and "2.14.1" in summary


def test_a_reference_models_cost_gets_its_own_column_and_stays_in_the_training_time(tmp_path):
    for seed, reference in ((1, 40.0), (2, 60.0)):
        rho = log("rholoss", [0.4, 0.3], [70, 90])
        rho["reference"] = {"seconds": reference}
        write(tmp_path, seed, log("traditional", [0.5, 0.3], [50, 100]), rho)
    rows = summarize_seeds(load_seeds(str(tmp_path)))
    rho = next(row for row in rows if row["strategy"] == "rholoss")
    assert rho["reference_seconds"] == pytest.approx((50.0, 200**0.5))
    assert rho["train_seconds"] == pytest.approx((90.0, 0.0))  # the logged time, reference included
    table = seeds_table(rows)
    header, _, traditional, rholoss = table.splitlines()[:4]
    assert header.endswith("reference model (s) |") and traditional.endswith("| - |")
    assert rholoss.endswith("| 50 ± 14 |") and "include its reference model's training" in table


def test_the_noise_sweep_reads_each_level_against_its_own_traditional(tmp_path):
    from harness.noise_sweep import sweep, sweep_table, write_sweep_report

    write(tmp_path / "noise0.2", 0, log("traditional", [0.5, 0.4], [10, 20]), log("rholoss", [0.6, 0.5], [5, 10]))
    write(tmp_path / "noise0.2", 1, log("traditional", [0.5, 0.2], [10, 20]), log("rholoss", [0.6, 0.3], [5, 10]))
    write(tmp_path / "noise0.2" / "all-images", 0, log("traditional", [0.5, 0.35], [12, 24]))
    write(tmp_path / "noise0.0", 0, log("traditional", [0.3, 0.1], [10, 20]))
    levels = sweep(str(tmp_path))
    assert list(levels) == [0.2, 0.0]
    rholoss = next(r for r in levels[0.2] if r["strategy"] == "rholoss")
    assert rholoss["accuracy"] == pytest.approx((60.0, 10 * 2**0.5)) and rholoss["time_ratio"] == pytest.approx((2, 0))
    table = sweep_table(levels).splitlines()
    assert table[0] == "| strategy | 20 % noise | 0 % noise |"
    assert table[2] == "| traditional | 70.00 ± 14.14 % (1.00x; 2 seeds) | 90.00 ± 0.00 % (1.00x; 1 seed) |"
    assert table[3] == "| rholoss | 60.00 ± 14.14 % (2.00x; 2 seeds) | not run |"
    assert table[4] == "| traditional, all images | 65.00 ± 0.00 % (1 seed) | not run |"
    report = write_sweep_report(str(tmp_path), "sweep", pairs=(("rholoss", "traditional"),))
    text = open(report).read()
    assert (tmp_path / "accuracy_vs_noise.png").stat().st_size > 0 and "| rholoss |" in text
    # Seed 0: 50 % vs 60 %; seed 1: 70 % vs 80 %; the clean level has no rholoss run.
    assert "rholoss ended above traditional in 0 of 2 (level, seed) pairs, by -10.00 points" in text
