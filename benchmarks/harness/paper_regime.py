"""The report of the convergence-regime benchmark (`benchmarks/run_paper_regime.sh`).

Layout of its results folder:

- ``seed<k>/<strategy>.json``: full-length runs, one folder per seed; ``uniform-for-<strategy>.json`` is
  the random-subset control of ``<strategy>``, trained at the backward fraction that strategy realised.
- ``sweep/epochs<E>/<strategy>.json``: the same strategies on shorter budgets (seed 0), each run's
  learning-rate schedule decaying fully within its own epochs. With the seed-0 full-length runs they
  make the error-against-time Pareto figure (the paper's Fig. 14).

Every time-to-target figure is read against the Traditional run of the same seed and folder (its final
error x factor, the paper's Table 1). Beside the wall clock the report gives a *cost-model time*: the
run's counted backward passes and selection forwards times the unit costs measured in the same seed
(Traditional's training seconds per backward pass, SB's seconds per selection forward), which machine
noise does not move.
"""

from __future__ import annotations

import glob
import os
import re
import statistics

from .logs import BASELINE, CLOCKS, final_error, load_logs
from .report import time_to_error
from .seeds import _fmt as seeds_fmt
from .seeds import _spread as seeds_spread
from .seeds import load_seeds, provenance_summary

FACTORS = (1.0, 1.1, 1.2, 1.4)
CONTROL_PREFIX = "uniform-for-"
#: Convergence evidence for Traditional: training accuracy over the last quarter of the run, and how far test
#: accuracy strays from its final value over the last fifth of the evaluations.
TRAIN_SHARE, TRAIN_MIN_ACCURACY = 0.25, 0.98
TEST_SHARE, TEST_MAX_DEVIATION = 0.20, 0.005


def _spread(values: list[float]) -> tuple[float, float] | None:
    """`seeds`' mean and standard deviation, or None for no values (a strategy with no paired seed)."""
    return seeds_spread(values) if values else None


def _fmt(pair: tuple[float, float] | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if pair is None else seeds_fmt(pair, digits, suffix)


def backward_fraction(log: dict) -> float:
    """Backward passes per example read: what a uniform control must match to train as many examples."""
    stats = log["stats"]
    return stats["backwards"] / stats["examples_seen"]


def unit_costs(logs: dict[str, dict]) -> dict[str, float] | None:
    """Seconds per backward pass (Traditional: its whole training time over its backward passes, so data and
    optimizer time are in it) and per selection forward (SB's timer), from one seed's logs."""
    base, sb = logs.get(BASELINE), logs.get("sb")
    if base is None or sb is None or not sb["stats"].get("selection_forwards"):
        return None
    return {
        "backward": base["train_wall_seconds"] / base["stats"]["backwards"],
        "forward": sb["stats"]["selection_forward_seconds"] / sb["stats"]["selection_forwards"],
    }


def cost_model_seconds(log: dict, units: dict[str, float]) -> float:
    stats = log["stats"]
    return stats["backwards"] * units["backward"] + stats.get("selection_forwards", 0) * units["forward"]


def plateau(log: dict) -> dict:
    """Whether a run has plateaued by the measure above (needs evaluations with ``train_accuracy``)."""
    evals = log["evals"]
    last_train = evals[-max(1, round(TRAIN_SHARE * len(evals))):]
    last_test = evals[-max(1, round(TEST_SHARE * len(evals))):]
    final = evals[-1]["accuracy"]
    train_min = min(e.get("train_accuracy", float("nan")) for e in last_train)
    deviation = max(abs(e["accuracy"] - final) for e in last_test)
    return {
        "train_accuracy_min": train_min,
        "test_deviation_max": deviation,
        "low_loss_share": evals[-1].get("train_low_loss_share"),
        "converged": train_min >= TRAIN_MIN_ACCURACY and deviation <= TEST_MAX_DEVIATION,
    }


def summarize(seeds: dict[str, dict[str, dict]]) -> list[dict]:
    """One row per strategy: accuracy, wall and cost-model time and their ratios to Traditional, time to
    each factor of Traditional's final error (speedup over Traditional's time to it), over seeds."""
    names = list(dict.fromkeys(name for logs in seeds.values() for name in logs))
    rows = []
    for name in names:
        runs = [(logs[name], logs.get(BASELINE), unit_costs(logs)) for logs in seeds.values() if name in logs]
        row = {
            "strategy": name,
            "label": runs[0][0].get("label", name),
            "seeds": len(runs),
            "accuracy": _spread([100 * (1 - final_error(log)) for log, _, _ in runs]),
            "wall": _spread([log[CLOCKS["wall"]] for log, _, _ in runs]),
            "wall_ratio": _spread([base[CLOCKS["wall"]] / log[CLOCKS["wall"]] for log, base, _ in runs if base]),
            "model_ratio": _spread(
                [cost_model_seconds(base, u) / cost_model_seconds(log, u) for log, base, u in runs if base and u]
            ),
            "backward_fraction": statistics.fmean(backward_fraction(log) for log, _, _ in runs),
            "to_target": {},
        }
        for factor in FACTORS:
            speedups, reached, of = [], 0, 0
            for log, base, _ in runs:
                if base is None:
                    continue
                of += 1
                target = factor * final_error(base)
                ours, theirs = time_to_error(log, target), time_to_error(base, target)
                if ours is not None:
                    reached += 1
                    if theirs is not None:
                        speedups.append(theirs / ours)
            row["to_target"][factor] = {"reached": reached, "of": of, "speedup": _spread(speedups)}
        rows.append(row)
    return rows


def main_table(rows: list[dict]) -> str:
    head = (
        "| strategy | seeds | final accuracy (%) | training time (s) | time vs Traditional | cost-model time vs "
        "Traditional | backward fraction | "
        + " | ".join(f"to {f:g}x Trad. error: speedup (reached)" for f in FACTORS)
        + " |"
    )
    lines = [head, "|" + "---|" * (7 + len(FACTORS))]
    for row in rows:
        cells = [
            row["label"],
            str(row["seeds"]),
            _fmt(row["accuracy"], 2),
            _fmt(row["wall"], 0),
            _fmt(row["wall_ratio"], 2, "x"),
            _fmt(row["model_ratio"], 2, "x"),
            f"{row['backward_fraction']:.2f}",
        ]
        for factor in FACTORS:
            target = row["to_target"][factor]
            speed = _fmt(target["speedup"], 2, "x") if target["speedup"] else "not reached"
            cells.append(f"{speed} ({target['reached']}/{target['of']})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def control_table(seeds: dict[str, dict[str, dict]], factor: float = 1.2) -> str:
    """Each strategy against its uniform control, seed by seed: accuracy difference and time to `factor` x
    Traditional's final error (the paper's 'sooner than a random subset' question)."""
    lines = [
        f"| strategy | seeds | accuracy minus its control's (points) | time to {factor:g}x Trad. error: strategy / "
        "control (s) | control's time over the strategy's |",
        "|---|---|---|---|---|",
    ]
    names = list(dict.fromkeys(name for logs in seeds.values() for name in logs if CONTROL_PREFIX + name in logs))
    for name in names:
        gaps, times, ratios, label = [], [], [], name
        for logs in seeds.values():
            log, control, base = logs.get(name), logs.get(CONTROL_PREFIX + name), logs.get(BASELINE)
            if log is None or control is None:
                continue
            label = log.get("label", name)
            gaps.append(100 * (final_error(control) - final_error(log)))
            if base is not None:
                target = factor * final_error(base)
                ours, theirs = time_to_error(log, target), time_to_error(control, target)
                times.append(f"{_seconds(ours)} / {_seconds(theirs)}")
                if ours is not None and theirs is not None:
                    ratios.append(theirs / ours)
        per_seed = ", ".join(f"{g:+.2f}" for g in gaps)
        lines.append(
            f"| {label} | {len(gaps)} | {_fmt(_spread(gaps), 2)} ({per_seed}) | {'; '.join(times)} | "
            f"{_fmt(_spread(ratios), 2, 'x') if ratios else 'never both reached'} |"
        )
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f}"


def plateau_table(seeds: dict[str, dict[str, dict]]) -> str:
    """Whether each seed's Traditional run plateaued. Empty where none measured its fit of training rows."""
    lines = [
        f"| seed | training accuracy, lowest over the last {TRAIN_SHARE:.0%} | test accuracy's largest distance from "
        f"its final value over the last {TEST_SHARE:.0%} (points) | share of training losses < 0.1 at the end | "
        "final test accuracy | plateaued |",
        "|---|---|---|---|---|---|",
    ]
    for seed, logs in seeds.items():
        base = logs.get(BASELINE)
        if base is None or "train_accuracy" not in base["evals"][-1]:
            continue
        p = plateau(base)
        low = "-" if p["low_loss_share"] is None else f"{100 * p['low_loss_share']:.1f} %"
        lines.append(
            f"| {seed} | {100 * p['train_accuracy_min']:.1f} % | {100 * p['test_deviation_max']:.2f} | {low} | "
            f"{100 * base['evals'][-1]['accuracy']:.2f} % | {'yes' if p['converged'] else 'no'} |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def redundancy_table(seeds: dict[str, dict[str, dict]]) -> str:
    """Traditional's redundancy after each evaluation, mean over seeds: the share of training rows it already fits
    (loss below `runner.FIT_LOSS`) and below the median loss of its first evaluation. Empty without those fields."""
    runs = [logs[BASELINE]["evals"] for logs in seeds.values() if BASELINE in logs]
    runs = [evals for evals in runs if "train_below_first_median_share" in evals[0]]
    if not runs:
        return ""
    lines = [
        "| epoch | share of training rows with loss < 0.1 | share below the first evaluation's median loss | "
        "training accuracy |",
        "|---|---|---|---|",
    ]
    for position in range(min(len(evals) for evals in runs)):
        entries = [evals[position] for evals in runs]
        low = _spread([100 * e["train_low_loss_share"] for e in entries])
        below = _spread([100 * e["train_below_first_median_share"] for e in entries])
        accuracy = _spread([100 * e["train_accuracy"] for e in entries])
        # An evaluation at a fraction of an epoch lands a step past it: 0.250356 reads as 0.25.
        lines.append(f"| {round(entries[0]['epoch'], 2):g} | {_fmt(low)} % | {_fmt(below)} % | {_fmt(accuracy)} % |")
    return "\n".join(lines)


def target_table(rows: list[dict], seeds: dict[str, dict[str, dict]], min_speedup: float = 1.3,
                 min_gap: float = 0.5) -> str:
    """Which strategies reach Traditional's final accuracy (within its seed spread) at least ``min_speedup`` x
    sooner in training time, and end at least ``min_gap`` points above their uniform control in every seed."""
    base = next((row for row in rows if row["strategy"] == BASELINE), None)
    if base is None:
        return ""
    floor = base["accuracy"][0] - base["accuracy"][1]
    lines = [
        f"| strategy | final accuracy >= Traditional's mean - sd ({floor:.2f} %) | time vs Traditional >= "
        f"{min_speedup:g}x | lowest margin over its control, per seed (points) >= {min_gap:g} | all three |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        name = row["strategy"]
        if name == BASELINE or name.startswith(CONTROL_PREFIX):
            continue
        gaps = [
            100 * (final_error(logs[CONTROL_PREFIX + name]) - final_error(logs[name]))
            for logs in seeds.values()
            if name in logs and CONTROL_PREFIX + name in logs
        ]
        accurate = row["accuracy"][0] >= floor
        fast = row["wall_ratio"] is not None and row["wall_ratio"][0] >= min_speedup
        above = bool(gaps) and min(gaps) >= min_gap
        ratio = "-" if row["wall_ratio"] is None else f"{row['wall_ratio'][0]:.2f}x"
        margin = "no control" if not gaps else f"{min(gaps):+.2f}"
        lines.append(
            f"| {row['label']} | {'yes' if accurate else 'no'} ({row['accuracy'][0]:.2f} %) | "
            f"{'yes' if fast else 'no'} ({ratio}) | {'yes' if above else 'no'} ({margin}) | "
            f"{'**met**' if accurate and fast and above else 'no'} |"
        )
    return "\n".join(lines)


def load_sweep(root: str) -> dict[float, dict[str, dict]]:
    """{epochs: {strategy: log}}: every ``sweep/epochs<E>`` folder, plus the seed-0 full-length runs."""
    budgets = {}
    for folder in glob.glob(os.path.join(root, "sweep", "epochs*")):
        match = re.fullmatch(r"epochs([0-9.]+)", os.path.basename(folder))
        logs = load_logs(folder)
        if match and logs:
            budgets[float(match.group(1))] = logs
    full = load_logs(os.path.join(root, "seed0"))
    if budgets and full:
        budgets.setdefault(float(full[next(iter(full))]["num_train_epochs"]), full)
    return dict(sorted(budgets.items()))


def pareto_front(points: list[dict]) -> list[dict]:
    """The points no other point beats on both time and error, fastest first."""
    front, best = [], float("inf")
    for point in sorted(points, key=lambda p: (p["seconds"], p["error"])):
        if point["error"] < best:
            front.append(point)
            best = point["error"]
    return front


def sweep_points(budgets: dict[float, dict[str, dict]]) -> list[dict]:
    return [
        {
            "strategy": name,
            "label": log.get("label", name),
            "epochs": epochs,
            "seconds": log[CLOCKS["wall"]],
            "error": final_error(log),
        }
        for epochs, logs in budgets.items()
        for name, log in logs.items()
    ]


def sweep_table(budgets: dict[float, dict[str, dict]]) -> str:
    names = list(dict.fromkeys(name for logs in budgets.values() for name in logs))
    lines = [
        "| strategy | " + " | ".join(f"{e:g} epochs: accuracy, time" for e in budgets) + " |",
        "|---|" + "---|" * len(budgets),
    ]
    for name in names:
        label = next(logs[name].get("label", name) for logs in budgets.values() if name in logs)
        cells = []
        for logs in budgets.values():
            log = logs.get(name)
            cells.append(
                "-" if log is None else f"{100 * (1 - final_error(log)):.2f} %, {log[CLOCKS['wall']]:.0f} s"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def front_table(front: list[dict]) -> str:
    lines = [
        "| from (s) | to (s) | strategy owning the frontier | its budget (epochs) | its error (%) |",
        "|---|---|---|---|---|",
    ]
    for point, following in zip(front, [*front[1:], None], strict=True):
        end = "-" if following is None else f"{following['seconds']:.0f}"
        lines.append(
            f"| {point['seconds']:.0f} | {end} | {point['label']} | {point['epochs']:g} | {100 * point['error']:.2f} |"
        )
    return "\n".join(lines)


def plot_curves(seeds: dict[str, dict[str, dict]], path: str, x: str) -> str:
    """Test error against training time (``x='time'``, the paper's Fig. 7) or epochs (``'epoch'``, Fig. 10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 5.5))
    colours, labelled = {}, set()
    for logs in seeds.values():
        for name, log in logs.items():
            colour = colours.setdefault(name, f"C{len(colours) % 10}")
            style = "--" if name.startswith(CONTROL_PREFIX) else "-"
            xs = [e[CLOCKS["wall"]] if x == "time" else e["epoch"] for e in log["evals"]]
            axis.plot(xs, [100 * e["error"] for e in log["evals"]], style, color=colour, alpha=0.75,
                      label=None if name in labelled else log.get("label", name))
            labelled.add(name)
    axis.set_xlabel("training time (wall clock, s)" if x == "time" else "epochs (data read)")
    axis.set_ylabel("test error (%)")
    axis.set_yscale("log")
    axis.set_title(f"{len(seeds)} seed(s), one line per seed; dashed: uniform controls")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def plot_pareto(points: list[dict], front: list[dict], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 5.5))
    colours = {}
    for point in points:
        first = point["strategy"] not in colours
        colour = colours.setdefault(point["strategy"], f"C{len(colours) % 10}")
        label = point["label"] if first else None
        axis.scatter(point["seconds"], 100 * point["error"], color=colour, s=30, label=label)
        axis.annotate(f"{point['epochs']:g}", (point["seconds"], 100 * point["error"]), fontsize=6,
                      xytext=(3, 3), textcoords="offset points")
    axis.step([p["seconds"] for p in front], [100 * p["error"] for p in front], where="post", color="black",
              linewidth=1, label="Pareto frontier")
    axis.legend(fontsize=7)
    axis.set_xlabel("training time (wall clock, s)")
    axis.set_ylabel("final test error (%)")
    axis.set_title("Final error against time budget (numbers: epochs); each run's schedule decays within its budget")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_paper_regime_report(root: str, title: str) -> str:
    seeds = load_seeds(root)
    if not seeds:
        raise ValueError(f"no seed*/ folders with logs in {root}")
    rows = summarize(seeds)
    plot_curves(seeds, os.path.join(root, "error_vs_time.png"), "time")
    plot_curves(seeds, os.path.join(root, "error_vs_epoch.png"), "epoch")
    parts = [
        f"# {title}\n",
        "## Every strategy over seeds\n",
        main_table(rows),
        "\nMean ± standard deviation over seeds. Training time is the wall clock of the training loop, "
        "evaluation excluded; ratios are each seed's against its own Traditional run. Cost-model time: backward "
        "passes x Traditional's seconds per backward pass + selection forwards x SB's seconds per selection "
        "forward, both measured in the same seed. Backward fraction: backward passes per example read. "
        "Time to a target: the first evaluation at or below that multiple of the same seed's "
        "Traditional final error; speedup = Traditional's time to it over the strategy's.\n",
        "![error vs time](error_vs_time.png)\n\n![error vs epoch](error_vs_epoch.png)\n",
        "## Against the uniform control of the same backward fraction\n",
        control_table(seeds),
        "\nPositive accuracy differences favour the strategy. Per-seed values in brackets.\n",
    ]
    plateaus = plateau_table(seeds)
    if plateaus:
        parts += [
            "## Did Traditional converge?\n",
            plateaus,
            f"\nMeasured on the first training rows (images without augmentation) at every evaluation. Plateaued: "
            f"training accuracy >= {TRAIN_MIN_ACCURACY:.0%} throughout the last {TRAIN_SHARE:.0%} of evaluations and "
            f"test accuracy within {100 * TEST_MAX_DEVIATION:.1f} points of its final value throughout the last "
            f"{TEST_SHARE:.0%}.\n",
        ]
    redundancy = redundancy_table(seeds)
    if redundancy:
        parts += [
            "## How redundant the data is for Traditional\n",
            redundancy,
            "\nMean ± standard deviation over seeds, on the first training rows without augmentation, at every "
            "evaluation: the examples a backward pass would teach little.\n",
        ]
    targets = target_table(rows, seeds)
    if targets:
        parts += ["## Does a strategy beat both Traditional's time and its random subset?\n", targets, ""]
    budgets = load_sweep(root)
    if budgets:
        points = sweep_points(budgets)
        front = pareto_front(points)
        plot_pareto(points, front, os.path.join(root, "error_vs_budget_pareto.png"))
        parts += [
            "## Budget sweep (seed 0)\n",
            sweep_table(budgets),
            "\nEvery run's learning-rate schedule decays fully within its own epochs.\n",
            "![pareto](error_vs_budget_pareto.png)\n",
            front_table(front),
            "",
        ]
    parts.append(f"{provenance_summary(seeds)} Each run's command is in its log.\n")
    path = os.path.join(root, "report.md")
    with open(path, "w") as handle:
        handle.write("\n".join(parts))
    return path
