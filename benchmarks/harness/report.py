"""Table-1 figures (time to a target error, speedups) and the Figure-1 time breakdown,
computed from the per-strategy JSON logs alone (no torch, no transformers)."""

from __future__ import annotations

import math
import os

from .logs import BASELINE, CLOCKS, FACTORS, breakdown, final_error, load_logs


def time_to_error(log: dict, target: float, clock: str = "wall") -> float | None:
    """Training time at the first evaluation whose test error is <= `target`; None if never.

    Read off the per-epoch evaluations as the paper does (no interpolation between them).
    """
    key = CLOCKS[clock]
    for entry in log["evals"]:
        if entry["error"] <= target + 1e-12:
            return entry[key]
    return None


def speedup(baseline_seconds: float | None, seconds: float | None) -> float | None:
    if baseline_seconds is None or seconds is None or seconds <= 0:
        return None
    return baseline_seconds / seconds


def table1(logs: dict[str, dict], clock: str = "wall", factors=FACTORS, baseline: str = BASELINE) -> dict:
    """Per strategy: time to each factor x baseline's final error, speedup, final error, costs."""
    if baseline not in logs:
        raise ValueError(f"no {baseline!r} log: Table 1 is relative to Traditional's final error")
    base_error = final_error(logs[baseline])
    targets = {f: f * base_error for f in factors}
    base_times = {f: time_to_error(logs[baseline], t, clock) for f, t in targets.items()}
    rows = []
    for name, log in logs.items():
        times = {f: time_to_error(log, t, clock) for f, t in targets.items()}
        rows.append(
            {
                "strategy": name,
                "label": log.get("label", name),
                "times": times,
                "speedups": {f: speedup(base_times[f], times[f]) for f in factors},
                "final_error": final_error(log),
                "best_error": min(e["error"] for e in log["evals"]),
                "epochs": log.get("epochs_trained", log["evals"][-1]["epoch"]),
                "train_seconds": log["evals"][-1][CLOCKS[clock]],
                "backwards": log["stats"].get("backwards"),
                "selection_forwards": log["stats"].get("selection_forwards"),
            }
        )
    return {"clock": clock, "baseline_error": base_error, "targets": targets, "rows": rows}


def epochs_for_budget(log: dict, budget: float, clock: str = "wall") -> float:
    """Epochs after which `log`'s run had spent `budget` training seconds.

    Interpolates the cumulative training time between evaluations (one per epoch); past
    the end of the log, extrapolates at the cost of the last `cycle` epochs (Stale-SB's
    costs repeat every n epochs; warm-up epochs are in the past by then).
    """
    key = CLOCKS[clock]
    points = [(0.0, 0.0)] + [(e["epoch"], e[key]) for e in log["evals"]]
    for (e0, t0), (e1, t1) in zip(points, points[1:], strict=False):
        if t0 <= budget <= t1:
            return e0 + (e1 - e0) * (budget - t0) / (t1 - t0) if t1 > t0 else e1
    cycle = max(int(log.get("cycle", 1)), 1)
    e_last, t_last = points[-1]
    e_ref, t_ref = points[max(len(points) - 1 - cycle, 0)]
    per_epoch = (t_last - t_ref) / (e_last - e_ref)
    return e_last + (budget - t_last) / per_epoch


def relative_epoch_costs(log: dict, base: dict, clock: str = "wall") -> list[float]:
    """Cost of each of `log`'s epochs in epochs of `base` (Traditional) run in the same round.

    With interleaved runs epoch k of every strategy is timed in the same few minutes, so the
    ratio cancels a machine load that drifts between rounds; absolute seconds do not.
    """
    key = CLOCKS[clock]

    def per_epoch(evals):
        times = [0.0] + [e[key] for e in evals if abs(e["epoch"] - round(e["epoch"])) < 1e-6]
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    mine, theirs = per_epoch(log["evals"]), per_epoch(base["evals"])
    return [m / t for m, t in zip(mine, theirs, strict=False) if t > 0]


def epochs_for_relative_budget(log: dict, base: dict, budget_epochs: float, clock: str = "wall") -> float:
    """Epochs `log`'s strategy can train for the cost of `budget_epochs` epochs of `base`.

    Sums `relative_epoch_costs`; past the end of the logs, extrapolates at the mean relative
    cost of the last `cycle` epochs (Stale-SB's costs repeat every n epochs).
    """
    costs = relative_epoch_costs(log, base, clock)
    if not costs:
        raise ValueError(f"no common whole epochs between {log['strategy']!r} and {base['strategy']!r}")
    spent = 0.0
    for k, cost in enumerate(costs):
        if spent + cost >= budget_epochs:
            return k + (budget_epochs - spent) / cost
        spent += cost
    cycle = max(int(log.get("cycle", 1)), 1)
    steady = sum(costs[-cycle:]) / len(costs[-cycle:])
    return len(costs) + (budget_epochs - spent) / steady


def _fmt_time(seconds: float | None) -> str:
    return "not reached" if seconds is None else f"{seconds:.0f} s"


def _fmt_speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _fmt_count(value) -> str:
    return "-" if value is None else f"{int(value):,}"


def render_table1(table: dict) -> str:
    factors = list(table["targets"])
    head = ["Strategy"]
    for f in factors:
        head += [f"time to {f:.1f}x ({100 * table['targets'][f]:.2f} %)", f"speedup @{f:.1f}x"]
    head += ["final error", "best error", "epochs", "training time", "backwards", "selection forwards"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table["rows"]:
        cells = [row["label"]]
        for f in factors:
            cells += [_fmt_time(row["times"][f]), _fmt_speedup(row["speedups"][f])]
        cells += [
            f"{100 * row['final_error']:.2f} %",
            f"{100 * row['best_error']:.2f} %",
            f"{row['epochs']:.2f}",
            f"{row['train_seconds']:.0f} s",
            _fmt_count(row["backwards"]),
            _fmt_count(row["selection_forwards"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt_part(seconds: float, total: float) -> str:
    return f"{seconds:.1f} s ({100 * seconds / total:.0f} %)"


def _fmt_step_ms(log: dict) -> str:
    steps = log["stats"].get("optimizer_steps", 0)
    seconds = log.get("timings", {}).get("optimizer_seconds")
    return f"{1000 * seconds / steps:.1f} ms" if steps and seconds is not None else "-"


def render_breakdown(logs: dict[str, dict]) -> str:
    base = logs.get(BASELINE)
    head = [
        "Strategy",
        "selection forwards",
        "selection bookkeeping",
        "training fwd+bwd+step",
        "data",
        "other",
        "total",
        "bookkeeping share",
        "examples/s",
        "throughput vs Traditional",
        "kept fraction",
        # The same work in every run: it tells a slower machine from a costlier strategy.
        "optimizer step",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base_rate = None
    if base is not None:
        base_rate = base["stats"]["examples_seen"] / base["train_wall_seconds"]
    for name, log in logs.items():
        b = breakdown(log)
        total = b["total"] or math.nan

        rate = log["stats"]["examples_seen"] / log["train_wall_seconds"]
        share = b["selection_overhead"] / b["training"] if b["training"] else 0.0
        lines.append(
            "| "
            + " | ".join(
                [
                    log.get("label", name),
                    _fmt_part(b["selection_forward"], total),
                    _fmt_part(b["selection_overhead"], total),
                    _fmt_part(b["training"], total),
                    _fmt_part(b["data"], total),
                    _fmt_part(b["other"], total),
                    f"{b['total']:.1f} s",
                    f"{100 * share:.1f} %",
                    f"{rate:.0f}",
                    _fmt_speedup(rate / base_rate if base_rate else None),
                    f"{log['stats'].get('kept_fraction', 1.0):.3f}",
                    _fmt_step_ms(log),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def render_epochs(logs: dict[str, dict]) -> str:
    """Per-epoch test error and cumulative training time (wall / CPU) of every strategy."""
    names = list(logs)
    longest = max(len(log["evals"]) for log in logs.values())
    head = ["eval #"] + [logs[n].get("label", n) for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i in range(longest):
        cells = [str(i + 1)]
        for n in names:
            evals = logs[n]["evals"]
            if i < len(evals):
                e = evals[i]
                cells.append(
                    f"ep {e['epoch']:.2f}: {100 * e['error']:.2f} % @ {e['train_wall_seconds']:.0f} s / "
                    f"{e['train_cpu_seconds']:.0f} cpu-s"
                )
            else:
                cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_report(logs: dict[str, dict], title: str = "Benchmark", notes: str = "") -> str:
    any_log = next(iter(logs.values()))
    settings = any_log.get("settings", {})
    machine = any_log.get("machine", {})
    parts = [f"# {title}", ""]
    if notes:
        parts += [notes, ""]
    parts += [
        f"Dataset `{any_log.get('dataset')}` ({any_log.get('train_examples')} train / "
        f"{any_log.get('eval_examples')} evaluation examples), model `{any_log.get('model')}`, "
        f"batch {settings.get('batch_size')}, {_optimizer(settings)}, {settings.get('lr_scheduler_type')} LR "
        f"decay over each run's own epochs, seed {settings.get('seed')}. Device: {machine.get('device')}, "
        f"{machine.get('torch_threads')} torch threads, {machine.get('cpus')} CPUs.",
        "",
    ]
    if any_log.get("protocol") == "budget":
        sizing = (
            "each strategy's per-epoch cost relative to Traditional's in the same round of the "
            "interleaved paper-protocol run, summed until it equals Traditional's epochs"
            if any_log.get("budget_sizing") == "traditional-epochs"
            else f"a budget of {any_log.get('budget_seconds', 0):.0f} s over each strategy's per-epoch cost"
        )
        parts += [
            "Equal-budget protocol: every strategy trains for the cost of Traditional's paper-protocol run "
            f"({any_log.get('budget_seconds', 0):.0f} s {any_log.get('budget_clock', 'wall')} there), its LR "
            f"schedule spanning its own epochs. Epochs were sized from {sizing}: "
            + ", ".join(f"{log.get('label', n)} {log['num_train_epochs']:g}" for n, log in logs.items())
            + ".",
            "",
        ]
    if BASELINE in logs:
        for clock, what in (("wall", "training wall time"), ("cpu", "training process CPU time")):
            table = table1(logs, clock)
            parts += [
                f"## Time to Traditional's final error x factor ({what}, evaluation excluded)",
                "",
                f"Traditional's final test error: {100 * table['baseline_error']:.2f} %. "
                "Speedup = Traditional's time to the target / the strategy's time to it; "
                "'not reached' = no per-epoch evaluation got there.",
                "",
                render_table1(table),
                "",
            ]
    parts += [
        "## Where the training time went (wall seconds, evaluation excluded; cf. the paper's Figure 1)",
        "",
        "'training' is the training forward + backward + optimizer step on the kept batches; "
        "'data' is reading and augmenting batches; 'other' is the rest of the loop (callbacks, "
        "logging, scheduler). Bookkeeping share = selection bookkeeping / training time.",
        "",
        render_breakdown(logs),
        "",
        "## Per-epoch log (test error @ cumulative training time)",
        "",
        render_epochs(logs),
        "",
        "Load average (1/5/15 min) before -> after each run: "
        + "; ".join(
            f"{log.get('label', n)} {tuple(round(x, 1) for x in log['machine']['loadavg_before'])} -> "
            f"{tuple(round(x, 1) for x in log['machine']['loadavg_after'])}"
            for n, log in logs.items()
            if "machine" in log
        ),
        "",
    ]
    return "\n".join(parts)


def default_title(logs: dict[str, dict]) -> str:
    """E.g. 'cifar10: paper protocol (8 epochs each)', from what the logs record."""
    log = next(iter(logs.values()))
    name = os.path.basename(os.path.normpath(str(log.get("dataset", "benchmark"))))
    if log.get("protocol") == "budget":
        clock = "wall" if log.get("budget_clock", "wall") == "wall" else "CPU"
        return f"{name}: equal training-time budget ({log['budget_seconds']:.0f} s {clock} each)"
    return f"{name}: paper protocol ({log['num_train_epochs']:g} epochs each)"


def _optimizer(settings: dict) -> str:
    """E.g. "SGD lr 0.1 momentum 0.9 wd 0.0005" or "adamw_torch lr 0.001 wd 0.01, warm-up 0.06"."""
    optim = settings.get("optim", "sgd")  # logs written before the flag existed trained with SGD
    text = f"SGD lr {settings.get('learning_rate')} momentum {settings.get('momentum')}" if optim == "sgd" else (
        f"{optim} lr {settings.get('learning_rate')}"
    )
    text += f" wd {settings.get('weight_decay')}"
    if settings.get("warmup_steps"):
        text += f", warm-up {settings['warmup_steps']:g}"
    return text


def write_report(folder: str, title: str | None = None, notes: str = "", plots: bool = True) -> str:
    logs = load_logs(folder)
    if not logs:
        raise ValueError(f"no strategy logs (*.json) in {folder}")
    title = title or default_title(logs)
    text = render_report(logs, title, notes)
    if plots:
        # Imported here: matplotlib comes with the optional `benchmarks` extra, the text report does not need it.
        from .plots import plot_breakdown, plot_error_vs_time

        for clock in CLOCKS:
            plot_error_vs_time(logs, os.path.join(folder, f"error_vs_{clock}_time.png"), clock, title)
        plot_breakdown(logs, os.path.join(folder, "time_breakdown.png"), title)
        text += "\n![test error vs training wall time](error_vs_wall_time.png)\n\n"
        text += "![test error vs training CPU time](error_vs_cpu_time.png)\n\n"
        text += "![time breakdown](time_breakdown.png)\n"
    path = os.path.join(folder, "report.md")
    with open(path, "w") as handle:
        handle.write(text)
    return path
