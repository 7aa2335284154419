"""Throughput and final validation loss of SFT runs with and without selection, beside the cost model.

    python scripts/sft_report.py --runs benchmarks/results/sst2-sft/none benchmarks/results/sst2-sft/sb ...

Reads each run folder that scripts/train_sft.py wrote (sb_stats.json, eval_results.json, train_results.json)
and prints a markdown table: tokens and sequences per second (those of the epochs read, packed or padded,
over training wall time), the speedup over the first run, and the cost model's ideal speedup over a run
without selection of the same layout (`hf_selective_backprop.benchmarks.cost_model`: Traditional
costs (1+r)F per example, SB phi*F + s(1+r)F, Stale-SB (phi/n)F + s(1+r)F) with the measured kept
fraction s and selection-forward cost phi, and r = 2 (a backward costs two forwards). A run named
`uniform-for-<run>` is that run's random-subset control: a second table sets each such pair side by side.
"""

import argparse
import os

from hf_selective_backprop.benchmarks.sft_report import load_run, render


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="Run folders; the first is the baseline.")
    args = parser.parse_args()
    print(render([(os.path.basename(os.path.normpath(folder)), load_run(folder)) for folder in args.runs]))


if __name__ == "__main__":
    main()
