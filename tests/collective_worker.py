"""One process of short two-process trainings of every strategy, each collective recorded (tests/test_collectives.py).

Each run is `dist_worker.run` with its own arguments (``RUNS``), one after another in this process, with
`collective_log.CollectiveLog` installed: after each run the ranks compare their records of it. Writes
``<out>/rank{rank}.pt``: for each run, the comparison, the step reached and the weights.
"""

from __future__ import annotations

import argparse
import os

import torch
from collective_log import CollectiveLog
from dist_worker import parse_args, run
from worker_exit import exit_after_results

SHORT = ["--examples", "64", "--batch", "4", "--epochs", "2"]
#: Every built-in strategy, one defined outside the package, Stale-SB with stored losses looked up batch by batch
#: (--interrupt leaves its epochs unplanned), RHO-LOSS whose reference pass reads shares of different lengths
#: (even_batches=False on 67 rows) and a budget run.
RUNS = {
    "sb": ["--strategy", "sb"],
    "topk": ["--strategy", "topk"],
    "composer": ["--strategy", "composer"],
    "uniform": ["--strategy", "uniform"],
    "kath18": ["--strategy", "kath18"],
    "infobatch": ["--strategy", "infobatch", "--epochs", "3"],
    "easiest": ["--strategy", "easiest", "--keep", "0.5"],
    "stale-sb": ["--strategy", "sb", "--staleness", "2", "--loss", "id", "--epochs", "3", "--interrupt", "4",
                 "--scope", "local"],
    "rholoss": ["--strategy", "rholoss", "--reference", "--keep", "0.5", "--examples", "67", "--uneven-batches"],
    "budget": ["--strategy", "sb", "--budget", "0.5", "--epochs", "4"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", default=",".join(RUNS), help="which of RUNS, comma-separated")
    options = parser.parse_args()
    log = CollectiveLog("cpu").install()
    results = {}
    for name in options.runs.split(","):
        log.reset()
        result = run(parse_args(["--out", os.path.join(options.out, name), *SHORT, *RUNS[name]]))
        results[name] = {"collectives": log.compare(), "global_step": result["global_step"],
                         "weights": result["weights"], "stats": result["sb_stats"]}
    rank = int(os.environ["RANK"])
    torch.save(results, os.path.join(options.out, f"rank{rank}.pt"))
    exit_after_results()


if __name__ == "__main__":
    main()
