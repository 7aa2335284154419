#!/bin/bash
# The text-classification part of the fine-tuning benchmark (docs/record/benchmarks.md, "Fine-tuning"): the
# small BERT of scripts/train_text.py (2 layers, 128 wide), pretrained with masked language modelling on
# SST-2's sentences (train, validation and test; no labels: task-adaptive pretraining, scripts/pretrain_lm.py),
# cached outside git, then fine-tuned on SST-2 classification (AdamW, warm-up then linear decay) with every strategy
# beside its uniform control, as benchmarks/run_finetune.sh does for images.
#
# PARTS: pretrain, lr (Traditional, seed 0, at each of $LRS; LR=auto takes the most accurate), main (seeds
# $SEEDS), report. Restartable: a run whose <strategy>.json exists is skipped. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lr_choice.sh
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
R=${RESULTS:-benchmarks/results/finetune-sst2}
CACHE=${FINETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hf-selective-backprop/finetune}
PRETRAIN_EPOCHS=${PRETRAIN_EPOCHS:-3}
PRETRAINED=${PRETRAINED:-$CACHE/bert-2x128-sst2-mlm-$PRETRAIN_EPOCHS-epochs}
EPOCHS=${EPOCHS:-2}
LRS=${LRS:-0.0001 0.0003 0.001}
THREADS=${THREADS:-2}
read -r -a EXTRA <<<"${EXTRA:-}"

COMMON=(--dataset "$DATA/sst2" --model_name_or_path "$PRETRAINED" --threads "$THREADS" --num_train_epochs "$EPOCHS"
    "${EXTRA[@]}")
SELECTIVE="sb sb-keep0.5 stale-sb infobatch composer-card topk-keep0.5"
STRATEGIES="traditional $SELECTIVE $(printf 'uniform-for-%s ' $SELECTIVE)"

for PART in ${PARTS:-pretrain lr main report}; do
    case $PART in
    pretrain)
        if [[ ! -f $PRETRAINED/model.safetensors ]]; then
            RESUME=()
            compgen -G "$PRETRAINED/checkpoint-*" >/dev/null && RESUME=(--resume_from_checkpoint True)
            OMP_NUM_THREADS=$THREADS $PY scripts/pretrain_lm.py --dataset "$DATA/sst2" --objective mlm --seed 0 \
                --num_train_epochs "$PRETRAIN_EPOCHS" --disable_tqdm true --output_dir "$PRETRAINED" "${RESUME[@]}" \
                ${PRETRAIN_EXTRA:-}
        fi
        ;;
    lr)
        for LR_TRIED in $LRS; do
            $PY scripts/benchmark_text.py "${COMMON[@]}" --learning_rate "$LR_TRIED" --seed 0 \
                --output_dir "$R/lr/lr$LR_TRIED" --strategies traditional
        done
        ;;
    main)
        LR_USED=${LR:-auto}
        if [[ $LR_USED == auto ]]; then
            LR_USED=$(best_lr "$R/lr")
        fi
        echo "main: learning rate $LR_USED"
        if [[ -f $R/lr/lr$LR_USED/traditional.json && ! -f $R/seed0/traditional.json ]]; then
            mkdir -p "$R/seed0"
            cp "$R/lr/lr$LR_USED/traditional.json" "$R/seed0/traditional.json"
        fi
        for SEED in ${SEEDS:-0 1 2}; do
            $PY scripts/benchmark_text.py "${COMMON[@]}" --learning_rate "$LR_USED" --seed "$SEED" \
                --keep 0.3333333333 --staleness 3 --output_dir "$R/seed$SEED" --strategies "$(echo $STRATEGIES | tr ' ' ',')"
        done
        ;;
    report)
        $PY scripts/paper_regime_report.py --root "$R" \
            --title "Fine-tuning: SST-2 from a BERT 2x128 pretrained (masked LM) on SST-2's sentences, $EPOCHS epochs"
        ;;
    *)
        echo "unknown part $PART: pretrain, lr, main or report" >&2
        exit 2
        ;;
    esac
done
