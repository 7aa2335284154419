#!/bin/bash
# The paper's label-noise sensitivity analysis (section 5.4, Fig. 12) with RHO-LOSS beside SB, on CIFAR-10:
# the lossless protocol (resnet18, 15 epochs, 2,000 test images, one thread), label noise 20 %, 10 %, 1 %, 0 %
# (UniformFlip: each flipped label goes to a random other class, seeded; the test set is never noised).
#
# Which images each model trains on, per seed:
#   - the first 12,000 training images, with the noise flipped among all 12,000;
#   - a seeded holdout of 2,000 of them trains the RHO-LOSS reference model (scripts/train.py --train_on holdout);
#   - the other 10,000 train every strategy: Traditional, SB at the paper setting (keep 1/3), InfoBatch, RHO-LOSS
#     (keep 1/3, scored by that reference) and the uniform control at SB's realised kept fraction;
#   - Traditional also trains on all 12,000 (all-images/), so no strategy gets data that Traditional did not.
# A RHO-LOSS run's time includes its reference model's training and its pass over the data.
#
#     bash benchmarks/run_noisy.sh                       # everything, 20 % first (about 1.5 h per noise and seed)
#     NOISES=0.2 SEEDS="0 1 2" bash benchmarks/run_noisy.sh
#
# Restartable: a reference with train_results.json, and a strategy whose <name>.json exists, are skipped.
# Run with nothing else on the machine (docs/benchmarks.md says how the published runs kept it idle).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
R=${RESULTS:-benchmarks/results/cifar10-noisy}
DATA=${DATA:-../shared/data}
KEEP=${KEEP:-0.3333}
REF_EPOCHS=${REF_EPOCHS:-10}
# The protocol's sizes; smaller values only for a quick check that the pipeline runs.
IMAGES=${IMAGES:-12000} EVAL_IMAGES=${EVAL_IMAGES:-2000} EPOCHS=${EPOCHS:-15} MODEL=${MODEL:-resnet18}
export OMP_NUM_THREADS=1  # one thread: the fastest for resnet18 on these 2 cores, reference training included

noisy_runs() {  # NOISE SEED
    local NOISE=$1 SEED=$2 OUT=$R/noise$1/seed$2 REF=$R/noise$1/reference-seed$2 KEPT
    local EVAL=(--dataset $DATA/cifar10 --max_eval_samples $EVAL_IMAGES --model $MODEL --label_noise $NOISE
                --label_noise_seed $SEED)
    local SPLIT=(--max_train_samples $IMAGES --holdout_fraction 0.16666667 --holdout_seed $SEED)
    if [[ ! -f $REF/train_results.json ]]; then
        rm -rf "$REF"  # a reference run killed before it finished
        $PY scripts/train.py "${EVAL[@]}" "${SPLIT[@]}" --train_on holdout --sb_strategy none \
            --num_train_epochs $REF_EPOCHS --seed $SEED --eval_strategy no --save_strategy no --output_dir $REF
    fi
    $PY scripts/benchmark.py "${EVAL[@]}" "${SPLIT[@]}" --num_train_epochs $EPOCHS --seed $SEED --threads 1 \
        --interleave false --output_dir $OUT --keep $KEEP --reference_model $REF \
        --strategies traditional,sb,infobatch,rholoss
    KEPT=$($PY -c "import json; print(json.load(open('$OUT/sb.json'))['stats']['kept_fraction'])")
    $PY scripts/benchmark.py "${EVAL[@]}" "${SPLIT[@]}" --num_train_epochs $EPOCHS --seed $SEED --threads 1 \
        --output_dir $OUT --strategies uniform --keep $KEPT
    $PY scripts/benchmark.py "${EVAL[@]}" --max_train_samples $IMAGES --num_train_epochs $EPOCHS --seed $SEED --threads 1 \
        --output_dir $R/noise$NOISE/all-images/seed$SEED --strategies traditional
}

for NOISE in ${NOISES:-0.2 0.1 0.01 0.0}; do
    if [[ -n "${SEEDS:-}" ]]; then
        seeds=$SEEDS
    elif [[ $NOISE == 0.2 || $NOISE == 0.1 ]]; then
        seeds="0 1 2"
    else
        seeds="0"
    fi
    for SEED in $seeds; do
        noisy_runs $NOISE $SEED
    done
    $PY scripts/benchmark_seeds.py --root $R/noise$NOISE \
        --title "CIFAR-10, $NOISE label noise: 10,000 training images (reference: 2,000 more), resnet18, 15 epochs"
    $PY scripts/benchmark_seeds.py --root $R/noise$NOISE/all-images \
        --title "CIFAR-10, $NOISE label noise: Traditional on all 12,000 images, resnet18, 15 epochs"
done
