"""What selection holds and moves per rank as the dataset grows: the O(N) parts, measured at N examples.

    python benchmarks/bench_scale.py [--examples 1000000 10000000] [--selection-batch 128] [--processes 8]

Every rank holds the same Stale-SB loss store and, in a planned epoch, the same plan; the main process
makes the plan and broadcasts it. For each N this builds them as the engine does (`LossStore`, `stale_plan`
with the `sb` rule, `epoch_planner.by_id`'s per-id tensors) and prints their bytes, the time the main
process takes to make a stale epoch's plan, and the pickled size of the broadcast (`broadcast_object_list`
pickles it). The per-selection-batch gathers (`engine.distributed.gather_pairs`: ids and losses as two
float64 per row, padded to the rank with most rows, plus one int64 count per rank) do not depend on N; their
bytes per rank are printed for ``--processes`` ranks.
"""

from __future__ import annotations

import argparse
import pickle
import time

import torch

from hf_selective_backprop import SelectiveBackpropConfig
from hf_selective_backprop.engine.epoch_plan import EpochPlan, stale_plan
from hf_selective_backprop.engine.store import LossStore
from hf_selective_backprop.selectors import build_selector


def plan_by_id(plan: EpochPlan, ids: torch.Tensor) -> EpochPlan:
    """The plan as the engine keeps and broadcasts it: indexed by example id."""
    size = int(ids.max()) + 1
    copies = torch.zeros(size, dtype=torch.int32).index_copy_(0, ids, plan.copies)
    scored = torch.zeros(size, dtype=torch.bool).index_copy_(0, ids, plan.scored)
    return EpochPlan(copies, scored, None)


def measure(n: int, selection_batch: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    store = LossStore(n)
    ids = torch.arange(n)
    store.update(ids, torch.rand(n, generator=generator), epoch=0)
    args = SelectiveBackpropConfig(output_dir="/tmp/bench_scale", report_to="none", sb_strategy="sb", sb_staleness=2)
    selector = build_selector(args)
    stored, _ = store.lookup(ids)
    start = time.perf_counter()
    plan, _ = stale_plan(selector, stored, generator, selection_batch)
    plan_seconds = time.perf_counter() - start
    by_id = plan_by_id(plan, ids)
    plan_bytes = sum(t.nbytes for t in (by_id.copies, by_id.scored))
    return {
        "store": store.losses.nbytes + store.epochs.nbytes,
        "ids_by_position": ids.nbytes,
        "plan": plan_bytes,
        "broadcast": len(pickle.dumps(by_id)),
        "plan_seconds": plan_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--selection-batch", type=int, default=128, help="rows per selection batch, per process")
    parser.add_argument("--processes", type=int, default=8)
    options = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'examples':>14} {'store':>10} {'ids':>10} {'plan':>10} {'broadcast':>10} {'plan time':>10}")
    for n in options.examples:
        row = measure(n, options.selection_batch)
        print(f"{n:>14,} {row['store'] / n:>8.1f} B {row['ids_by_position'] / n:>8.1f} B {row['plan'] / n:>8.1f} B "
              f"{row['broadcast'] / n:>8.1f} B {row['plan_seconds']:>8.2f} s   (bytes per example)")
    rows, ranks = options.selection_batch, options.processes
    gather = ranks * 8 + ranks * rows * 16
    print(f"gather per selection batch and rank, {ranks} ranks x {rows} rows: {gather:,} B received "
          "(independent of the number of examples)")


if __name__ == "__main__":
    main()
