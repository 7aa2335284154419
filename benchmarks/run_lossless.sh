#!/bin/bash
# The runs behind docs/benchmarks.md's "Lossless acceleration" section, in the order they ran.
# Restartable: a strategy whose <name>.json exists is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
R=benchmarks/results
DATA=${DATA:-../shared/data}

# 1. Development sweep (one seed, 5,000 training images, 10 epochs): which SB-family and InfoBatch
#    settings lose least accuracy per unit of time saved.
DEV="--dataset $DATA/cifar10 --max_train_samples 5000 --max_eval_samples 1000 --num_train_epochs 10 --seed 0"
$PY scripts/benchmark.py $DEV --threads ${THREADS:-1} --output_dir $R/cifar10-dev-sweep \
    --strategies traditional,sb,infobatch,infobatch-r0.7
$PY scripts/benchmark.py $DEV --threads ${THREADS:-1} --keep 0.5 --staleness 2 --output_dir $R/cifar10-dev-sweep \
    --strategies sb-anneal,sb-anneal-weighted,stale-sb-anneal
