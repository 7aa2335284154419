"""How much padding length-grouped sampling saves once selection regroups the kept rows, on real sentence lengths.

    python benchmarks/bench_length_grouping.py [--dataset ../shared/data/sst2] [--batch 32] [--keep 0.3333]

Selection keeps rows of several selection batches and trains them together (the queue re-pads each training
micro-batch to its longest row). This replays that on the lengths of a dataset's sentences (words, split on
spaces): the Trainer's order, random or length-grouped (`transformers.trainer_pt_utils.
get_length_grouped_indices`, what ``--train_sampling_strategy group_by_length`` samples), selection batches of
``--batch`` rows, each row kept with probability ``--keep`` (the padding does not depend on which rows a loss
would pick, only on how many), first in, first out, into micro-batches of ``--batch`` rows. Prints the share of
padding in the micro-batches without selection and with it, for both orders. No training, no timing.
"""

from __future__ import annotations

import argparse

import torch
from datasets import load_dataset
from transformers.trainer_pt_utils import get_length_grouped_indices


def padding_share(lengths: list[int]) -> float:
    longest = max(lengths)
    return 1.0 - sum(lengths) / (longest * len(lengths))


def micro_batches(order: list[int], batch: int, keep: float | None, generator: torch.Generator) -> list[list[int]]:
    kept = order
    if keep is not None:
        draws = torch.rand(len(order), generator=generator) < keep
        kept = [row for row, drawn in zip(order, draws.tolist(), strict=True) if drawn]
    return [kept[i : i + batch] for i in range(0, len(kept) - batch + 1, batch)]


def mean_padding(batches: list[list[int]], lengths: list[int]) -> float:
    padded = sum(max(lengths[i] for i in rows) * len(rows) for rows in batches)
    return 1.0 - sum(lengths[i] for rows in batches for i in rows) / padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="../shared/data/sst2")
    parser.add_argument("--text_column", default="sentence")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--keep", type=float, default=1 / 3)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    texts = load_dataset(options.dataset, split="train")[options.text_column]
    lengths = [len(text.split()) for text in texts]
    generator = torch.Generator().manual_seed(options.seed)
    orders = {
        "random": torch.randperm(len(lengths), generator=generator).tolist(),
        "group_by_length": get_length_grouped_indices(lengths, options.batch, generator=generator),
    }
    print(f"{len(lengths):,} sentences, {sum(lengths) / len(lengths):.1f} words on average; micro-batches of "
          f"{options.batch}, keep {options.keep:.3f}")
    print(f"{'order':<16} {'padding, no selection':>22} {'padding, with selection':>24}")
    for name, order in orders.items():
        plain = mean_padding(micro_batches(order, options.batch, None, generator), lengths)
        selected = mean_padding(micro_batches(order, options.batch, options.keep, generator), lengths)
        print(f"{name:<16} {plain:>21.1%} {selected:>23.1%}")


if __name__ == "__main__":
    main()
