"""The SFT benchmark's report: throughput and final validation loss of scripts/train_sft.py runs, beside the cost
model and, for each strategy run with a ``uniform-for-<strategy>`` run among them, beside that random subset.

Each run folder holds what scripts/train_sft.py writes: sb_stats.json, eval_results.json, train_results.json.
"""

import json
import os

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
