"""Throughput and final validation loss of SFT runs with and without selection, beside the cost model.

    python benchmarks/sft_report.py --runs benchmarks/results/sst2-sft/none benchmarks/results/sst2-sft/sb ...
    python benchmarks/sft_report.py --root benchmarks/results/finetune-sst2-sft

Reads each run folder that scripts/train_sft.py wrote (sb_stats.json, eval_results.json, train_results.json)
and prints a markdown table: tokens and sequences per second (those of the epochs read, packed or padded,
over training wall time), the speedup over the first run, and the cost model's ideal speedup over a run
without selection of the same layout (`harness.cost_model`: Traditional
costs (1+r)F per example, SB phi*F + s(1+r)F, Stale-SB (phi/n)F + s(1+r)F) with the measured kept
fraction s and selection-forward cost phi, and r = 2 (a backward costs two forwards). A run named
`uniform-for-<run>` is that run's random-subset control: a second table sets each such pair side by side.
With --root, the same over every seed*/ folder of it (benchmarks/run_finetune_sft.sh): mean ± sd of each run's
loss, token accuracy and speedup against its seed's Traditional run (`none`), each strategy against its
control seed by seed, and the fine-tuning target.
"""

import argparse
import os

from harness.sft_report import load_run, load_seeds, render, render_seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--runs", nargs="+", help="Run folders; the first is the baseline.")
    source.add_argument("--root", help="A folder of seed*/ folders of runs, each seed's Traditional run in none/.")
    parser.add_argument("--target", type=float, default=1.3,
                        help="With --root: the speedup the fine-tuning target asks for (default 1.3).")
    args = parser.parse_args()
    if args.root:
        print(render_seeds(load_seeds(args.root), args.target))
    else:
        print(render([(os.path.basename(os.path.normpath(folder)), load_run(folder)) for folder in args.runs]))


if __name__ == "__main__":
    main()
