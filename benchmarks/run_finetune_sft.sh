#!/bin/bash
# The SFT part of the fine-tuning benchmark (docs/record/benchmarks.md, "Fine-tuning"): the small GPT-2 of
# scripts/train_sft.py pretrained as a causal LM on SST-2's sentences (train, validation and test; no labels:
# scripts/pretrain_lm.py --objective causal), cached outside git, then fine-tuned with TRL's SFTTrainer on
# prompt-completion pairs (the sentence -> " positive" / " negative", the loss on the answer alone:
# scripts/train_sft.py --completion_from_label) by Traditional, SB (keep 1/3), Stale-SB (n = 3) and InfoBatch, each
# beside a uniform control at the backward fraction it realised. Validation loss and mean token accuracy of the
# answer are in each run's eval_results.json; scripts/sft_report.py tabulates loss and throughput.
#
# Seed $SEED (default 0), $EPOCHS epochs (default 3: Stale-SB and InfoBatch save from the second). Restartable: a run whose eval_results.json exists is skipped. Run it on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
SEED=${SEED:-0}
R=${RESULTS:-benchmarks/results/finetune-sst2-sft/seed$SEED}
CACHE=${FINETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hf-selective-backprop/finetune}
PRETRAIN_EPOCHS=${PRETRAIN_EPOCHS:-3}
PRETRAINED=${PRETRAINED:-$CACHE/gpt2-2x128-sst2-causal-$PRETRAIN_EPOCHS-epochs}
export OMP_NUM_THREADS=${THREADS:-2}
read -r -a EXTRA <<<"${EXTRA:-}"

if [[ ! -f $PRETRAINED/model.safetensors ]]; then
    RESUME=()
    compgen -G "$PRETRAINED/checkpoint-*" >/dev/null && RESUME=(--resume_from_checkpoint True)
    $PY scripts/pretrain_lm.py --dataset "$DATA/sst2" --objective causal --seed 0 --num_train_epochs "$PRETRAIN_EPOCHS" \
        --disable_tqdm true --output_dir "$PRETRAINED" "${RESUME[@]}" ${PRETRAIN_EXTRA:-}
fi

run() {  # NAME FLAGS...
    local NAME=$1
    shift
    [[ -f $R/$NAME/eval_results.json ]] && return
    rm -rf "${R:?}/$NAME"
    $PY scripts/train_sft.py --dataset "$DATA/sst2" --model_name_or_path "$PRETRAINED" --completion_from_label true \
        --num_train_epochs "${EPOCHS:-3}" --learning_rate "${LR:-0.0003}" --seed "$SEED" --save_strategy no \
        --eval_strategy no --disable_tqdm true --output_dir "$R/$NAME" "${EXTRA[@]}" "$@"
}

backward_fraction() {  # RUN FOLDER: backward passes per example read
    $PY -c "import json, sys; s = json.load(open(sys.argv[1] + '/sb_stats.json')); print(s['backwards'] / s['examples_seen'])" "$1"
}

run none --sb_strategy none
run sb --sb_strategy sb --sb_keep 0.3333333333
run stale-sb --sb_strategy sb --sb_keep 0.3333333333 --sb_staleness 3
run infobatch --sb_strategy infobatch
for S in sb stale-sb infobatch; do
    run "uniform-for-$S" --sb_strategy uniform --sb_keep "$(backward_fraction "$R/$S")"
done
$PY scripts/sft_report.py --runs "$R"/none "$R"/sb "$R"/stale-sb "$R"/infobatch "$R"/uniform-for-sb \
    "$R"/uniform-for-stale-sb "$R"/uniform-for-infobatch | tee "$R/report.md"
