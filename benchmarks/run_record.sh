#!/bin/bash
# The example record's payoff (docs/benchmarks/benchmarks.md, "The example record"): pruning the next run's training set
# by a record's scores, each beside a random subset of the same size, and label issues found by one run's record
# against cleanlab's 5-fold confident learning. WORKLOAD=image (the default): the image fine-tuning workload of
# run_frontier.sh (CIFAR-10 classes 5-9 from $MODEL pretrained on classes 0-4: the same stand-in, flags and learning
# rate), through scripts/train.py. WORKLOAD=sst2: the SST-2 fine-tuning of run_finetune_text.sh (its BERT stand-in,
# learning rate and 2 epochs), through scripts/train_text.py; its sources are 'full' and 'epoch1'.
# WORKLOAD=pretrained-image and pretrained-text: run_pretrained.sh's workloads on real pretrained weights
# (EfficientNet-Lite0 on 4,000 CIFAR-10 images at 64 px, 4 epochs; all-MiniLM-L6-v2 on 2,000 SST-2 sentences, 3
# epochs; TRAIN sets the size), at the rate its lr part chose; no pretrain part; the source is 'full'.
#
# PARTS (in this order by default):
#   pretrain  the stand-in checkpoint (run_finetune.sh's part of that name)
#   scores    seeds $SEEDS: the runs whose records score the examples, each with its own cost: Traditional for $EPOCHS
#             epochs ('full': also the accuracy bar), its first N epochs alone ('epochN' in $SOURCES), and a proxy
#             ($PROXY_MODEL from scratch, without the stand-in's pretraining, for $PROXY_EPOCHS epochs: 'proxy', Selection
#             via Proxy's weaker, cheaper model; PROXY_MODEL picks another timm architecture, PROXY_NAME its source name)
#   prune     seeds $SEEDS: Traditional for $EPOCHS epochs on the subset each source x score in $SOURCES x $SCORES
#             keeps at each of $KEEPS, and on a random subset of each size (the control)
#   noisy     $NOISE of the labels flipped, seeds $NOISY_SEEDS: Traditional with the record, cleanlab's $FOLDS-fold
#             cross-validation on the same data (benchmarks/label_issues.py), and Traditional without the record's
#             candidates (the share flipped, lowest confidence first; DROP_BY=label_issues: highest last loss first,
#             into without-candidates-label_issues/) beside a random subset of the same size; NOISY_LONGER=E also
#             trains Traditional on the noisy labels for E epochs (full-epochsE/): the control that spends on one
#             run what the record's run and the retraining without its candidates spend together
#   flagged   for each noisy run that has cleanlab's figures: the sets record.label_issues flags, each ranking's
#             (benchmarks/label_issues.py --reuse_cleanlab: no training), into $N/flagged/label_issues.json
#   report    benchmarks/record_report.py: $R/report.md
# Every run is a process of its own, skipped when its trainer_state.json exists: killing this and starting it again
# goes on where it stopped (the run in progress starts over). The savings are counted in examples trained (the cost
# model) and in wall time: time them on an otherwise idle machine. BENCH_LOCK=<file>: each run holds that file's lock.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lr_choice.sh
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
MODEL=${MODEL:-cifar_convnet_half}
CACHE=${FINETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hf-selective-backprop/finetune}
WORKLOAD=${WORKLOAD:-image}
if [[ $WORKLOAD == image ]]; then
    PRETRAIN_EPOCHS=${PRETRAIN_EPOCHS:-20}
    PRETRAINED=${PRETRAINED:-$CACHE/$MODEL-cifar10-classes0-4-$PRETRAIN_EPOCHS-epochs}
    EPOCHS=${EPOCHS:-6}
    R=${RESULTS:-benchmarks/results/record-cifar10-$MODEL/epochs$EPOCHS}
    LR=${LR:-$(best_lr benchmarks/results/finetune-cifar10-$MODEL/lr)}
    SOURCES=${SOURCES:-full epoch1 proxy}
    SCRIPT=scripts/train.py
    DATA_FLAGS=(--dataset "$DATA/cifar10" --classes 5,6,7,8,9 --cutout 0)
elif [[ $WORKLOAD == pretrained-image ]]; then  # run_pretrained.sh's image workload (its rate, 4,000 images)
    PRETRAINED=${PRETRAINED:-timm/tf_efficientnet_lite0.in1k}
    EPOCHS=${EPOCHS:-4}
    R=${RESULTS:-benchmarks/results/record-pretrained-images}
    LR=${LR:-$(best_lr benchmarks/results/pretrained/images/lr)}
    SOURCES=${SOURCES:-full}
    SCRIPT=scripts/train.py
    DATA_FLAGS=(--dataset "$DATA/cifar10" --image_size 64 --cutout 0 --max_train_samples "${TRAIN:-4000}"
        --per_device_train_batch_size 64)
elif [[ $WORKLOAD == pretrained-text ]]; then  # run_pretrained.sh's text workload (its rate, 2,000 sentences)
    PRETRAINED=${PRETRAINED:-sentence-transformers/all-MiniLM-L6-v2}
    EPOCHS=${EPOCHS:-3}
    R=${RESULTS:-benchmarks/results/record-pretrained-text}
    LR=${LR:-$(best_lr benchmarks/results/pretrained/text/lr)}
    SOURCES=${SOURCES:-full}
    SCRIPT=scripts/train_text.py
    DATA_FLAGS=(--dataset "$DATA/sst2" --max_train_samples "${TRAIN:-2000}" --max_length 64)
else
    PRETRAIN_EPOCHS=${PRETRAIN_EPOCHS:-3}
    PRETRAINED=${PRETRAINED:-$CACHE/bert-2x128-sst2-mlm-$PRETRAIN_EPOCHS-epochs}
    EPOCHS=${EPOCHS:-2}
    R=${RESULTS:-benchmarks/results/record-sst2}
    LR=${LR:-$(best_lr benchmarks/results/finetune-sst2/lr)}
    SOURCES=${SOURCES:-full epoch1}
    SCRIPT=scripts/train_text.py
    DATA_FLAGS=(--dataset "$DATA/sst2")
fi
SEEDS=${SEEDS:-0 1 2}
SCORES=${SCORES:-mean_loss confidence variability}
KEEPS=${KEEPS:-0.5 0.7 0.9}
PROXY_MODEL=${PROXY_MODEL:-$MODEL}
PROXY_EPOCHS=${PROXY_EPOCHS:-2}
PROXY_NAME=${PROXY_NAME:-proxy}  # the proxy's source name: another per architecture (proxy_NAME; no '-')
NOISE=${NOISE:-0.1 0.2}
NOISY_SEEDS=${NOISY_SEEDS:-0 1 2}
FOLDS=${FOLDS:-5}
DROP_BY=${DROP_BY:-confidence}
export OMP_NUM_THREADS=${THREADS:-2}
read -r -a EXTRA <<<"${EXTRA:-}"
LOCK=()
[[ -n ${BENCH_LOCK:-} ]] && LOCK=(flock "$BENCH_LOCK")

RUN_FLAGS=(--learning_rate "$LR" --eval_strategy no --save_strategy no --disable_tqdm true --logging_steps 50
    --sb_strategy none "${EXTRA[@]}")

train() {  # FOLDER FLAGS...: one scripts/train.py run, unless it finished before
    local FOLDER=$1
    shift
    [[ -f $FOLDER/trainer_state.json ]] && return
    "${LOCK[@]}" $PY $SCRIPT "${DATA_FLAGS[@]}" "${RUN_FLAGS[@]}" --output_dir "$FOLDER" \
        --overwrite_output_dir "$@"
}

for PART in ${PARTS:-pretrain scores prune noisy report}; do
    case $PART in
    pretrain)
        [[ $WORKLOAD == pretrained-* ]] && continue  # the weights come from the package index
        SCRIPT_OF_PART=benchmarks/run_finetune.sh
        [[ $WORKLOAD == sst2 ]] && SCRIPT_OF_PART=benchmarks/run_finetune_text.sh
        EXTRA="${EXTRA[*]}" PARTS=pretrain MODEL=$MODEL PRETRAINED=$PRETRAINED PRETRAIN_EPOCHS=$PRETRAIN_EPOCHS \
            bash $SCRIPT_OF_PART
        ;;
    scores)
        for SEED in $SEEDS; do
            train "$R/seed$SEED/full" --model_name_or_path "$PRETRAINED" --num_train_epochs "$EPOCHS" --seed "$SEED"
            for SOURCE in $SOURCES; do  # epochN: the first N epochs alone (epoch1 by default)
                [[ $SOURCE =~ ^epoch([0-9]+)$ ]] || continue
                train "$R/seed$SEED/$SOURCE" --model_name_or_path "$PRETRAINED" --num_train_epochs "${BASH_REMATCH[1]}" \
                    --seed "$SEED"
            done
            if [[ " $SOURCES " == *" $PROXY_NAME "* ]]; then
                train "$R/seed$SEED/$PROXY_NAME" --model "$PROXY_MODEL" --num_train_epochs "$PROXY_EPOCHS" --seed "$SEED"
            fi
        done
        ;;
    prune)
        for SEED in $SEEDS; do
            for KEEP in $KEEPS; do
                for SOURCE in $SOURCES; do
                    for SCORE in $SCORES; do
                        # One scoring per example has no spread: every variability ties, and the tie-break is the
                        # random subset's draw, which its own run below trains already.
                        [[ $SOURCE == epoch1 && $SCORE == variability ]] && continue
                        train "$R/seed$SEED/$SOURCE-$SCORE-keep$KEEP" --model_name_or_path "$PRETRAINED" \
                            --num_train_epochs "$EPOCHS" --seed "$SEED" --sb_subset_from "$R/seed$SEED/$SOURCE" \
                            --sb_subset_keep "$KEEP" --sb_subset_by "$SCORE"
                    done
                done
                train "$R/seed$SEED/random-keep$KEEP" --model_name_or_path "$PRETRAINED" --num_train_epochs "$EPOCHS" \
                    --seed "$SEED" --sb_subset_from "$R/seed$SEED/full" --sb_subset_keep "$KEEP" --sb_subset_by random
            done
        done
        ;;
    flagged)
        ROWS_OF=image
        [[ $WORKLOAD == sst2 || $WORKLOAD == pretrained-text ]] && ROWS_OF=text
        for P in $NOISE; do
            for SEED in $NOISY_SEEDS; do
                N=$R/noise$P/seed$SEED
                [[ -f $N/cleanlab/label_issues.json && ! -f $N/flagged/label_issues.json ]] || continue
                $PY benchmarks/label_issues.py --workload $ROWS_OF "${DATA_FLAGS[@]}" "${RUN_FLAGS[@]}" \
                    --model_name_or_path "$PRETRAINED" --num_train_epochs "$EPOCHS" --seed "$SEED" --label_noise "$P" \
                    --label_noise_seed "$SEED" --record "$N/full" --reuse_cleanlab "$N/cleanlab/label_issues.json" \
                    --output_dir "$N/flagged"
            done
        done
        ;;
    noisy)
        ROWS_OF=image
        [[ $WORKLOAD == sst2 || $WORKLOAD == pretrained-text ]] && ROWS_OF=text
        $PY -c "import cleanlab" 2>/dev/null || $PY -m pip install --quiet cleanlab  # this benchmark's tool only
        for P in $NOISE; do
            for SEED in $NOISY_SEEDS; do
                N=$R/noise$P/seed$SEED
                NOISY=(--model_name_or_path "$PRETRAINED" --num_train_epochs "$EPOCHS" --seed "$SEED" --label_noise "$P"
                    --label_noise_seed "$SEED")
                train "$N/full" "${NOISY[@]}"
                if [[ ! -f $N/cleanlab/label_issues.json ]]; then
                    "${LOCK[@]}" $PY benchmarks/label_issues.py --workload $ROWS_OF "${DATA_FLAGS[@]}" "${RUN_FLAGS[@]}" \
                        "${NOISY[@]}" --record "$N/full" --folds "$FOLDS" --output_dir "$N/cleanlab"
                fi
                KEEP=$($PY -c "print(round(1 - $P, 4))")
                WITHOUT=$N/without-candidates
                [[ $DROP_BY != confidence ]] && WITHOUT=$N/without-candidates-$DROP_BY
                train "$WITHOUT" "${NOISY[@]}" --sb_subset_from "$N/full" --sb_subset_keep "$KEEP" --sb_subset_by "$DROP_BY"
                train "$N/random-keep$KEEP" "${NOISY[@]}" --sb_subset_from "$N/full" --sb_subset_keep "$KEEP" \
                    --sb_subset_by random
                if [[ -n ${NOISY_LONGER:-} ]]; then
                    train "$N/full-epochs$NOISY_LONGER" "${NOISY[@]}" --num_train_epochs "$NOISY_LONGER"
                fi
            done
        done
        ;;
    report)
        $PY benchmarks/record_report.py --root "$R"
        ;;
    *)
        echo "unknown part $PART" >&2
        exit 2
        ;;
    esac
done
