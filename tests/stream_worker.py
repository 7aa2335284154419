"""One process of a two-process Stale-SB run on a streamed parquet file (``tests/test_streams.py``).

Each rank streams its own share (``datasets.distributed.split_dataset_by_node``) under torchrun (gloo).
``--mode first`` trains the uninterrupted run, then the same run with a checkpoint every 5 steps;
``--mode resume`` resumes the second from its first checkpoint inside a stale pass; ``--mode strategies``
trains InfoBatch and RHO-LOSS (a reference model scoring each rank's share). ``--device cuda`` trains on one GPU
per process over NCCL (``tests/test_gpu.py``). Each writes
``<out>/rank{r}.pt``: the weights, the summed counters, the store, the ids this rank trained and the ranks'
records of their collectives compared (`collective_log.CollectiveLog`).
"""

from __future__ import annotations

import argparse
import os

import torch
from collective_log import CollectiveLog
from datasets import load_dataset
from datasets.distributed import split_dataset_by_node
from tiny import TinyClassifier, make_config  # beside this file: the script's sys.path[0]
from worker_exit import exit_after_results

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.engine.checkpoints import STATE_FILE
from hf_selective_backprop.trainer import WEIGHT_KEY

torch.set_num_threads(1)


class Recording(SelectiveBackpropTrainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        self.trained_ids = getattr(self, "trained_ids", [])
        self.trained_ids += inputs["index"].tolist()
        self.weights_seen = getattr(self, "weights_seen", set())
        if WEIGHT_KEY in inputs:
            self.weights_seen |= set(inputs[WEIGHT_KEY].tolist())
        return super().training_step(model, inputs, num_items_in_batch)


#: Where the runs train: the CPU over gloo, or with --device cuda one GPU per process over NCCL.
DEVICE = {"cpu": dict(ddp_backend="gloo"), "cuda": dict(use_cpu=False, ddp_backend="nccl")}


def run(data: str, output_dir: str, resume: str | None = None, reference_model=None, **overrides) -> Recording:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    share = split_dataset_by_node(load_dataset("parquet", data_files=data, split="train", streaming=True),
                                  rank=rank, world_size=world)
    settings = dict(max_steps=16, per_device_train_batch_size=4, sb_selection_batch_size=8, sb_strategy="sb",
                    sb_staleness=2, ddp_timeout=90)
    settings.update(overrides)
    trainer = Recording(model=TinyClassifier(), train_dataset=share, args=make_config(output_dir, **settings),
                        reference_model=reference_model)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def inside_a_stale_pass(folder: str) -> str:
    for step in sorted(int(name.split("-")[1]) for name in os.listdir(folder) if name.startswith("checkpoint-")):
        path = os.path.join(folder, f"checkpoint-{step}")
        state = torch.load(os.path.join(path, STATE_FILE), weights_only=True)
        if state["consumed"] > 0 and state["epoch"] % 2 == 1:
            return path
    raise AssertionError(f"no checkpoint of {folder} is inside a stale pass")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=["first", "resume", "strategies"], required=True)
    parser.add_argument("--device", choices=list(DEVICE), default="cpu")
    options = parser.parse_args()
    device = DEVICE[options.device]
    log = CollectiveLog(f"cuda:{os.environ['LOCAL_RANK']}" if options.device == "cuda" else "cpu").install()
    partial = os.path.join(options.out, "..", "partial")
    if options.mode == "strategies":
        results = {}
        for name, settings in {
            "infobatch": dict(sb_strategy="infobatch", sb_staleness=1, sb_prune_ratio=0.5, sb_anneal_delta=0.75),
            "rholoss": dict(sb_strategy="rholoss", sb_staleness=1, reference_model=TinyClassifier(seed=5)),
        }.items():
            trainer = run(options.data, os.path.join(options.out, name), **settings, **device)
            irreducible = trainer.engine.irreducible
            results[name] = {
                "params": [p.detach().cpu().clone() for p in trainer.model.parameters()],
                "stats": trainer.sb_stats,
                "irreducible": None if irreducible is None else irreducible.losses.clone(),
                "weights": trainer.weights_seen,
            }
        results["collectives"] = log.compare()
        torch.save(results, os.path.join(options.out, f"rank{trainer.args.process_index}.pt"))
        exit_after_results()
    if options.mode == "first":
        trainer = run(options.data, options.out, **device)
        run(options.data, partial, save_strategy="steps", save_steps=5, **device)
    else:
        trainer = run(options.data, options.out, resume=inside_a_stale_pass(partial), **device)
    result = {
        "params": [p.detach().cpu().clone() for p in trainer.model.parameters()],
        "stats": trainer.sb_stats,
        "store": trainer.engine.store.losses.clone(),
        "ids": trainer.trained_ids,
        "step": trainer.state.global_step,
        "collectives": log.compare(),
    }
    torch.save(result, os.path.join(options.out, f"rank{trainer.args.process_index}.pt"))
    exit_after_results()


if __name__ == "__main__":
    main()
