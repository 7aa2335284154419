#!/bin/bash
# The convergence-regime benchmark of docs/benchmarks/benchmarks.md ("Near convergence"): CIFAR-10, 2,500 training /
# 2,000 test images, cifar_convnet_half (airbench94's layout at half width), 60 epochs of the paper's
# schedule (SGD, lr 0.1 divided by 5 at 30/60/80 % of the run, momentum 0.9, weight decay 5e-4, batch 128,
# random crop + flip as in the paper's ResNet18 set-up; cutout 16 left this network at 79 % training accuracy,
# see pilots/), in which Traditional plateaus. Strategies at the paper's settings, each with a uniform control
# that trains as many examples (the backward fraction the strategy realised in that seed), then a budget sweep
# at 20 and 40 epochs.
# The sweep reuses seed 0's full-length runs as its longest budget.
#
# One command, restartable: a run whose <strategy>.json exists is skipped, so killing this and starting it
# again goes on where it stopped (the run in progress starts over). Run it on an otherwise idle machine:
# timing is the point. PARTS (main, sweep, primed, trainmode) and SEEDS choose what runs; the report is rebuilt
# after each part. The committed results ran as PARTS="main sweep primed" SEEDS="0 1 2", then PARTS=trainmode.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
R=${RESULTS:-benchmarks/results/cifar10-paper-regime}
DATA=${DATA:-../shared/data}
EPOCHS=${EPOCHS:-60}
# Two threads: on an idle 2-core CPU a training step of this network took 2.6 ms per image with two, 3.6 with
# one (model_choice.md in the results folder, from benchmarks/bench_cifar_nets.py).
source benchmarks/paper_regime_workload.sh
COMMON=(--dataset "$DATA/cifar10" "${PAPER_REGIME_FLAGS[@]}" --cutout 0 --threads "${THREADS:-2}")
# SB and Stale-SB (n = 3) at the paper's keep 1/3; InfoBatch at its paper's r = 0.5, delta = 0.875; Composer's
# recommended setting.
STRATEGIES="traditional sb stale-sb infobatch composer-card"

backward_fraction() {  # LOG: backward passes per example read
    $PY -c "import json, sys; s = json.load(open(sys.argv[1]))['stats']; print(s['backwards'] / s['examples_seen'])" "$1"
}

run_with_controls() {  # OUTPUT_DIR SEED EPOCHS "STRATEGY..." "STRATEGY... GIVEN A UNIFORM CONTROL" [FLAGS...]
    local OUT=$1 SEED=$2 E=$3 RUNS=$4 CONTROLLED=$5 S
    shift 5
    $PY benchmarks/benchmark.py "${COMMON[@]}" "$@" --num_train_epochs "$E" --seed "$SEED" --keep 0.3333333333 \
        --staleness 3 --output_dir "$OUT" --strategies "${RUNS// /,}"
    for S in $CONTROLLED; do
        [[ -e $OUT/uniform-for-$S.json || ! -e $OUT/$S.json ]] && continue
        $PY benchmarks/benchmark.py "${COMMON[@]}" "$@" --num_train_epochs "$E" --seed "$SEED" \
            --keep "$(backward_fraction "$OUT/$S.json")" --output_dir "$OUT" --strategies "uniform-for-$S"
    done
}

report() {
    $PY benchmarks/paper_regime_report.py --root "$R"
}

for PART in ${PARTS:-main sweep primed trainmode}; do
    case $PART in
    main)
        for SEED in ${SEEDS:-0 1 2}; do
            run_with_controls "$R/seed$SEED" "$SEED" "$EPOCHS" "$STRATEGIES" "sb stale-sb infobatch composer-card" \
                --train_eval_samples 500 --evals_per_epoch 0.5
            report
        done
        ;;
    sweep)  # seed 0 at a third and two thirds of the epochs (the full budget is seed 0's main runs); uniform
        # controls of the smallest (SB) and a large (InfoBatch) backward fraction; only the final error is read
        for E in ${SWEEP_EPOCHS:-20 40}; do
            run_with_controls "$R/sweep/epochs$E" 0 "$E" "$STRATEGIES" "sb infobatch" --evals_per_epoch 0
            report
        done
        ;;
    primed)  # the authors' code trains one epoch on all data before selecting: SB with that priming, seed 0
        $PY benchmarks/benchmark.py "${COMMON[@]}" --train_eval_samples 500 --evals_per_epoch 0.5 \
            --num_train_epochs "$EPOCHS" --seed 0 --keep 0.3333333333 --warmup_epochs 1 --output_dir "$R/seed0" \
            --strategies sb-warmup
        report
        ;;
    trainmode)  # SB with its selection forward in train mode (BatchNorm statistics of every example read), each
        # seed beside its own uniform control
        for SEED in ${SEEDS:-0 1 2}; do
            run_with_controls "$R/seed$SEED" "$SEED" "$EPOCHS" sb-train-mode sb-train-mode \
                --train_eval_samples 500 --evals_per_epoch 0.5
        done
        report
        ;;
    *)
        echo "unknown part $PART: main, sweep, primed or trainmode" >&2
        exit 2
        ;;
    esac
done
