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
