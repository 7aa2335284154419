"""Throughput and final validation loss of SFT runs with and without selection, beside the cost model.

    python scripts/sft_report.py --runs benchmarks/results/sst2-sft/none benchmarks/results/sst2-sft/sb ...

Reads each run folder that scripts/train_sft.py wrote (sb_stats.json, eval_results.json, train_results.json)
and prints a markdown table: tokens and sequences per second (those of the epochs read, packed or padded,
over training wall time), the speedup over the first run, and the cost model's ideal speedup over a run
without selection of the same layout (`hf_selective_backprop.benchmarks.cost_model`: Traditional
costs (1+r)F per example, SB phi*F + s(1+r)F, Stale-SB (phi/n)F + s(1+r)F) with the measured kept
fraction s and selection-forward cost phi, and r = 2 (a backward costs two forwards).
"""

import argparse
import json
import os

from hf_selective_backprop.benchmarks.cost_model import PAPER_R, forward_from_step, ideal_speedup, phi_from_times


def load(folder: str) -> dict:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="Run folders; the first is the baseline.")
    args = parser.parse_args()
    runs = [(os.path.basename(os.path.normpath(folder)), load(folder)) for folder in args.runs]
    base = runs[0][1]["tokens_per_second"]
    print("| run | tokens/s | sequences/s | speedup | cost model's ideal | kept fraction | backwards | "
          "selection forwards | final validation loss | mean token accuracy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, stats in runs:
        print(
            f"| {name} | {stats['tokens_per_second']:.0f} | {stats['sequences_per_second']:.1f} | "
            f"{stats['tokens_per_second'] / base:.2f}x | "
            f"{run_ideal_speedup(stats):.2f}x | {stats.get('kept_fraction', 1.0):.2f} | {stats['backwards']:,} | "
            f"{stats.get('selection_forwards', 0):,} | {stats['eval_loss']:.4f} | "
            + ("-" if stats["eval_token_accuracy"] is None else f"{100 * stats['eval_token_accuracy']:.2f} %")
            + " |"
        )


if __name__ == "__main__":
    main()
