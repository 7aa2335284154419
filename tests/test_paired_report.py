"""benchmarks/paired_report.py: paired differences with Traditional and with the controls of the same cost."""

import json

from paired_report import report


def write(folder, strategy, accuracy, seconds):
    folder.mkdir(parents=True, exist_ok=True)
    log = {"strategy": strategy, "evals": [{"error": 1 - accuracy / 100}], "train_wall_seconds": seconds}
    (folder / f"{strategy}.json").write_text(json.dumps(log))


def test_each_setting_is_paired_with_its_seeds_traditional_and_controls(tmp_path):
    for seed, (base, pruned, uniform, random) in enumerate([(80, 79, 77, 78), (82, 80, 78, 81), (81, 81, 76, 79)]):
        folder = tmp_path / f"seed{seed}"
        write(folder, "traditional", base, 100.0)
        write(folder, "early-prune-keep0.3", pruned, 50.0)
        write(folder, "uniform-for-early-prune-keep0.3", uniform, 48.0)
        write(folder, "early-random-keep0.3", random, 49.0)
        write(folder, "early-coverage-keep0.3", pruned + 1, 50.0)
    text = report(str(tmp_path))
    assert "Traditional: 81.00 ± 1.00 % over 3 seeds (80.00, 82.00, 81.00)" in text
    row = next(line for line in text.splitlines() if line.startswith("| early-prune-keep0.3 |"))
    # Paired with Traditional: -1, -2, 0 -> -1.00 ± 1.00, t(2) = 4.303 -> ± 2.48.
    assert "| 80.00 ± 1.00 (79.00, 80.00, 81.00) | -1.00 ± 1.00 | -3.48 to +1.48 | 2.00 ± 0.00x |" in row
    assert "uniform-for-early-prune-keep0.3: +3.00 ± 1.73 (above in 3 of 3)" in row
    assert "early-random-keep0.3: +0.67 ± 1.53 (above in 2 of 3)" in row
    coverage = next(line for line in text.splitlines() if line.startswith("| early-coverage-keep0.3 |"))
    # Early pruning's uniform control costs what any early setting at the same keep costs.
    assert "uniform-for-early-prune-keep0.3: +4.00 ± 1.73 (above in 3 of 3)" in coverage


def test_a_run_of_a_later_sitting_is_timed_against_traditional_timed_again_in_that_sitting(tmp_path):
    def logged(folder, strategy, accuracy, seconds, commit):
        write(folder, strategy, accuracy, seconds)
        path = folder / f"{strategy}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "provenance": {"commit": commit}}))

    for seed in (0, 1):
        logged(tmp_path / "runs" / f"seed{seed}", "traditional", 80, 100.0, "first")
        logged(tmp_path / "runs" / f"seed{seed}", "early-prune-keep0.3", 79, 50.0, "first")
        logged(tmp_path / "runs" / f"seed{seed}", "infobatch", 79, 40.0, "later")  # a faster machine, later
        logged(tmp_path / "retime" / f"seed{seed}", "traditional", 81, 60.0, "later")
    text = report(str(tmp_path / "runs"), str(tmp_path / "retime"))
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 1.50 ± 0.00x |" in rows["infobatch"]  # 60 s / 40 s: the same sitting's Traditional
    assert "| -1.00 ± 0.00 |" in rows["infobatch"]  # accuracy: still against the seed's own Traditional
    assert "| 2.00 ± 0.00x |" in rows["early-prune-keep0.3"]  # 100 s / 50 s: its own sitting's
    assert "2.50" not in rows["infobatch"]  # not 100 s / 40 s
