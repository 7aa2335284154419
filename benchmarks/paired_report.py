"""Paired comparisons of a seeded benchmark: each setting against Traditional and against its controls, seed by seed.

    python benchmarks/paired_report.py --root benchmarks/results/pretrained/images

ROOT holds seed*/<strategy>.json (the harness's logs, one folder per seed, each with its own Traditional). For every
setting run in at least two seeds: its accuracy per seed, mean and standard deviation; its paired difference with
the same seed's Traditional (mean, standard deviation, 95 % t-interval); its saving in wall-clock training time
against that Traditional; and its paired difference with each control of the same cost run in those seeds (its
uniform control `uniform-for-<setting>`; for an early setting at keep K also `uniform-for-early-prune-keep<K>` and
the fixed random subset `early-random-keep<K>`). Markdown on stdout.

    python benchmarks/paired_report.py --root benchmarks/results/pretrained/images \
        --retimed benchmarks/results/pretrained/images/retime

Machines differ in speed between sittings: with --retimed (a folder of seed*/traditional.json, Traditional timed
again in a later sitting), a run logged at the same commit as that seed's retimed Traditional is timed against it,
and its accuracy still against the seed's own Traditional (the same training).
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import re
import statistics

from harness.logs import BASELINE, final_error, load_logs

# Two-sided 95 % quantiles of Student's t by degrees of freedom (n - 1), for the small seed counts benchmarks run.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def accuracy(log: dict) -> float:
    return 100.0 * (1.0 - final_error(log))


def spread(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def interval(differences: list[float]) -> str:
    mean, sd = spread(differences)
    if len(differences) < 2:
        return "-"
    half = T95.get(len(differences) - 1, 1.96) * sd / math.sqrt(len(differences))
    return f"{mean - half:+.2f} to {mean + half:+.2f}"


def controls_of(name: str) -> list[str]:
    """Its uniform control; for an early setting at keep K, which costs what early_prune at K costs, also
    early_prune's uniform control and the fixed random subset of that size."""
    found = [f"uniform-for-{name}"]
    keep = re.search(r"-keep([0-9.]+)", name)
    if name.startswith("early-") and not name.startswith("early-random") and keep:
        found += [f"uniform-for-early-prune-keep{keep.group(1)}", f"early-random-keep{keep.group(1)}"]
    return list(dict.fromkeys(found))


def _commit(log: dict) -> str | None:
    return (log.get("provenance") or {}).get("commit")


def timing_baseline(log: dict, seed: str, logs: dict, retimed: dict) -> dict:
    """The Traditional run ``log`` is timed against: the seed's retimed one where both were logged at one commit
    (one sitting), else the seed's own."""
    again = retimed.get(seed, {}).get(BASELINE)
    return again if again is not None and _commit(again) == _commit(log) else logs[BASELINE]


def report(root: str, retimed_root: str | None = None) -> str:
    seeds = {os.path.basename(folder): load_logs(folder) for folder in sorted(glob.glob(os.path.join(root, "seed*")))}
    retimed = {} if retimed_root is None else {
        os.path.basename(folder): load_logs(folder) for folder in sorted(glob.glob(os.path.join(retimed_root, "seed*")))
    }
    seeds = {seed: logs for seed, logs in seeds.items() if BASELINE in logs}
    names = sorted({name for logs in seeds.values() for name in logs if name != BASELINE})
    base = [accuracy(logs[BASELINE]) for logs in seeds.values()]
    mean, sd = spread(base)
    lines = [
        f"Traditional: {mean:.2f} ± {sd:.2f} % over {len(base)} seeds "
        f"({', '.join(f'{value:.2f}' for value in base)}); lossless: a mean of at least {mean - sd:.2f} %.",
        "",
        "| setting | seeds | accuracy (%) | minus Traditional, paired (points) | 95 % interval | time saving "
        "| minus each control of its cost, paired (points) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        ran = [seed for seed, logs in seeds.items() if name in logs]
        if len(ran) < 2:
            continue
        values = [accuracy(seeds[seed][name]) for seed in ran]
        differences = [value - accuracy(seeds[seed][BASELINE]) for seed, value in zip(ran, values, strict=True)]
        savings = [timing_baseline(seeds[seed][name], seed, seeds[seed], retimed)["train_wall_seconds"]
                   / seeds[seed][name]["train_wall_seconds"] for seed in ran]
        against = []
        for control in controls_of(name):
            paired = [accuracy(seeds[seed][name]) - accuracy(seeds[seed][control]) for seed in ran
                      if control in seeds[seed]]
            if paired:
                paired_mean, paired_sd = spread(paired)
                wins = sum(value > 0 for value in paired)
                against.append(f"{control}: {paired_mean:+.2f} ± {paired_sd:.2f} (above in {wins} of {len(paired)})")
        value_mean, value_sd = spread(values)
        difference_mean, difference_sd = spread(differences)
        saving_mean, saving_sd = spread(savings)
        lines.append(
            f"| {name} | {len(ran)} | {value_mean:.2f} ± {value_sd:.2f} ({', '.join(f'{v:.2f}' for v in values)}) "
            f"| {difference_mean:+.2f} ± {difference_sd:.2f} | {interval(differences)} "
            f"| {saving_mean:.2f} ± {saving_sd:.2f}x | {'; '.join(against) or '-'} |"
        )
    lines += ["", "Accuracy: the final evaluation on the whole evaluation split. Time saving: the same seed's "
              "Traditional training time over the run's (evaluation excluded)"
              + (", Traditional timed again in the run's sitting where it was (--retimed)" if retimed else "")
              + ". 95 % interval: Student's t over the paired differences."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="Folder holding seed*/<strategy>.json.")
    parser.add_argument("--retimed", help="Folder holding seed*/traditional.json timed again in a later sitting.")
    args = parser.parse_args()
    print(report(args.root, args.retimed))


if __name__ == "__main__":
    main()
