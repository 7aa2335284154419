#!/bin/bash
# The fine-tuning benchmark of docs/benchmarks/benchmarks.md ("Fine-tuning"): where most examples are easy.
#
# A pretrained stand-in, since Hub downloads fail here: $MODEL trained on CIFAR-10's classes 0-4 (all 25,000
# training images, validated on their 5,000 test images), cached outside git. The downstream task is classes
# 5-9 (25,000 training / 5,000 test images), fine-tuned from that checkpoint with a new 5-way head
# (scripts/train.py --model_name_or_path works the same on a Hub checkpoint). Every strategy at its paper's
# setting, each beside a uniform control that trains as many examples (the backward fraction the strategy
# realised in the same seed), with the same schedule and epochs.
#
# PARTS (run in this order by default):
#   pretrain  the stand-in checkpoint (deterministic: seed 0); its train_results.json holds its time. Skipped
#             when $PRETRAINED holds a model; resumes from its last checkpoint after an interruption.
#   lr        Traditional, seed 0, at each of $LRS: the learning rate for the main part is the one that ends most
#             accurate (LR=auto, the default), chosen for Traditional before any strategy runs.
#   main      seeds $SEEDS: Traditional, SB keep 1/3 (paper) and 1/2, Stale-SB (n = 3), InfoBatch (r = 0.5,
#             delta = 0.875), Composer's recommended setting and top-k keep 1/2, then each one's uniform control.
#   report    $R/report.md and its figures (benchmarks/paper_regime_report.py).
# Restartable: a run whose <strategy>.json exists is skipped, so killing this and starting it again goes on where
# it stopped (the run in progress starts over). Timing is the point: run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lr_choice.sh
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
MODEL=${MODEL:-cifar_convnet_half}
R=${RESULTS:-benchmarks/results/finetune-cifar10-$MODEL}
CACHE=${FINETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hf-selective-backprop/finetune}
PRETRAIN_EPOCHS=${PRETRAIN_EPOCHS:-20}
PRETRAINED=${PRETRAINED:-$CACHE/$MODEL-cifar10-classes0-4-$PRETRAIN_EPOCHS-epochs}
EPOCHS=${EPOCHS:-6}
LRS=${LRS:-0.01 0.03 0.1}
THREADS=${THREADS:-2}
# Random crop and flip, no cutout: cutout 16 kept cifar_convnet_half from fitting CIFAR-10 (docs/benchmarks/benchmarks.md).
AUGMENT=(--cutout 0)
# Flags added to every run, e.g. a smoke test's EXTRA="--max_train_samples 2000 --max_eval_samples 500".
read -r -a EXTRA <<<"${EXTRA:-}"

pretrain() {
    [[ -f $PRETRAINED/model.safetensors ]] && return
    local RESUME=()
    compgen -G "$PRETRAINED/checkpoint-*" >/dev/null && RESUME=(--resume_from_checkpoint True)
    $PY scripts/train.py --dataset "$DATA/cifar10" --classes 0,1,2,3,4 --model "$MODEL" "${AUGMENT[@]}" \
        --num_train_epochs "$PRETRAIN_EPOCHS" --seed 0 --sb_strategy none --learning_rate 0.1 \
        --eval_strategy epoch --save_strategy epoch --save_total_limit 1 --disable_tqdm true \
        --output_dir "$PRETRAINED" "${RESUME[@]}" "${EXTRA[@]}"
}

COMMON=(--dataset "$DATA/cifar10" --classes 5,6,7,8,9 --model_name_or_path "$PRETRAINED" "${AUGMENT[@]}"
    --threads "$THREADS" --num_train_epochs "$EPOCHS" --batch_size 128 --train_eval_samples "${FIT_ROWS:-1000}" "${EXTRA[@]}")


SELECTIVE="sb sb-keep0.5 stale-sb infobatch composer-card topk-keep0.5"
# Each uniform-for-<strategy> runs after it, at the backward fraction that strategy realised (read from its log).
STRATEGIES="traditional $SELECTIVE $(printf 'uniform-for-%s ' $SELECTIVE)"

for PART in ${PARTS:-pretrain lr main report}; do
    case $PART in
    pretrain)
        pretrain
        ;;
    lr)
        for LR_TRIED in $LRS; do
            $PY benchmarks/benchmark.py "${COMMON[@]}" --learning_rate "$LR_TRIED" --seed 0 \
                --output_dir "$R/lr/lr$LR_TRIED" --strategies traditional
        done
        ;;
    main)
        LR_USED=${LR:-auto}
        [[ $LR_USED == auto ]] && LR_USED=$(best_lr "$R/lr")
        echo "main: learning rate $LR_USED"
        # Seed 0's Traditional run at that rate is the lr part's (the same flags).
        if [[ -f $R/lr/lr$LR_USED/traditional.json && ! -f $R/seed0/traditional.json ]]; then
            mkdir -p "$R/seed0"
            cp "$R/lr/lr$LR_USED/traditional.json" "$R/seed0/traditional.json"
        fi
        for SEED in ${SEEDS:-0 1 2}; do
            $PY benchmarks/benchmark.py "${COMMON[@]}" --learning_rate "$LR_USED" --seed "$SEED" --keep 0.3333333333 \
                --staleness 3 --output_dir "$R/seed$SEED" --strategies "$(echo $STRATEGIES | tr ' ' ',')"
        done
        ;;
    report)
        $PY benchmarks/paper_regime_report.py --root "$R" \
            --title "Fine-tuning: CIFAR-10 classes 5-9 from $MODEL pretrained on classes 0-4, $EPOCHS epochs"
        ;;
    *)
        echo "unknown part $PART: pretrain, lr, main or report" >&2
        exit 2
        ;;
    esac
done
