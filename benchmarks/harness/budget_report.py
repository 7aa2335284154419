"""The report of the budget study (`benchmarks/run_budget.sh`): every strategy run with ``--sb_budget F``.

Layout of its results folder: ``budget<F>/seed<k>/<strategy>.json``, one folder per budget F (a share of the
full run's cost) and seed. At each budget the table says which strategy ends most accurate, against
``traditional`` (``sb_strategy="none"`` with the same budget: plain training shortened, its schedule fitted)
and the uniform random subset at the same budget; the figure plots final error against budget with the
Pareto frontier over every strategy's mean.
"""

from __future__ import annotations

import glob
import os
import re
import statistics

from .logs import BASELINE, final_error
from .paper_regime import pareto_front
from .seeds import load_seeds, provenance_summary


def load_budgets(root: str) -> dict[float, dict[str, dict[str, dict]]]:
    """{F: {seed folder: {strategy: log}}} for every ``budget<F>`` folder of ``root``, smallest F first."""
    budgets = {}
    for folder in glob.glob(os.path.join(root, "budget*")):
        match = re.fullmatch(r"budget([0-9.]+)", os.path.basename(folder))
        seeds = load_seeds(folder) if match else {}
        if seeds:
            budgets[float(match.group(1))] = seeds
    return dict(sorted(budgets.items()))


def summarize_budgets(budgets: dict[float, dict[str, dict[str, dict]]]) -> list[dict]:
    """One row per (budget, strategy): mean and spread of final accuracy over seeds, the seeds' count, and the
    training wall time over that of plain training at the same budget and seed (None where either is missing)."""
    rows = []
    for budget, seeds in budgets.items():
        names = list(dict.fromkeys(name for logs in seeds.values() for name in logs))
        for name in names:
            accuracies = [100 * (1 - final_error(logs[name])) for logs in seeds.values() if name in logs]
            label = next(logs[name].get("label", name) for logs in seeds.values() if name in logs)
            timed = [logs for logs in seeds.values()
                     if all("train_wall_seconds" in logs.get(run, {}) for run in (name, BASELINE))]
            time_ratios = [logs[name]["train_wall_seconds"] / logs[BASELINE]["train_wall_seconds"] for logs in timed]
            rows.append({
                "budget": budget,
                "strategy": name,
                "label": label,
                "seeds": len(accuracies),
                "accuracy": statistics.fmean(accuracies),
                "sd": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                "time_ratio": statistics.fmean(time_ratios) if time_ratios else None,
            })
    return rows


def _per_budget_table(rows: list[dict], cell_text) -> str:
    """A markdown table with one row per strategy and one column per budget; ``cell_text(row, budget)`` fills a
    cell that has a run, "-" the others."""
    budgets = sorted({row["budget"] for row in rows})
    cell = {(row["budget"], row["strategy"]): row for row in rows}
    labels = {row["strategy"]: row["label"] for row in rows}
    lines = ["| strategy | " + " | ".join(f"budget {b:g}" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]
    for name, label in labels.items():
        cells = [cell_text(cell[(b, name)], b) if (b, name) in cell else "-" for b in budgets]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def budget_table(rows: list[dict]) -> str:
    best = {}
    for row in rows:
        if row["budget"] not in best or row["accuracy"] > best[row["budget"]]["accuracy"]:
            best[row["budget"]] = row

    def accuracy(row, budget):
        text = f"{row['accuracy']:.2f}" + (f" ± {row['sd']:.2f}" if row["seeds"] > 1 else "") + " %"
        return f"**{text}**" if best[budget] is row else text

    return _per_budget_table(rows, accuracy)


def time_table(rows: list[dict]) -> str:
    """Training wall time over plain training's at the same budget: how closely the cost units (passes, the
    selection forward weighted by --sb_cost_phi) followed the clock on the machine that ran them."""
    return _per_budget_table(rows, lambda row, _: "-" if row["time_ratio"] is None else f"{row['time_ratio']:.2f}x")


def winners(rows: list[dict]) -> str:
    """Per budget: the most accurate strategy, and its margin over the plain run and the random subset."""
    lines = []
    for budget in sorted({row["budget"] for row in rows}):
        at = {row["strategy"]: row for row in rows if row["budget"] == budget}
        top = max(at.values(), key=lambda row: row["accuracy"])
        margins = []
        for name in (BASELINE, *sorted(n for n in at if n.startswith("uniform"))):
            if name in at and name != top["strategy"]:
                margins.append(f"{top['accuracy'] - at[name]['accuracy']:+.2f} points over {at[name]['label']}")
        lines.append(f"- budget {budget:g}: {top['label']} ({top['accuracy']:.2f} %)"
                     + (f", {', '.join(margins)}" if margins else ""))
    return "\n".join(lines)


def plot_budgets(rows: list[dict], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    for index, name in enumerate(dict.fromkeys(row["strategy"] for row in rows)):
        mine = sorted((row for row in rows if row["strategy"] == name), key=lambda row: row["budget"])
        axis.errorbar([r["budget"] for r in mine], [100 - r["accuracy"] for r in mine], yerr=[r["sd"] for r in mine],
                      marker="o", capsize=3, color=f"C{index % 10}", label=mine[0]["label"])
    front = pareto_front([{"seconds": r["budget"], "error": 100 - r["accuracy"]} for r in rows])
    axis.step([p["seconds"] for p in front], [p["error"] for p in front], where="post", color="black",
              linewidth=1, label="Pareto frontier")
    axis.set_xlabel("budget (share of the full run's cost)")
    axis.set_ylabel("final test error (%)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_budget_report(root: str, title: str) -> str:
    budgets = load_budgets(root)
    if not budgets:
        raise ValueError(f"no budget<F>/seed*/ folders with logs in {root}")
    rows = summarize_budgets(budgets)
    plot_budgets(rows, os.path.join(root, "error_vs_budget.png"))
    every = {f"budget{budget:g}/{seed}": logs for budget, seeds in budgets.items() for seed, logs in seeds.items()}
    text = "\n".join([
        f"# {title}\n",
        budget_table(rows),
        "\nFinal test accuracy, mean ± standard deviation over the seeds run at that budget (bold: the most "
        "accurate). A budget is a share of the full plain run's cost (backward passes plus the selection "
        "forwards' share, --sb_cost_phi); every run's learning-rate schedule decays fully within it.\n",
        winners(rows),
        "\n## Training time over plain training's at the same budget\n",
        time_table(rows),
        "\nMean over seeds of each seed's ratio; the training loop's wall clock, evaluation excluded. Above 1x: the "
        "run took longer than its budget's share of the clock (a selection forward costs more than "
        "--sb_cost_phi says on this machine); below: less.\n",
        "\n![error vs budget](error_vs_budget.png)\n",
        f"{provenance_summary(every)} Each run's command is in its log.\n",
    ])
    path = os.path.join(root, "report.md")
    with open(path, "w") as handle:
        handle.write(text)
    return path
