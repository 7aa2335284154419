#!/bin/bash
# The paper's full-size CIFAR-10 setting on one CUDA GPU (docs/benchmarks/gpu.md): all 50,000 training images, the
# 10,000 test images evaluated after every epoch, timm resnet18, batch 128, 30 epochs, SGD (lr 0.1,
# momentum 0.9, weight decay 5e-4, linear decay): Traditional, SB (keep 1/3), Stale-SB (n=3), InfoBatch,
# and the uniform control at the fraction SB kept; seeds 0 1 2. Same logs and seed reports as
# benchmarks/run_lossless.sh.
#
# Restartable: a strategy whose <name>.json exists is skipped, and each run writes its JSON when it ends,
# so the runs can be spread over several sittings (one run per call where a call is limited to 10 minutes):
#     SEEDS=0 STRATEGIES=traditional bash benchmarks/run_gpu_cifar10.sh
# Each run is meant to finish within 10 minutes on one H100-class GPU (30 epochs of Traditional are
# 1.5 million examples); that is an estimate: this script's runs have not been timed on a GPU (the label-noise
# benchmark, run_noisy.sh, ran on an H200: docs/benchmarks/benchmarks.md). EPOCHS lowers the length.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
R=${RESULTS:-benchmarks/results/cifar10-gpu}
# A local copy of the datasets beside the checkout (or inside it, as a device machine may hold it).
DATA=${DATA:-$([[ -d shared/data ]] && echo shared/data || echo ../shared/data)}
EPOCHS=${EPOCHS:-30}
STRATEGIES=${STRATEGIES:-traditional,sb,stale-sb,infobatch,uniform}
# Threads of the main process, which decodes once and augments every batch on the CPU.
COMMON=(--dataset $DATA/cifar10 --eval_split test --num_train_epochs $EPOCHS --threads ${THREADS:-4}
        --staleness 3 --batch_size 128 --learning_rate 0.1)

for SEED in ${SEEDS:-0 1 2}; do
    OUT=$R/seed$SEED
    SELECTIVE=$(echo ",$STRATEGIES," | tr ',' '\n' | grep -vx -e '' -e uniform | paste -sd, -)
    if [[ -n "$SELECTIVE" ]]; then
        $PY benchmarks/benchmark.py "${COMMON[@]}" --seed $SEED --output_dir $OUT --keep 0.3333 --strategies "$SELECTIVE"
    fi
    if [[ ",$STRATEGIES," == *",uniform,"* ]]; then
        # The control baseline keeps, at random, the fraction SB kept in this seed.
        KEPT=$($PY -c "import json; print(json.load(open('$OUT/sb.json'))['stats']['kept_fraction'])")
        $PY benchmarks/benchmark.py "${COMMON[@]}" --seed $SEED --output_dir $OUT --keep $KEPT --strategies uniform
    fi
done
$PY benchmarks/benchmark_seeds.py --root $R \
    --title "CIFAR-10, all 50,000 images, resnet18, $EPOCHS epochs, one GPU (paper protocol)"
