"""One process of a two-process run that keeps the example record (tests/test_record.py, under torchrun).

Writes ``rank{rank}.pt``: the record this rank holds at the end, its training counters and the table the main
process wrote. ``--stream``: each rank streams its own share of the data (``split_dataset_by_node``).
"""

from __future__ import annotations

import argparse
import os

import torch
from datasets import IterableDataset
from datasets.distributed import split_dataset_by_node
from tiny import TinyClassifier, make_config, make_dataset  # beside this file: the script's sys.path[0]
from worker_exit import exit_after_results

from hf_selective_backprop import SelectiveBackpropTrainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", default="sb")
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    data = make_dataset(with_index=True)
    settings = dict(sb_strategy=args.strategy, logging_steps=5, ddp_backend="gloo", ddp_timeout=90)
    if args.stream:
        rows = data.to_list()
        stream = IterableDataset.from_generator(lambda: iter(rows))
        data = split_dataset_by_node(stream, rank=rank, world_size=2).with_format("torch")
        settings.update(max_steps=24)
    config = make_config(os.path.join(args.out, "trainer"), **settings)
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=config, train_dataset=data)
    trainer.train()
    keeper = trainer.record_keeper
    stats = getattr(trainer, "sb_stats", None) or {}
    torch.save({"record": keeper.record.state_dict(), "backwards": stats.get("backwards"),
                "selection_forwards": stats.get("selection_forwards"), "global_step": trainer.state.global_step},
               os.path.join(args.out, f"rank{trainer.args.process_index}.pt"))
    exit_after_results()


if __name__ == "__main__":
    main()
