"""One process of an engine-level run under torch's FSDP2 (``fully_shard``), launched by
``tests/test_sharded.py`` through ``torchrun`` with 2 CPU processes over gloo.

A tiny MLP is sharded over the ranks, so each of its forwards all-gathers the weights: every rank must
run the same number of forwards. The two selection paths where ranks score different numbers of rows
are driven directly through `SelectionEngine.add_batch`:

- a Stale-SB epoch that could not be planned (stored losses looked up batch by batch): rank 0's batches
  hold ids never scored, which need a forward; rank 1's ids all have stored losses;
- a planned epoch whose plan leaves rows to score on rank 0 only.

After each batch both ranks take one optimizer step on what the engine queued, and at the end each
writes its gathered weights and counters to ``<out>/rank{rank}.pt``. ``--no-lockstep`` builds the
engine without lockstep forwards: ranks then run different numbers of forwards, which must fail.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.distributed.fsdp import fully_shard
from worker_exit import exit_after_results

from hf_selective_backprop import SelectiveBackpropConfig
from hf_selective_backprop.engine import SelectionEngine
from hf_selective_backprop.engine.epoch_plan import EpochPlan
from hf_selective_backprop.engine.scoring import SelectionScorer
from hf_selective_backprop.engine.store import LossStore
from hf_selective_backprop.selectors import build_selector

FEATURES, CLASSES, ROWS = 8, 4, 8


def per_example_loss(outputs, labels):
    return F.cross_entropy(outputs["logits"], labels, reduction="none")


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)

    def forward(self, x, labels=None):
        return {"logits": self.second(torch.tanh(self.first(x)))}


def batch(rank: int, step: int, ids: torch.Tensor) -> dict:
    generator = torch.Generator().manual_seed(100 * rank + step)
    return {
        "x": torch.randn(len(ids), FEATURES, generator=generator),
        "labels": torch.randint(CLASSES, (len(ids),), generator=generator),
        "index": ids,
    }


def train_on_queue(engine: SelectionEngine, model: nn.Module, optimizer) -> None:
    """One optimizer step on every rank: on queued rows where a rank has them, else on none (weight zero)."""
    rows = min(len(engine.queue), 4)
    inputs = engine.queue.pop(rows) if rows else None
    if inputs is None:
        loss = model(torch.zeros(1, FEATURES))["logits"].sum() * 0.0
    else:
        loss = per_example_loss(model(inputs["x"]), inputs["labels"]).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-lockstep", action="store_true")
    args = parser.parse_args()

    # Before the Accelerator: TrainingArguments set up (and reset) Accelerate's shared state.
    config = SelectiveBackpropConfig(
        output_dir=os.path.join(args.out, "trainer"), use_cpu=True, report_to="none", seed=0,
        sb_strategy="sb", sb_staleness=2, sb_history_scope="local", sb_history_size=64,
    )
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(0)
    model = TinyMLP()
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    selector = build_selector(config)
    scorer = SelectionScorer(per_example_loss)
    engine = SelectionEngine(
        config, selector, scorer, accelerator, batch_size=4, selection_batch_size=ROWS,
        forwards_in_lockstep=not args.no_lockstep,
    )
    # Every id of both ranks has a stored loss except rank 0's ids 100.. (never scored).
    engine.store = LossStore(200)
    known = torch.arange(100)
    engine.store.update(known, torch.linspace(0.1, 3.0, 100), epoch=0)

    # A Stale-SB epoch without a plan: lookups batch by batch.
    engine.epoch = 1
    for step in range(3):
        ids = torch.arange(100 + ROWS * step, 100 + ROWS * (step + 1)) if rank == 0 else torch.arange(
            ROWS * step, ROWS * (step + 1))
        engine.add_batch(batch(rank, step, ids), True, model)
        train_on_queue(engine, model, optimizer)

    # A planned epoch (the second stale epoch): rank 0's ids 150.. are left to score, the rest are decided.
    engine.epoch = 3
    copies = torch.ones(200, dtype=torch.int32)
    scored = torch.zeros(200, dtype=torch.bool)
    scored[150:] = True
    copies[150:] = 0
    engine.epoch_plan = EpochPlan(copies, scored, None)
    for step in range(2):
        ids = torch.arange(150 + ROWS * step, 150 + ROWS * (step + 1)) if rank == 0 else torch.arange(
            40 + ROWS * step, 40 + ROWS * (step + 1))
        engine.add_batch(batch(rank, 10 + step, ids), True, model)
        train_on_queue(engine, model, optimizer)

    weights = {name: value.full_tensor().detach().clone() for name, value in model.state_dict().items()}
    result = {"weights": weights, "stats": engine.stats.state_dict(), "store": engine.store.state_dict()}
    os.makedirs(args.out, exist_ok=True)
    torch.save(result, os.path.join(args.out, f"rank{rank}.pt"))
    print(f"rank {rank}: lockstep_forwards={engine.stats.lockstep_forwards} "
          f"selection_forwards={engine.stats.selection_forwards}", flush=True)
    exit_after_results()


if __name__ == "__main__":
    main()
