"""Several seeds of one benchmark: mean and spread of accuracy, training time and time to target.

``<root>/seed<k>/<strategy>.json`` are the per-seed logs `benchmarks/benchmark.py` writes. Every
time-to-target figure is read against the Traditional run *of the same seed*: its final error x
factor is the target, and the speedup is Traditional's time to that target over the strategy's.
"""

from __future__ import annotations

import glob
import os
import statistics
from collections import Counter

from .logs import BASELINE, CLOCKS, final_error, load_logs
from .report import time_to_error

FACTORS = (1.0, 1.1, 1.2)


def load_seeds(root: str) -> dict[str, dict[str, dict]]:
    """{seed folder name: {strategy: log}} for every ``seed*`` folder of ``root`` holding logs."""
    seeds = {}
    for folder in sorted(glob.glob(os.path.join(root, "seed*"))):
        logs = load_logs(folder)
        if logs:
            seeds[os.path.basename(folder)] = logs
    return seeds


def _spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize_seeds(seeds: dict[str, dict[str, dict]], clock: str = "wall") -> list[dict]:
    """One row per strategy (in the logs' order): means and standard deviations over seeds."""
    key = CLOCKS[clock]
    names = list(dict.fromkeys(name for logs in seeds.values() for name in logs))
    rows = []
    for name in names:
        runs = [(logs[name], logs.get(BASELINE)) for logs in seeds.values() if name in logs]
        row = {
            "strategy": name,
            "label": runs[0][0].get("label", name),
            "seeds": len(runs),
            "accuracy": _spread([100 * (1 - final_error(log)) for log, _ in runs]),
            "train_seconds": _spread([log[key] for log, _ in runs]),
            "kept_fraction": statistics.fmean(log["stats"].get("kept_fraction", 1.0) for log, _ in runs),
            # RHO-LOSS: the reference model's training and pass, already inside train_seconds.
            "reference_seconds": _spread(references) if (references := _reference_seconds(runs)) else None,
            "time_ratio": None,
            "to_target": {},
        }
        paired = [(log, base) for log, base in runs if base is not None]
        if paired:
            row["time_ratio"] = _spread([base[key] / log[key] for log, base in paired])
        for factor in FACTORS:
            speedups, times = [], []
            for log, base in paired:
                target = factor * final_error(base)
                ours, theirs = time_to_error(log, target, clock), time_to_error(base, target, clock)
                if ours is not None:
                    times.append(ours)
                    if theirs is not None:
                        speedups.append(theirs / ours)
            row["to_target"][factor] = {
                "reached": len(times),
                "of": len(paired),
                "seconds": _spread(times) if times else None,
                "speedup": _spread(speedups) if speedups else None,
            }
        rows.append(row)
    return rows


def _reference_seconds(runs: list[tuple[dict, dict | None]]) -> list[float]:
    return [log["reference"]["seconds"] for log, _ in runs if log.get("reference")]


def _fmt(pair: tuple[float, float] | None, digits: int = 1, suffix: str = "") -> str:
    if pair is None:
        return "not reached"
    return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}{suffix}"


def seeds_table(rows: list[dict], clock: str = "wall") -> str:
    header = (
        "| strategy | seeds | final accuracy (%) | training time (s) | time vs Traditional | kept fraction | "
        + " | ".join(f"to {f:g}x Trad. error: speedup (reached)" for f in FACTORS)
        + " |"
    )
    with_reference = any(row.get("reference_seconds") for row in rows)
    if with_reference:
        header += " of the training time, reference model (s) |"
    lines = [header, "|" + "---|" * (6 + len(FACTORS) + with_reference)]
    for row in rows:
        cells = [
            row["label"],
            str(row["seeds"]),
            _fmt(row["accuracy"], 2),
            _fmt(row["train_seconds"], 0),
            _fmt(row["time_ratio"], 2, "x") if row["time_ratio"] else "-",
            f"{row['kept_fraction']:.2f}",
        ]
        for factor in FACTORS:
            target = row["to_target"][factor]
            cells.append(f"{_fmt(target['speedup'], 2, 'x')} ({target['reached']}/{target['of']})")
        if with_reference:
            cells.append(_fmt(row["reference_seconds"], 0) if row.get("reference_seconds") else "-")
        lines.append("| " + " | ".join(cells) + " |")
    note = f"Mean ± standard deviation over seeds; {clock}-clock training time, evaluation excluded."
    if with_reference:
        note += (
            " A RHO-LOSS run's training time and speedups include its reference model's training and its pass over "
            "the data (last column); one reference can serve many runs, so its time without them is the training "
            "time minus that column."
        )
    return "\n".join(lines) + f"\n\n{note}\n"


def plot_seeds(seeds: dict[str, dict[str, dict]], path: str, clock: str = "wall") -> str:
    """Test error against training time: one line per seed, one colour per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = CLOCKS[clock]
    figure, axis = plt.subplots(figsize=(8, 5))
    colours, labelled = {}, set()
    for logs in seeds.values():
        for name, log in logs.items():
            colour = colours.setdefault(name, f"C{len(colours)}")
            label = None if name in labelled else log.get("label", name)
            labelled.add(name)
            times = [e[key] for e in log["evals"]]
            errors = [100 * e["error"] for e in log["evals"]]
            axis.plot(times, errors, color=colour, alpha=0.8, label=label, marker=".")
    axis.legend()
    axis.set_xlabel(f"training time ({clock} clock, s)")
    axis.set_ylabel("error on the evaluation split (%)")
    axis.set_title(f"{len(seeds)} seeds, one line per seed")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def provenance_summary(seeds: dict[str, dict[str, dict]]) -> str:
    """Every commit the runs were made at, which runs had a modified tree, and the library versions.

    Seeds of a long benchmark are run over several sittings, so one table can span many commits;
    naming only one would hide that.
    """
    runs = [(f"{seed}/{name}", log.get("provenance", {})) for seed, logs in seeds.items() for name, log in logs.items()]
    commits = Counter(prov.get("commit") for _, prov in runs)
    listed = ", ".join(f"{(commit or 'unknown')[:10]} ({count})" for commit, count in commits.items())
    modified = [run for run, prov in runs if prov.get("clean_tree") is not True]
    versions = list(dict.fromkeys(repr(prov.get("versions")) for _, prov in runs))
    return (
        f"{len(runs)} runs at {len(commits)} commit(s), runs per commit in brackets: {listed}. "
        + (f"Tree modified or unknown in: {', '.join(modified)}. " if modified else "Clean tree in every run. ")
        + (f"Versions {versions[0]} in every run." if len(versions) == 1 else f"Versions: {'; '.join(versions)}.")
    )


def write_seeds_report(root: str, title: str, clock: str = "wall") -> str:
    seeds = load_seeds(root)
    if not seeds:
        raise ValueError(f"no seed*/ folders with logs in {root}")
    rows = summarize_seeds(seeds, clock)
    plot_seeds(seeds, os.path.join(root, "error_vs_time.png"), clock)
    text = (
        f"# {title}\n\n{seeds_table(rows, clock)}\n![error vs time](error_vs_time.png)\n\n"
        f"{provenance_summary(seeds)} Each run's command is in its log.\n"
    )
    path = os.path.join(root, "report.md")
    with open(path, "w") as handle:
        handle.write(text)
    return path
