"""Time to accuracy of several selection strategies (the paper's Table 1), on one machine.

    python benchmarks/benchmark.py --dataset ../shared/data/cifar10 --max_train_samples 10000 \
        --max_eval_samples 2000 --num_train_epochs 12 --output_dir benchmarks/results/cifar10-paper
    python benchmarks/benchmark.py --protocol budget --paper_dir benchmarks/results/cifar10-paper \
        --dataset ../shared/data/cifar10 --max_train_samples 10000 --max_eval_samples 2000 \
        --output_dir benchmarks/results/cifar10-budget
    python benchmarks/benchmark.py --output_dir benchmarks/results/cifar10-paper --report_only

Writes <output_dir>/<strategy>.json (per-epoch log), report.md and PNGs; a strategy whose
JSON exists is skipped. Text classification: benchmarks/benchmark_text.py. Every flag: --help.
See docs/benchmarks/benchmarks.md.
"""

import logging
from functools import partial

from transformers import HfArgumentParser

from harness.cli import BenchmarkArguments, main
from harness.workloads import image_workload
from hf_selective_backprop.data import DataArguments
from hf_selective_backprop.models import ModelArguments

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    benchmark_args, data_args, model_args = HfArgumentParser(
        (BenchmarkArguments, DataArguments, ModelArguments)
    ).parse_args_into_dataclasses()
    print(main(benchmark_args, partial(image_workload, data_args, model_args)))
