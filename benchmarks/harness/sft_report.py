"""The SFT benchmark's report: throughput and final validation loss of scripts/train_sft.py runs, beside the cost
model and, for each strategy run with a ``uniform-for-<strategy>`` run among them, beside that random subset.

Each run folder holds what scripts/train_sft.py writes: sb_stats.json, eval_results.json, train_results.json.
"""

import glob
import json
import os
import statistics

from .cost_model import PAPER_R, forward_from_step, ideal_speedup, phi_from_times

#: A strategy's uniform control: the run named this prefix and the strategy's name (benchmarks/run_finetune_sft.sh).
CONTROL_PREFIX = "uniform-for-"


def load_run(folder: str) -> dict:
    """One run's counters, its final validation loss and mean token accuracy, and its throughput."""
    with open(os.path.join(folder, "sb_stats.json")) as handle:
        stats = json.load(handle)
    with open(os.path.join(folder, "eval_results.json")) as handle:
        evaluation = json.load(handle)
    stats["eval_loss"] = evaluation["eval_loss"]
    # TRL's mean token accuracy (of the answer alone on prompt-completion data); older runs lack it.
    stats["eval_token_accuracy"] = evaluation.get("eval_mean_token_accuracy")
    with open(os.path.join(folder, "train_results.json")) as handle:
        train = json.load(handle)
    epochs = train["num_train_epochs"]  # an epoch-based run reads exactly that many epochs
    stats["tokens_per_second"] = train["train_tokens_per_epoch"] * epochs / stats["train_seconds"]
    stats["sequences_per_second"] = train["train_sequences_per_epoch"] * epochs / stats["train_seconds"]
    return stats


def run_ideal_speedup(stats: dict) -> float:
    """The cost model's epoch speedup over Traditional, with this run's kept fraction and selection forward cost."""
    kept = stats.get("kept_fraction", 1.0)
    if not stats.get("selection_forwards"):  # Traditional, or a subset decided without scoring
        return ideal_speedup(PAPER_R, phi=0.0, kept=kept, scored=0.0)
    # F from the training phase: each trained example cost (1 + r) F there.
    forward = forward_from_step(stats["training_seconds"] / stats["backwards"], PAPER_R)
    phi = phi_from_times(stats["selection_forward_seconds"], stats["selection_forwards"], forward)
    share_scored = stats["selection_forwards"] / stats["examples_seen"]  # 1 for SB, about 1/n for Stale-SB
    return ideal_speedup(PAPER_R, phi=phi, kept=kept, scored=share_scored)


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def render(runs: list[tuple[str, dict]]) -> str:
    """Markdown: every run against the first (the baseline), then each strategy against its uniform control."""
    base = runs[0][1]["tokens_per_second"]
    lines = [
        "| run | tokens/s | sequences/s | speedup | cost model's ideal | kept fraction | backwards | "
        "selection forwards | final validation loss | mean token accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, stats in runs:
        lines.append(
            f"| {name} | {stats['tokens_per_second']:.0f} | {stats['sequences_per_second']:.1f} | "
            f"{stats['tokens_per_second'] / base:.2f}x | {run_ideal_speedup(stats):.2f}x | "
            f"{stats.get('kept_fraction', 1.0):.2f} | {stats['backwards']:,} | "
            f"{stats.get('selection_forwards', 0):,} | "
            f"{stats['eval_loss']:.4f} | {_accuracy(stats['eval_token_accuracy'])} |"
        )
    by_name = dict(runs)
    paired = [(name, CONTROL_PREFIX + name) for name, _ in runs if CONTROL_PREFIX + name in by_name]
    if paired:
        lines += [
            "",
            "Against the uniform control of the same backward fraction (a random subset of the same size, the same "
            "schedule); negative loss differences favour the strategy:",
            "",
            "| strategy | speedup | its control's speedup | validation loss minus its control's | "
            "mean token accuracy minus its control's (points) | lower loss than its control |",
            "|---|---|---|---|---|---|",
        ]
        for name, control_name in paired:
            strategy, control = by_name[name], by_name[control_name]
            loss_gap = strategy["eval_loss"] - control["eval_loss"]
            accuracies = strategy["eval_token_accuracy"], control["eval_token_accuracy"]
            accuracy_gap = "-" if None in accuracies else f"{100 * (accuracies[0] - accuracies[1]):+.2f}"
            lines.append(
                f"| {name} | {strategy['tokens_per_second'] / base:.2f}x | "
                f"{control['tokens_per_second'] / base:.2f}x | "
                f"{loss_gap:+.4f} | {accuracy_gap} | {'yes' if loss_gap < 0 else 'no'} |"
            )
    return "\n".join(lines)


#: Traditional's run folder in each seed (benchmarks/run_finetune_sft.sh).
BASELINE_RUN = "none"
#: The target's saving: at least this many times less training time than Traditional.
TARGET_SPEEDUP = 1.3


def load_seeds(root: str) -> dict[str, dict[str, dict]]:
    """{seed folder: {run: its figures}} for every ``seed*`` folder of ``root`` with a finished Traditional run;
    a run counts once its eval_results.json exists (an interrupted run has none)."""
    seeds = {}
    for seed_folder in sorted(glob.glob(os.path.join(root, "seed*"))):
        runs = {
            os.path.basename(os.path.dirname(path)): load_run(os.path.dirname(path))
            for path in sorted(glob.glob(os.path.join(seed_folder, "*", "eval_results.json")))
        }
        if BASELINE_RUN in runs:
            seeds[os.path.basename(seed_folder)] = runs
    return seeds


def _spread(values: list[float | None], digits: int = 4) -> str:
    """Mean ± sd, or "-" where a run lacks the figure (older runs have no token accuracy)."""
    if None in values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {sd:.{digits}f}"


def _points(value: float | None) -> float | None:
    return None if value is None else 100 * value


def _run_order(names: set[str]) -> list[str]:
    """Traditional, then the strategies, then their controls."""
    controls = sorted(name for name in names if name.startswith(CONTROL_PREFIX))
    strategies = sorted(names - set(controls) - {BASELINE_RUN})
    return [BASELINE_RUN, *strategies, *controls]


def render_seeds(seeds: dict[str, dict[str, dict]], target: float = TARGET_SPEEDUP) -> str:
    """Markdown over seeds: each run's loss, token accuracy and speed against the same seed's Traditional run, each
    strategy against its uniform control seed by seed, the fine-tuning target for each strategy (``target``: the
    speedup it asks for), and the largest lossless saving of the strategies and of the random subsets."""
    if not seeds:
        raise ValueError("no seed*/ folder with a finished Traditional run (none/eval_results.json)")
    shared = set.intersection(*(set(runs) for runs in seeds.values()))
    names = _run_order(shared)

    def per_seed(name: str, figure) -> list[float]:
        return [figure(runs[name], runs[BASELINE_RUN]) for runs in seeds.values()]

    def speedup(run: dict, base: dict) -> float:
        return base["train_seconds"] / run["train_seconds"]

    lines = [
        f"Mean ± standard deviation over {len(seeds)} seed(s) ({', '.join(seeds)}); speedup: the same seed's "
        "Traditional training time over the run's.",
        "",
        "| run | final validation loss | mean token accuracy (%) | speedup | backward fraction |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        accuracy = per_seed(name, lambda run, base: _points(run["eval_token_accuracy"]))
        lines.append(
            f"| {name} | {_spread(per_seed(name, lambda run, base: run['eval_loss']))} | "
            f"{_spread(accuracy, digits=2)} | "
            f"{statistics.fmean(per_seed(name, speedup)):.2f}x | "
            f"{statistics.fmean(per_seed(name, lambda run, base: run['backwards'] / run['examples_seen'])):.2f} |"
        )
    seconds = per_seed(BASELINE_RUN, lambda run, base: run["train_seconds"])
    lines += ["", f"Traditional's training time: {_spread(seconds, digits=0)} s."]
    base_losses = per_seed(BASELINE_RUN, lambda run, base: run["eval_loss"])
    bar = statistics.fmean(base_losses) + (statistics.stdev(base_losses) if len(base_losses) > 1 else 0.0)
    paired = [name for name in names if CONTROL_PREFIX + name in shared]
    lines += [
        "",
        "Each strategy against its uniform control, per seed (negative loss differences favour the strategy), "
        f"and the target: a final validation loss within Traditional's spread (at most its mean + sd, {bar:.4f}), "
        f"at least {target}x less training time, and a lower loss than the control in every seed:",
        "",
        "| strategy | loss minus its control's | token accuracy minus its control's (points) | loss <= "
        f"{bar:.4f} | speedup >= {target}x | lower loss than its control in every seed | all three |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in paired:
        control = CONTROL_PREFIX + name
        gaps = [runs[name]["eval_loss"] - runs[control]["eval_loss"] for runs in seeds.values()]
        accuracies = [(runs[name]["eval_token_accuracy"], runs[control]["eval_token_accuracy"])
                      for runs in seeds.values()]
        accuracy_gaps = ("-" if any(None in pair for pair in accuracies)
                         else ", ".join(f"{100 * (mine - theirs):+.2f}" for mine, theirs in accuracies))
        loss = statistics.fmean(per_seed(name, lambda run, base: run["eval_loss"]))
        fast = statistics.fmean(per_seed(name, speedup))
        checks = [loss <= bar, fast >= target, all(gap < 0 for gap in gaps)]
        lines.append(
            f"| {name} | {', '.join(f'{gap:+.4f}' for gap in gaps)} | "
            f"{accuracy_gaps} | "
            f"{'yes' if checks[0] else 'no'} ({loss:.4f}) | {'yes' if checks[1] else 'no'} ({fast:.2f}x) | "
            f"{'yes' if checks[2] else 'no'} | {'yes' if all(checks) else 'no'} |"
        )
    lossless = {
        name: statistics.fmean(per_seed(name, speedup))
        for name in names
        if name != BASELINE_RUN and statistics.fmean(per_seed(name, lambda run, base: run["eval_loss"])) <= bar
    }
    strategies = {name: saving for name, saving in lossless.items() if not name.startswith(CONTROL_PREFIX)}
    controls = {name: saving for name, saving in lossless.items() if name.startswith(CONTROL_PREFIX)}
    lines += ["", f"Largest lossless saving (mean validation loss at most {bar:.4f}):", ""]
    for kind, found in (("strategies", strategies), ("uniform random subsets", controls)):
        best = max(found, key=found.get, default=None)
        lines.append(f"- {kind}: " + ("none" if best is None else f"{best}, {found[best]:.2f}x"))
    return "\n".join(lines)
