#!/bin/bash
# The lossless frontier (docs/benchmarks/benchmarks.md, "Lossless frontier"): the most each strategy saves while its
# accuracy stays within Traditional's spread, on the image fine-tuning workload of benchmarks/run_finetune.sh
# (CIFAR-10 classes 5-9 from $MODEL pretrained on classes 0-4: the same stand-in checkpoint, the same flags). Each
# strategy's saving knob is swept with the benchmark's knob names (infobatch-r0.3, stale-sb-n2-keep0.5: see
# `benchmarks/benchmark.py --help`), every setting beside the uniform control at the backward fraction it realised, so
# that the random subset's curve is measured at every point the others reach.
#
# PARTS (in this order by default):
#   pretrain  the stand-in checkpoint (run_finetune.sh's part of that name)
#   sweep     seed 0, $EPOCHS epochs: Traditional and the whole grid ($SWEEP), each setting then its control
#   seeds     seeds $SEEDS, $EPOCHS epochs: Traditional and the settings where seed 0's frontier bends ($FRONTIER)
#   lr-long   Traditional, seed 0, $LONG_EPOCHS epochs, at each of $LONG_LRS: the longer run's rate chosen again
#   long      seeds $LONG_SEEDS, $LONG_EPOCHS epochs: Traditional and $LONG_FRONTIER, each with its control
#   report    each schedule's frontier report (report.md, frontier.png)
#   early     one run that prunes once (--sb_strategy early_prune: every example in the first epoch, then the share
#             $EARLY_KEEPS with the highest first-epoch loss): for each keep and seeds $EARLY_SEEDS, $EPOCHS epochs,
#             beside its uniform control and early-random (a fixed random subset of the same size; EARLY_RANDOM=no
#             leaves it out), with Traditional
#             again in each seed so that every saving is timed in one sitting; then its report ($R/epochs$EPOCHS-early).
#             EARLY_DELTA=D anneals early_prune and early-random (--sb_anneal_delta D: the epochs from D x $EPOCHS on
#             train everything again), in a folder of its own ($R/epochs$EPOCHS-early-deltaD) with its own Traditional
#   sst2-early  the early part on run_finetune_text.sh's SST-2 fine-tuning (its stand-in, its learning rate, its 2
#             epochs): keeps $SST2_EARLY_KEEPS, seeds $TRANSFER_SEEDS, each beside Traditional, its uniform control and
#             early-random; then its report ($SST2-early; EARLY_DELTA as in the early part)
#   sst2      does the setting transfer? $TRANSFER on run_finetune_text.sh's SST-2 fine-tuning (its stand-in, its
#             learning rate, its 2 epochs), seeds $TRANSFER_SEEDS, each beside its control; then its frontier report
#   sft       the same on run_finetune_sft.sh's SFT workload (TRL's SFTTrainer, validation loss), then its report
# Every run is a process of its own, skipped when its <strategy>.json exists: killing this and starting it again goes
# on where it stopped (the run in progress starts over). Timing is the point: run it on an otherwise idle machine.
# BENCH_LOCK=<file>: each run holds that file's lock (flock(1)) while it runs, so that a job started with
# `flock <file> <command>` waits until the run in progress ends instead of slowing it.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lr_choice.sh
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
MODEL=${MODEL:-cifar_convnet_half}
R=${RESULTS:-benchmarks/results/frontier-cifar10-$MODEL}
CACHE=${FINETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hf-selective-backprop/finetune}
PRETRAIN_EPOCHS=${PRETRAIN_EPOCHS:-20}
PRETRAINED=${PRETRAINED:-$CACHE/$MODEL-cifar10-classes0-4-$PRETRAIN_EPOCHS-epochs}
EPOCHS=${EPOCHS:-6}
LONG_EPOCHS=${LONG_EPOCHS:-12}
LONG_LRS=${LONG_LRS:-0.03 0.1}
THREADS=${THREADS:-2}
read -r -a EXTRA <<<"${EXTRA:-}"
LOCK=()
[[ -n ${BENCH_LOCK:-} ]] && LOCK=(flock "$BENCH_LOCK")

# Seed 0's grid, each family from its gentlest setting to its most aggressive one. InfoBatch: prune ratio r, and
# annealing from 3/4 of the run instead of 7/8. SB's selection forward costs about a third of a step, so at keep
# 2/3 or more it saves nothing (docs/selection-pass.md): the SB family is swept at keep 1/2 (plain, and reweighted
# by 1/p) and through its stale form (n = 2 at keep 1/2 and 2/3, and annealed). Top-k at keep 2/3 and Composer's
# recommended setting show what the selection forward costs where little is dropped.
SWEEP=${SWEEP:-infobatch-r0.3 infobatch-r0.4 infobatch infobatch-r0.7 infobatch-delta0.75 infobatch-r0.7-delta0.75
sb-keep0.5 sb-weighted-keep0.5 stale-sb-n2-keep0.5 stale-sb-n2-keep0.67 stale-sb-anneal-n2-keep0.5 topk-keep0.67
composer-card}
# The defaults are the settings the committed results ran: seed 0's four settings nearest Traditional's accuracy at a
# saving of 1.2x or more, the two nearest for twice the epochs, and each family's nearest for the text workloads.
FRONTIER=${FRONTIER:-infobatch-r0.3 infobatch infobatch-delta0.75 stale-sb-n2-keep0.67}
LONG_FRONTIER=${LONG_FRONTIER:-infobatch infobatch-delta0.75}
TRANSFER=${TRANSFER:-infobatch-delta0.75 stale-sb-n2-keep0.67}
TRANSFER_SEEDS=${TRANSFER_SEEDS:-0 1 2}
SST2=${SST2_RESULTS:-benchmarks/results/frontier-sst2}
SFT=${SFT_RESULTS:-benchmarks/results/frontier-sst2-sft}
SFT_TRAIN_SAMPLES=${SFT_TRAIN_SAMPLES:-8000}
TEXT_PRETRAINED=$CACHE/bert-2x128-sst2-mlm-3-epochs
SFT_PRETRAINED=$CACHE/gpt2-2x128-sst2-causal-3-epochs

COMMON=(--dataset "$DATA/cifar10" --classes 5,6,7,8,9 --model_name_or_path "$PRETRAINED" --cutout 0
    --threads "$THREADS" --batch_size 128 --keep 0.3333333333 --staleness 3 "${EXTRA[@]}")

runs() {  # FOLDER SEED EPOCHS LR NAME...: each NAME whose log is missing, one process each
    local FOLDER=$1 SEED=$2 RUN_EPOCHS=$3 RATE=$4
    shift 4
    for NAME in "$@"; do
        [[ -f $FOLDER/$NAME.json ]] && continue
        "${LOCK[@]}" $PY benchmarks/benchmark.py "${COMMON[@]}" --num_train_epochs "$RUN_EPOCHS" --learning_rate "$RATE" \
            --seed "$SEED" --output_dir "$FOLDER" --strategies "$NAME"
    done
}

text_runs() {  # FOLDER SEED NAME...: the SST-2 fine-tuning of run_finetune_text.sh, one process each
    local FOLDER=$1 SEED=$2
    shift 2
    for NAME in "$@"; do
        [[ -f $FOLDER/$NAME.json ]] && continue
        "${LOCK[@]}" $PY benchmarks/benchmark_text.py --dataset "$DATA/sst2" --model_name_or_path "$TEXT_PRETRAINED" \
            --threads "$THREADS" --num_train_epochs 2 --learning_rate "$(best_lr benchmarks/results/finetune-sst2/lr)" \
            --keep 0.3333333333 --staleness 3 --seed "$SEED" --output_dir "$FOLDER" --strategies "$NAME" "${EXTRA[@]}"
    done
}

sft_run() {  # FOLDER SEED FLAGS...: one run of run_finetune_sft.sh's SFT fine-tuning, skipped once it has ended
    local FOLDER=$1 SEED=$2
    shift 2
    [[ -f $FOLDER/eval_results.json ]] && return
    rm -rf "${FOLDER:?}"
    OMP_NUM_THREADS=$THREADS "${LOCK[@]}" $PY scripts/train_sft.py --dataset "$DATA/sst2" \
        --model_name_or_path "$SFT_PRETRAINED" --completion_from_label true --max_train_samples "$SFT_TRAIN_SAMPLES" \
        --num_train_epochs 3 --learning_rate "$(lowest_loss_lr benchmarks/results/finetune-sst2-sft)" --seed "$SEED" \
        --save_strategy no --eval_strategy no --disable_tqdm true --output_dir "$FOLDER" "${EXTRA[@]}" "$@"
}

backward_fraction() {  # RUN FOLDER of scripts/train_sft.py: backward passes per example read
    $PY -c "import json, sys; s = json.load(open(sys.argv[1] + '/sb_stats.json')); print(s['backwards'] / s['examples_seen'])" "$1"
}

with_controls() {  # NAME...: traditional, then each NAME followed by its uniform control
    echo traditional
    for NAME in "$@"; do echo "$NAME uniform-for-$NAME"; done
}

EARLY_KEEPS=${EARLY_KEEPS:-0.5 0.6}
EARLY_SEEDS=${EARLY_SEEDS:-0 1 2}
EARLY_RANDOM=${EARLY_RANDOM:-yes}  # no: leave out early-random (the fixed random subset; uniform is the other control)
EARLY_KNOB=${EARLY_DELTA:+-delta$EARLY_DELTA}  # the benchmark's knob for --sb_anneal_delta, or nothing
# SST-2 trains 2 epochs, so pruning after the first saves at most 2 / (1 + keep): 1.33x at keep 0.5.
SST2_EARLY_KEEPS=${SST2_EARLY_KEEPS:-0.5}

early_names() {  # KEEP: early_prune at that keep, its uniform control and (EARLY_RANDOM=yes) early-random
    echo "early-prune-keep$1$EARLY_KNOB" "uniform-for-early-prune-keep$1$EARLY_KNOB"
    [[ $EARLY_RANDOM == yes ]] && echo "early-random-keep$1$EARLY_KNOB"
    return 0
}

for PART in ${PARTS:-pretrain sweep seeds lr-long long report sst2 sft}; do
    case $PART in
    pretrain)
        PARTS=pretrain MODEL=$MODEL PRETRAINED=$PRETRAINED PRETRAIN_EPOCHS=$PRETRAIN_EPOCHS bash benchmarks/run_finetune.sh
        ;;
    sweep)
        # The rate run_finetune.sh's lr part chose for Traditional at these epochs.
        runs "$R/epochs$EPOCHS/seed0" 0 "$EPOCHS" "${LR:-$(best_lr benchmarks/results/finetune-cifar10-$MODEL/lr)}" \
            $(with_controls $SWEEP)
        ;;
    seeds)
        for SEED in ${SEEDS:-1 2}; do
            runs "$R/epochs$EPOCHS/seed$SEED" "$SEED" "$EPOCHS" \
                "${LR:-$(best_lr benchmarks/results/finetune-cifar10-$MODEL/lr)}" $(with_controls $FRONTIER)
        done
        ;;
    lr-long)
        for RATE in $LONG_LRS; do
            runs "$R/epochs$LONG_EPOCHS/lr/lr$RATE" 0 "$LONG_EPOCHS" "$RATE" traditional
        done
        ;;
    long)
        LONG_LR=${LONG_LR:-$(best_lr "$R/epochs$LONG_EPOCHS/lr")}
        for SEED in ${LONG_SEEDS:-0 1 2}; do
            mkdir -p "$R/epochs$LONG_EPOCHS/seed$SEED"
            # Seed 0's Traditional run at the chosen rate is the lr-long part's (the same flags).
            [[ $SEED == 0 ]] && cp -n "$R/epochs$LONG_EPOCHS/lr/lr$LONG_LR/traditional.json" "$R/epochs$LONG_EPOCHS/seed0/"
            runs "$R/epochs$LONG_EPOCHS/seed$SEED" "$SEED" "$LONG_EPOCHS" "$LONG_LR" $(with_controls $LONG_FRONTIER)
        done
        ;;
    early)
        # The rate chosen for Traditional at these epochs: the lr-long part's where it ran them, else run_finetune.sh's.
        LR_ROOT=$R/epochs$EPOCHS/lr
        [[ -d $LR_ROOT ]] || LR_ROOT=benchmarks/results/finetune-cifar10-$MODEL/lr
        EARLY_LR=${LR:-$(best_lr "$LR_ROOT")}
        # Each keep in every seed before the next keep: a stopped run leaves whole comparisons.
        EARLY_ROOT=$R/epochs$EPOCHS-early$EARLY_KNOB
        for KEEP in $EARLY_KEEPS; do
            for SEED in $EARLY_SEEDS; do
                runs "$EARLY_ROOT/seed$SEED" "$SEED" "$EPOCHS" "$EARLY_LR" traditional $(early_names "$KEEP")
            done
        done
        $PY benchmarks/frontier_report.py --root "$EARLY_ROOT" --target 1.5 \
            --title "Pruning once after the first epoch${EARLY_DELTA:+, all data again from $EARLY_DELTA of the run}: CIFAR-10 classes 5-9 from $MODEL pretrained on classes 0-4, $EPOCHS epochs"
        ;;
    sst2-early)
        PRETRAINED=$TEXT_PRETRAINED PARTS=pretrain bash benchmarks/run_finetune_text.sh
        for KEEP in $SST2_EARLY_KEEPS; do
            for SEED in $TRANSFER_SEEDS; do
                text_runs "$SST2-early$EARLY_KNOB/seed$SEED" "$SEED" traditional $(early_names "$KEEP")
            done
        done
        $PY benchmarks/frontier_report.py --root "$SST2-early$EARLY_KNOB" --target 1.3 \
            --title "Pruning once after the first epoch${EARLY_DELTA:+, all data again from $EARLY_DELTA of the run}: SST-2 from a BERT 2x128 pretrained (masked LM) on its sentences, 2 epochs"
        ;;
    sst2)
        PRETRAINED=$TEXT_PRETRAINED PARTS=pretrain bash benchmarks/run_finetune_text.sh
        for SEED in $TRANSFER_SEEDS; do
            text_runs "$SST2/seed$SEED" "$SEED" $(with_controls $TRANSFER)
        done
        $PY benchmarks/frontier_report.py --root "$SST2" --target 1.2 \
            --title "Does the setting transfer? SST-2 from a BERT 2x128 pretrained (masked LM) on its sentences, 2 epochs"
        ;;
    sft)
        PRETRAINED=$SFT_PRETRAINED PARTS=pretrain bash benchmarks/run_finetune_sft.sh
        for SEED in $TRANSFER_SEEDS; do
            sft_run "$SFT/seed$SEED/none" "$SEED" --sb_strategy none
            for NAME in $TRANSFER; do
                sft_run "$SFT/seed$SEED/$NAME" "$SEED" $($PY benchmarks/strategy_flags.py "$NAME")
                sft_run "$SFT/seed$SEED/uniform-for-$NAME" "$SEED" --sb_strategy uniform \
                    --sb_keep "$(backward_fraction "$SFT/seed$SEED/$NAME")"
            done
        done
        $PY benchmarks/sft_report.py --root "$SFT" --target 1.2 | tee "$SFT/report.md"
        ;;
    report)
        # The saving each schedule's largest lossless saving is held to: 1.3x, and 1.5x at twice the epochs.
        for RUN_EPOCHS in $EPOCHS $LONG_EPOCHS; do
            [[ -d $R/epochs$RUN_EPOCHS ]] || continue
            TARGET=1.3
            [[ $RUN_EPOCHS == "$LONG_EPOCHS" ]] && TARGET=1.5
            $PY benchmarks/frontier_report.py --root "$R/epochs$RUN_EPOCHS" --target "$TARGET" \
                --title "Lossless frontier: CIFAR-10 classes 5-9 from $MODEL pretrained on classes 0-4, $RUN_EPOCHS epochs"
        done
        ;;
    *)
        echo "unknown part $PART: pretrain, sweep, seeds, lr-long, long, report, early, sst2-early, sst2 or sft" >&2
        exit 2
        ;;
    esac
done
