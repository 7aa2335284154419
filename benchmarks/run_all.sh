#!/bin/bash
# The benchmark runs quoted in docs/benchmarks/benchmarks.md, in the order they were run (priority
# order of issue 7). Each command is restartable: a strategy whose <name>.json exists is
# skipped. Strategies of one command train interleaved, one epoch each in turn (--interleave true).
# (The second group was launched separately once the first had finished.)
cd "$(dirname "$0")/.."
PY=.venv/bin/python
CIFAR="--dataset ../shared/data/cifar10 --max_train_samples 5000 --max_eval_samples 1000"
MNIST="--dataset ../shared/data/mnist --max_train_samples 5000 --max_eval_samples 1000"
MNIST10="--dataset ../shared/data/mnist --max_train_samples 10000 --max_eval_samples 2000"
I="--interleave true"
R=benchmarks/results
$PY benchmarks/benchmark.py $I $CIFAR --num_train_epochs 8 --output_dir $R/cifar10-paper \
    --strategies traditional,sb,stale-sb,kath18,composer,uniform,sb-warmup
$PY benchmarks/benchmark.py $I $MNIST --num_train_epochs 4 --output_dir $R/mnist-paper \
    --strategies traditional,sb,stale-sb,uniform
# Sized on the wall clock (--budget_clock wall was the default when this ran).
$PY benchmarks/benchmark.py $I $MNIST --protocol budget --budget_clock wall --paper_dir $R/mnist-paper \
    --output_dir $R/mnist-budget --strategies traditional,sb,stale-sb,uniform
$PY benchmarks/benchmark.py $I $CIFAR --protocol budget --paper_dir $R/cifar10-paper --output_dir $R/cifar10-budget \
    --strategies traditional,sb,stale-sb,uniform,sb-warmup
# --- second group ---
$PY benchmarks/benchmark.py $I $MNIST10 --num_train_epochs 5 --output_dir $R/mnist10k-paper \
    --strategies traditional,sb,stale-sb,uniform
$PY benchmarks/benchmark.py $I $MNIST10 --protocol budget --paper_dir $R/mnist10k-paper --output_dir $R/mnist10k-budget \
    --strategies traditional,sb,stale-sb,uniform
$PY benchmarks/benchmark.py $I $CIFAR --protocol budget --paper_dir $R/cifar10-paper --output_dir $R/cifar10-budget \
    --strategies traditional,kath18,composer
