#!/bin/bash
# The runs behind docs/benchmarks/benchmarks.md's "Lossless acceleration" section, in the order they ran.
# Restartable: a strategy whose <name>.json exists is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
R=benchmarks/results
DATA=${DATA:-../shared/data}

# 1. Development sweep (one seed, 5,000 training images, 10 epochs): which SB-family and InfoBatch
#    settings lose least accuracy per unit of time saved.
#    SECTIONS="2 3" skips it (a rerun would rewrite its report and plots, leaving the tree unclean
#    for the runs after it).
# Interleaved (one epoch of each strategy in turn), as the sweep ran.
DEV="--dataset $DATA/cifar10 --max_train_samples 5000 --max_eval_samples 1000 --num_train_epochs 10 --seed 0 --interleave true"
if [[ " ${SECTIONS:-1 2 3 4} " == *" 1 "* ]]; then
    $PY benchmarks/benchmark.py $DEV --threads ${THREADS:-1} --output_dir $R/cifar10-dev-sweep \
        --strategies traditional,sb,infobatch,infobatch-r0.7
    $PY benchmarks/benchmark.py $DEV --threads ${THREADS:-1} --keep 0.5 --staleness 2 --output_dir $R/cifar10-dev-sweep \
        --strategies sb-anneal,sb-anneal-weighted,stale-sb-anneal
fi

# Paper protocol, one seed: Traditional, InfoBatch and the best SB-family settings one after another
# (each log is written when it ends, so the runs can be spread over several sittings), then SB at its
# paper setting (keep 1/3, no annealing) and the uniform control at the kept fraction InfoBatch
# realized in that seed. Run with nothing else on the machine. One thread, the runner's default:
# two threads on these 2 cores trained resnet18 markedly slower in a first attempt.
paper_protocol() {  # OUTPUT_DIR SEED DATASET_FLAGS...
    local OUT=$1 SEED=$2
    shift 2
    $PY benchmarks/benchmark.py "$@" --seed $SEED --threads ${THREADS:-1} --output_dir $OUT --keep ${KEEP:-0.5} \
        --staleness 2 --strategies traditional,infobatch,${BEST_SB:-sb-anneal},${BEST_STALE:-stale-sb-anneal}
    $PY benchmarks/benchmark.py "$@" --seed $SEED --threads ${THREADS:-1} --output_dir $OUT --keep 0.3333 --strategies sb
    uniform_control "$OUT" "$SEED" "$@"
}

uniform_control() {  # OUTPUT_DIR SEED DATASET_FLAGS...: uniform at the kept fraction InfoBatch realized there
    local OUT=$1 SEED=$2 KEPT
    shift 2
    KEPT=$($PY -c "import json; print(json.load(open('$OUT/infobatch.json'))['stats']['kept_fraction'])")
    $PY benchmarks/benchmark.py "$@" --seed $SEED --threads ${THREADS:-1} --output_dir $OUT --strategies uniform --keep $KEPT
}

# 2. CIFAR-10, 10,000 training / 2,000 test images, 15 epochs, seeds 0 1 2.
if [[ " ${SECTIONS:-1 2 3 4} " == *" 2 "* ]]; then
    for SEED in ${SEEDS:-0 1 2}; do
        paper_protocol $R/cifar10-lossless/seed$SEED $SEED --dataset $DATA/cifar10 \
            --max_train_samples 10000 --max_eval_samples 2000 --num_train_epochs 15
    done
    $PY benchmarks/benchmark_seeds.py --root $R/cifar10-lossless \
        --title "CIFAR-10, 10,000 images, resnet18, 15 epochs (paper protocol)"
fi

# 3. MNIST, 10,000 training / 2,000 test images, 5 epochs (Traditional is near 1 % error by then),
#    seeds 0 1 2.
if [[ " ${SECTIONS:-1 2 3 4} " == *" 3 "* ]]; then
    for SEED in ${SEEDS:-0 1 2}; do
        paper_protocol $R/mnist-lossless/seed$SEED $SEED --dataset $DATA/mnist \
            --max_train_samples 10000 --max_eval_samples 2000 --num_train_epochs 5
    done
    $PY benchmarks/benchmark_seeds.py --root $R/mnist-lossless \
        --title "MNIST, 10,000 images, resnet18, 5 epochs (paper protocol)"
fi

# 4. Longer training on fewer images: 2,500 CIFAR-10 training / 2,000 test images, 30 epochs, seeds
#    0 1 2; Traditional, InfoBatch and the uniform control. Whether InfoBatch keeps Traditional's
#    accuracy when every image is seen twice as often as in section 2 (75,000 examples a run, half
#    of section 2's).
if [[ " ${SECTIONS:-1 2 3 4} " == *" 4 "* ]]; then
    LONG=(--dataset $DATA/cifar10 --max_train_samples 2500 --max_eval_samples 2000 --num_train_epochs 30)
    for SEED in ${SEEDS:-0 1 2}; do
        $PY benchmarks/benchmark.py "${LONG[@]}" --seed $SEED --threads ${THREADS:-1} \
            --output_dir $R/cifar10-long/seed$SEED --strategies traditional,infobatch
        uniform_control $R/cifar10-long/seed$SEED $SEED "${LONG[@]}"
    done
    $PY benchmarks/benchmark_seeds.py --root $R/cifar10-long \
        --title "CIFAR-10, 2,500 images, resnet18, 30 epochs (paper protocol)"
fi
