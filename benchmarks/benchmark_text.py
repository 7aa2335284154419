"""Time to accuracy of several selection strategies on a text-classification dataset (SST-2 by default).

    python benchmarks/benchmark_text.py --dataset ../shared/data/sst2 --num_train_epochs 2 \
        --evals_per_epoch 4 --output_dir benchmarks/results/sst2/seed0 --seed 0

A WordPiece tokenizer is trained on the training split and a small BERT built from the size
flags (as scripts/train_text.py does), or --model_name_or_path/--tokenizer_name name Hub ones.
Writes <output_dir>/<strategy>.json, report.md and PNGs like benchmarks/benchmark.py; a strategy
whose JSON exists is skipped. Every flag: --help. See docs/benchmarks/benchmarks.md.
"""

import logging
from functools import partial

from transformers import HfArgumentParser

from harness.cli import BenchmarkArguments, main
from harness.workloads import text_workload
from hf_selective_backprop.data.text import TextDataArguments
from hf_selective_backprop.text_models import TextModelArguments

# The small BERT of scripts/train_text.py, trained with AdamW; every one is a flag.
TEXT_DEFAULTS = dict(
    batch_size=32,
    eval_batch_size=128,
    learning_rate=1e-3,
    weight_decay=0.01,
    optim="adamw_torch",
    warmup_steps=0.06,
    num_train_epochs=2.0,
    evals_per_epoch=4,
)

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = HfArgumentParser((BenchmarkArguments, TextDataArguments, TextModelArguments))
    parser.set_defaults(**TEXT_DEFAULTS)
    benchmark_args, data_args, model_args = parser.parse_args_into_dataclasses()
    print(main(benchmark_args, partial(text_workload, data_args, model_args)))
