#!/bin/bash
# The SFT part of the fine-tuning benchmark (docs/benchmarks/benchmarks.md, "Fine-tuning"): the small GPT-2 of
# scripts/train_sft.py pretrained as a causal LM on SST-2's sentences (train, validation and test; no labels:
# scripts/pretrain_lm.py --objective causal), cached outside git, then fine-tuned with TRL's SFTTrainer on
# prompt-completion pairs (the sentence -> " positive" / " negative", the loss on the answer alone:
# scripts/train_sft.py --completion_from_label) by Traditional, SB (keep 1/3), Stale-SB (n = 3) and InfoBatch, each
# beside a uniform control at the backward fraction it realised. Validation loss and mean token accuracy of the
# answer are in each run's eval_results.json; benchmarks/sft_report.py tabulates loss and throughput.
#
# PARTS (in this order by default):
#   pretrain  the stand-in (skipped when $PRETRAINED holds a model; resumes from its last checkpoint).
#   lr        Traditional, seed 0, at each of $LRS; the main part uses the rate with the lowest validation loss
#             (LR=auto, the default), chosen for Traditional before any strategy runs.
#   main      each of $SEEDS (default 0 1 2): the strategies and their controls, then seed<N>/report.md.
#   report    $ROOT/report.md over every seed run so far (benchmarks/sft_report.py --root): mean ± sd, each strategy
#             against its control seed by seed, and the fine-tuning target.
# The first $TRAIN_SAMPLES training phrases (default 8,000: Traditional trains about 65 of them a second on a
# 2-core CPU, so all 67,349 for 3 epochs would take 52 minutes a run), $EPOCHS epochs (default 3: Stale-SB
# and InfoBatch save from the second). Restartable: a run whose eval_results.json exists is skipped. Run it on an
# idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lr_choice.sh
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
ROOT=${RESULTS:-benchmarks/results/finetune-sst2-sft}
LRS=${LRS:-0.0001 0.0003 0.001}
TRAIN_SAMPLES=${TRAIN_SAMPLES:-8000}
CACHE=${FINETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hf-selective-backprop/finetune}
PRETRAIN_EPOCHS=${PRETRAIN_EPOCHS:-3}
PRETRAINED=${PRETRAINED:-$CACHE/gpt2-2x128-sst2-causal-$PRETRAIN_EPOCHS-epochs}
export OMP_NUM_THREADS=${THREADS:-2}
read -r -a EXTRA <<<"${EXTRA:-}"

pretrain() {
    [[ -f $PRETRAINED/model.safetensors ]] && return
    local RESUME=()
    compgen -G "$PRETRAINED/checkpoint-*" >/dev/null && RESUME=(--resume_from_checkpoint True)
    $PY scripts/pretrain_lm.py --dataset "$DATA/sst2" --objective causal --seed 0 --num_train_epochs "$PRETRAIN_EPOCHS" \
        --disable_tqdm true --output_dir "$PRETRAINED" "${RESUME[@]}" ${PRETRAIN_EXTRA:-}
}

run() {  # FOLDER LEARNING_RATE SEED FLAGS...
    local FOLDER=$1 RATE=$2 RUN_SEED=$3
    shift 3
    [[ -f $FOLDER/eval_results.json ]] && return
    rm -rf "${FOLDER:?}"
    $PY scripts/train_sft.py --dataset "$DATA/sst2" --model_name_or_path "$PRETRAINED" --completion_from_label true \
        --max_train_samples "$TRAIN_SAMPLES" --num_train_epochs "${EPOCHS:-3}" --learning_rate "$RATE" \
        --seed "$RUN_SEED" --save_strategy no --eval_strategy no --disable_tqdm true --output_dir "$FOLDER" \
        "${EXTRA[@]}" "$@"
}

backward_fraction() {  # RUN FOLDER: backward passes per example read
    $PY -c "import json, sys; s = json.load(open(sys.argv[1] + '/sb_stats.json')); print(s['backwards'] / s['examples_seen'])" "$1"
}

main_seed() {  # SEED RATE
    local SEED=$1 RATE=$2
    local R=$ROOT/seed$SEED
    # Seed 0's Traditional run at that rate is the lr part's (the same flags).
    if [[ $SEED == 0 && -f $ROOT/lr$RATE/eval_results.json && ! -f $R/none/eval_results.json ]]; then
        mkdir -p "$R"
        cp -r "$ROOT/lr$RATE" "$R/none"
    fi
    run "$R/none" "$RATE" "$SEED" --sb_strategy none
    run "$R/sb" "$RATE" "$SEED" --sb_strategy sb --sb_keep 0.3333333333
    run "$R/stale-sb" "$RATE" "$SEED" --sb_strategy sb --sb_keep 0.3333333333 --sb_staleness 3
    run "$R/infobatch" "$RATE" "$SEED" --sb_strategy infobatch
    for S in sb stale-sb infobatch; do
        run "$R/uniform-for-$S" "$RATE" "$SEED" --sb_strategy uniform --sb_keep "$(backward_fraction "$R/$S")"
    done
    $PY benchmarks/sft_report.py --runs "$R"/none "$R"/sb "$R"/stale-sb "$R"/infobatch "$R"/uniform-for-sb \
        "$R"/uniform-for-stale-sb "$R"/uniform-for-infobatch | tee "$R/report.md"
}

main() {
    local RATE=${LR:-auto}
    [[ $RATE == auto ]] && RATE=$(lowest_loss_lr "$ROOT")
    echo "main: learning rate $RATE"
    for SEED in ${SEEDS:-0 1 2}; do
        main_seed "$SEED" "$RATE"
    done
}

for PART in ${PARTS:-pretrain lr main report}; do
    case $PART in
    pretrain) pretrain ;;
    lr)
        for RATE in $LRS; do
            run "$ROOT/lr$RATE" "$RATE" 0 --sb_strategy none
        done
        ;;
    main) main ;;
    report) $PY benchmarks/sft_report.py --root "$ROOT" | tee "$ROOT/report.md" ;;
    *)
        echo "unknown part $PART: pretrain, lr, main or report" >&2
        exit 2
        ;;
    esac
done
