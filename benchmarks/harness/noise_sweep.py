"""One table and one figure over label-noise levels: ``<root>/noise<level>/seed<k>/<strategy>.json``.

`benchmarks/run_noisy.sh` writes that layout (plus ``noise<level>/all-images/seed<k>/`` for Traditional
on the reference model's images too). Per level, each strategy's final accuracy (mean ± standard
deviation over seeds) and its training time against the same seeds' Traditional, reference model
included, as `seeds.summarize_seeds` computes them.
"""

from __future__ import annotations

import glob
import os
import statistics

from .logs import final_error
from .seeds import load_seeds, summarize_seeds

ALL_IMAGES = "traditional, all images"


def sweep(root: str) -> dict[float, list[dict]]:
    """{noise level: summary rows}, highest noise first; Traditional on all images as its own row."""
    levels = {}
    for folder in glob.glob(os.path.join(root, "noise*")):
        rows = summarize_seeds(load_seeds(folder))
        all_images = summarize_seeds(load_seeds(os.path.join(folder, "all-images")))
        for row in all_images:
            row.update(strategy=ALL_IMAGES, label=f"{row['label']}, all images", time_ratio=None)
        if rows:
            levels[float(os.path.basename(folder).removeprefix("noise"))] = rows + all_images
    return dict(sorted(levels.items(), reverse=True))


def _labels(levels: dict[float, list[dict]]) -> dict[str, str]:
    return {row["strategy"]: row["label"] for rows in levels.values() for row in rows}


def paired_wins(root: str, first: str, second: str) -> tuple[int, int, float]:
    """Over every (noise level, seed) that ran both: how often ``first`` ended more accurate than ``second``,
    of how many, and the mean accuracy difference in points."""
    differences = [
        100 * (final_error(logs[second]) - final_error(logs[first]))
        for folder in glob.glob(os.path.join(root, "noise*"))
        for logs in load_seeds(folder).values()
        if first in logs and second in logs
    ]
    if not differences:
        raise ValueError(f"no seed under {root} ran both {first!r} and {second!r}")
    return sum(d > 0 for d in differences), len(differences), statistics.fmean(differences)


def sweep_table(levels: dict[float, list[dict]]) -> str:
    """Strategies down, noise levels across: 'accuracy ± sd (time ratio vs Traditional; seeds)'."""
    labels = _labels(levels)
    header = "| strategy | " + " | ".join(f"{100 * level:g} % noise" for level in levels) + " |"
    lines = [header, "|---|" + "---|" * len(levels)]
    for name, label in labels.items():
        cells = []
        for rows in levels.values():
            row = next((r for r in rows if r["strategy"] == name), None)
            if row is None:
                cells.append("not run")
                continue
            mean, sd = row["accuracy"]
            ratio = f"{row['time_ratio'][0]:.2f}x; " if row["time_ratio"] else ""
            cells.append(f"{mean:.2f} ± {sd:.2f} % ({ratio}{row['seeds']} seed{'s' * (row['seeds'] > 1)})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_sweep(levels: dict[float, list[dict]], path: str) -> str:
    """Final accuracy against label noise, one line per strategy, error bars = standard deviation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for i, (name, label) in enumerate(_labels(levels).items()):
        points = [(100 * level, r["accuracy"]) for level, rows in levels.items() for r in rows if r["strategy"] == name]
        points.sort()
        axis.errorbar([p[0] for p in points], [p[1][0] for p in points], yerr=[p[1][1] for p in points],
                      label=label, marker="o", capsize=3, color=f"C{i}")
    axis.set_xlabel("training labels flipped (%)")
    axis.set_ylabel("final test accuracy (%)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_sweep_report(root: str, title: str, pairs: tuple[tuple[str, str], ...] = ()) -> str:
    """report.md and accuracy_vs_noise.png in ``root``; ``pairs`` (first, second) add one line each saying how
    often the first ended above the second, seed by seed."""
    levels = sweep(root)
    if not levels:
        raise ValueError(f"no noise<level>/seed<k>/<strategy>.json logs under {root}")
    plot_sweep(levels, os.path.join(root, "accuracy_vs_noise.png"))
    path = os.path.join(root, "report.md")
    with open(path, "w") as handle:
        handle.write(
            f"# {title}\n\nFinal test accuracy, mean ± standard deviation over seeds; in brackets the training time "
            "against the same seeds' Traditional run (a RHO-LOSS run's includes its reference model's training and "
            "pass) and the number of seeds. Per-level tables, time to Traditional's error and plots: "
            "`noise<level>/report.md`.\n\n"
            + sweep_table(levels)
            + "".join(
                f"\n{first} ended above {second} in {wins} of {runs} (level, seed) pairs, by {mean:+.2f} points "
                "on average.\n"
                for first, second in pairs
                for wins, runs, mean in [paired_wins(root, first, second)]
            )
            + "\n![accuracy vs noise](accuracy_vs_noise.png)\n"
        )
    return path
