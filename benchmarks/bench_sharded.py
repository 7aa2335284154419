"""The cost of keeping sharded forwards in lockstep: one Stale-SB run under DDP, DeepSpeed ZeRO-2 and ZeRO-3.

    python benchmarks/bench_sharded.py [--examples 403] [--epochs 4] [--out /tmp/bench_sharded]

Each engine trains the same tiny BERT classifier (``tests/dist_worker.py --text``) on 2 CPU processes
(torchrun, gloo, one thread each) with Stale-SB (n = 2), ``dataloader_drop_last`` and an odd number of
examples, so the ranks hold different numbers of rows to score in the stale epochs. Prints, per engine,
the counters of ``sb_stats.json`` (selection forwards in rows, lockstep forwards in one-row forwards) and
the main process's times: the whole training loop and its selection forwards. Run it on an idle machine;
the engines run one after another in one invocation, so their times compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"
ENGINES = {"ddp": [], "zero2": ["--zero", "2"], "zero3": ["--zero", "3"]}


def run(out: Path, engine: list[str], examples: int, epochs: int) -> dict:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER),
        "--out", str(out), "--text", "--strategy", "sb", "--staleness", "2", "--batch", "8", "--drop-last",
        "--examples", str(examples), "--epochs", str(epochs), *engine,
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=1800)
    return json.loads((out / "trainer" / "sb_stats.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=403)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_sharded"))
    options = parser.parse_args()
    print(f"{'engine':<7} {'steps':>5} {'sel. fwd rows':>13} {'lockstep fwds':>13} {'train s':>8} {'sel. fwd s':>10}")
    baseline = None
    for name, engine in ENGINES.items():
        stats = run(options.out / name, engine, options.examples, options.epochs)
        baseline = baseline or stats["train_seconds"]
        print(f"{name:<7} {stats['optimizer_steps']:>5} {stats['selection_forwards']:>13} "
              f"{stats['lockstep_forwards']:>13} {stats['train_seconds']:>8.1f} "
              f"{stats['selection_forward_seconds']:>10.2f}   ({stats['train_seconds'] / baseline:.2f}x DDP's time)")


if __name__ == "__main__":
    main()
