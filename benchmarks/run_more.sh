#!/bin/bash
# Second batch, after run_all.sh: MNIST at the size the issue suggests (10,000 / 2,000, 5 epochs).
cd "$(dirname "$0")/.."
PY=.venv/bin/python
MNIST10="--dataset ../shared/data/mnist --max_train_samples 10000 --max_eval_samples 2000"
R=benchmarks/results
$PY scripts/benchmark.py $MNIST10 --num_train_epochs 5 --output_dir $R/mnist10k-paper \
    --strategies traditional,sb,stale-sb,uniform
$PY scripts/benchmark.py $MNIST10 --protocol budget --paper_dir $R/mnist10k-paper --output_dir $R/mnist10k-budget \
    --strategies traditional,sb,stale-sb,uniform
CIFAR="--dataset ../shared/data/cifar10 --max_train_samples 5000 --max_eval_samples 1000"
$PY scripts/benchmark.py $CIFAR --protocol budget --paper_dir $R/cifar10-paper --output_dir $R/cifar10-budget \
    --strategies traditional,kath18,composer
