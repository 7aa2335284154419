#!/bin/bash
# The text-classification part of the fine-tuning benchmark (docs/benchmarks/benchmarks.md, "Fine-tuning"): the
# small BERT of scripts/train_text.py (2 layers, 128 wide), pretrained with masked language modelling on
# SST-2's sentences (train, validation and test; no labels: task-adaptive pretraining, scripts/pretrain_lm.py),
# cached outside git, then fine-tuned on SST-2 classification (AdamW, warm-up then linear decay) with every strategy
# beside its uniform control, as benchmarks/run_finetune.sh does for images.
#
# PARTS: pretrain, lr (Traditional, seed 0, at each of $LRS; LR=auto takes the most accurate), main (seeds
# $SEEDS), report, redundancy (Traditional again, seeds $REDUNDANCY_SEEDS, also measuring its loss on the first
# 1,000 training sentences at every evaluation: a run of its own, so the main part's timings measure training
# alone), variants (seeds $VARIANT_SEEDS: SB selecting from the second epoch on, after a full first one, beside
# its uniform control: the first epoch is where the paper's setting stalls). Restartable: a run whose <strategy>.json exists is skipped. Run it on an otherwise idle machine.
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

lr_used() {  # $LR, or with LR=auto (the default) the lr part's most accurate
    if [[ ${LR:-auto} == auto ]]; then best_lr "$R/lr"; else echo "$LR"; fi
}

for PART in ${PARTS:-pretrain lr main report redundancy variants}; do
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
            $PY benchmarks/benchmark_text.py "${COMMON[@]}" --learning_rate "$LR_TRIED" --seed 0 \
                --output_dir "$R/lr/lr$LR_TRIED" --strategies traditional
        done
        ;;
    main)
        LR_USED=$(lr_used)
        echo "main: learning rate $LR_USED"
        if [[ -f $R/lr/lr$LR_USED/traditional.json && ! -f $R/seed0/traditional.json ]]; then
            mkdir -p "$R/seed0"
            cp "$R/lr/lr$LR_USED/traditional.json" "$R/seed0/traditional.json"
        fi
        for SEED in ${SEEDS:-0 1 2}; do
            $PY benchmarks/benchmark_text.py "${COMMON[@]}" --learning_rate "$LR_USED" --seed "$SEED" \
                --keep 0.3333333333 --staleness 3 --output_dir "$R/seed$SEED" --strategies "$(echo $STRATEGIES | tr ' ' ',')"
        done
        ;;
    redundancy)
        for SEED in ${REDUNDANCY_SEEDS:-0}; do
            $PY benchmarks/benchmark_text.py "${COMMON[@]}" --learning_rate "$(lr_used)" --seed "$SEED" \
                --train_eval_samples 1000 --output_dir "$R/redundancy/seed$SEED" --strategies traditional
        done
        $PY benchmarks/paper_regime_report.py --root "$R/redundancy" \
            --title "Fine-tuning SST-2: Traditional's fit of its first 1,000 training sentences"
        ;;
    variants)
        for SEED in ${VARIANT_SEEDS:-0}; do
            mkdir -p "$R/variants/seed$SEED"
            cp -n "$R/seed$SEED/traditional.json" "$R/variants/seed$SEED/"
            $PY benchmarks/benchmark_text.py "${COMMON[@]}" --learning_rate "$(lr_used)" --seed "$SEED" \
                --keep 0.3333333333 --warmup_epochs 1 --output_dir "$R/variants/seed$SEED" \
                --strategies traditional,sb-warmup,uniform-for-sb-warmup
        done
        $PY benchmarks/paper_regime_report.py --root "$R/variants" \
            --title "Fine-tuning SST-2: SB from the second epoch on"
        ;;
    report)
        $PY benchmarks/paper_regime_report.py --root "$R" \
            --title "Fine-tuning: SST-2 from a BERT 2x128 pretrained (masked LM) on SST-2's sentences, $EPOCHS epochs"
        ;;
    *)
        echo "unknown part $PART: pretrain, lr, main, report, redundancy or variants" >&2
        exit 2
        ;;
    esac
done
