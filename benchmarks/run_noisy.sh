#!/bin/bash
# The paper's label-noise sensitivity analysis (section 5.4, Fig. 12) with RHO-LOSS beside SB, on CIFAR-10:
# the lossless protocol (resnet18, 15 epochs, 2,000 test images), label noise 20 %, 10 %, 1 %, 0 %
# (UniformFlip: each flipped label goes to a random other class, seeded; the test set is never noised).
#
# Which images each model trains on, per seed:
#   - the first IMAGES (12,000) training images, with the noise flipped among all of them;
#   - a seeded holdout of a sixth of them (2,000) trains the RHO-LOSS reference model (scripts/train.py
#     --train_on holdout); the holdout is drawn independently of the noise, so it is as noisy as the rest;
#   - the other five sixths (10,000) train every strategy: Traditional, SB at the paper setting (keep 1/3),
#     InfoBatch, RHO-LOSS and Stale RHO-LOSS (n=3) (keep 1/3, scored by that reference) and the uniform control
#     at SB's realised kept fraction;
#   - Traditional also trains on all IMAGES (all-images/), so no strategy gets data that Traditional did not.
# A RHO-LOSS run's time includes its reference model's training and its pass over the data.
#
#     bash benchmarks/run_noisy.sh                       # everything, 20 % first (about 1.5 h per noise and seed
#                                                        # on a 2-core CPU, about 3 min on one H200)
#     NOISES=0.2 SEEDS="0 1 2" bash benchmarks/run_noisy.sh
#     NOISES=0.2 SEEDS=0 STRATEGIES=traditional,rholoss-cdf,stale-rholoss ALL_IMAGES=0 bash benchmarks/run_noisy.sh
#     IMAGES=50000 EVAL_IMAGES=10000 NOISES=0.2 SEEDS=0 RESULTS=benchmarks/results/cifar10-noisy-50k \
#         PY=python3 THREADS=4 bash benchmarks/run_noisy.sh   # all of CIFAR-10 on a GPU
#
# ALL_IMAGES=0 skips Traditional on all IMAGES; without sb in STRATEGIES the uniform control keeps KEEP.
# Restartable: a reference with train_results.json, and a strategy whose <name>.json exists, are skipped.
# Run with nothing else on the machine (docs/benchmarks/benchmarks.md says how the published runs kept it idle).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
R=${RESULTS:-benchmarks/results/cifar10-noisy}
# A local copy of the datasets beside the checkout (or inside it, as a device machine may hold it).
DATA=${DATA:-$([[ -d shared/data ]] && echo shared/data || echo ../shared/data)}
KEEP=${KEEP:-0.3333}
REF_EPOCHS=${REF_EPOCHS:-10}
STRATEGIES=${STRATEGIES:-traditional,sb,infobatch,rholoss,stale-rholoss}
# The protocol's sizes; smaller values only for a quick check that the pipeline runs.
IMAGES=${IMAGES:-12000} EVAL_IMAGES=${EVAL_IMAGES:-2000} EPOCHS=${EPOCHS:-15} MODEL=${MODEL:-resnet18}
# One thread is the fastest for resnet18 on a 2-core CPU, reference training included; a GPU machine's main
# process augments every batch on the CPU and wants a few.
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS
HELD=$((IMAGES / 6)) REST=$((IMAGES - IMAGES / 6))

noisy_runs() {  # NOISE SEED
    local NOISE=$1 SEED=$2 OUT=$R/noise$1/seed$2 REF=$R/noise$1/reference-seed$2 KEPT
    local EVAL=(--dataset $DATA/cifar10 --max_eval_samples $EVAL_IMAGES --model $MODEL --label_noise $NOISE
                --label_noise_seed $SEED)
    local SPLIT=(--max_train_samples $IMAGES --holdout_fraction 0.16666667 --holdout_seed $SEED)
    local COMMON=(--num_train_epochs $EPOCHS --seed $SEED --threads $THREADS)
    if [[ ! -f $REF/train_results.json ]]; then
        rm -rf "$REF"  # a reference run killed before it finished
        $PY scripts/train.py "${EVAL[@]}" "${SPLIT[@]}" --train_on holdout --sb_strategy none \
            --num_train_epochs $REF_EPOCHS --seed $SEED --eval_strategy no --save_strategy no --output_dir $REF
    fi
    $PY benchmarks/benchmark.py "${EVAL[@]}" "${SPLIT[@]}" "${COMMON[@]}" --output_dir $OUT --keep $KEEP \
        --staleness 3 --reference_model $REF --strategies $STRATEGIES
    KEPT=$KEEP  # SB's realised kept fraction where SB ran, else the one asked for
    if [[ -f $OUT/sb.json ]]; then
        KEPT=$($PY -c "import json; print(json.load(open('$OUT/sb.json'))['stats']['kept_fraction'])")
    fi
    $PY benchmarks/benchmark.py "${EVAL[@]}" "${SPLIT[@]}" "${COMMON[@]}" --output_dir $OUT --strategies uniform --keep $KEPT
    if [[ ${ALL_IMAGES:-1} == 1 ]]; then
        $PY benchmarks/benchmark.py "${EVAL[@]}" --max_train_samples $IMAGES "${COMMON[@]}" \
            --output_dir $R/noise$NOISE/all-images/seed$SEED --strategies traditional
    fi
}

report() {  # NOISE
    $PY benchmarks/benchmark_seeds.py --root $R/noise$1 --title "CIFAR-10, $1 label noise: $REST training images \
(reference: $HELD more), $MODEL, $EPOCHS epochs"
}

report_all_images() {  # NOISE
    $PY benchmarks/benchmark_seeds.py --root $R/noise$1/all-images \
        --title "CIFAR-10, $1 label noise: Traditional on all $IMAGES images, $MODEL, $EPOCHS epochs"
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
    [[ -n "${NO_REPORT:-}" ]] || report $NOISE
    [[ -n "${NO_REPORT:-}" || ${ALL_IMAGES:-1} != 1 ]] || report_all_images $NOISE
done
