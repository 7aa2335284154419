#!/bin/bash
# The budget study of docs/benchmarks/benchmarks.md ("A compute budget"): every strategy run with --sb_budget F (a
# share of the full plain run's cost, its learning-rate schedule decaying fully inside it) against
# sb_strategy none (plain training shortened to the same budget) and the uniform random subset at the same budget.
# WORKLOAD chooses the full run that F is a share of:
#   finetune (default)  the fine-tuning one of benchmarks/run_finetune.sh (run its pretrain and lr parts first; this
#                       reads the same pretrained model and, with LR=auto, the learning rate Traditional chose there);
#   scratch             the from-scratch one of benchmarks/run_paper_regime.sh (CIFAR-10, 2,500 images, 60 epochs
#                       of the paper's step schedule, cifar_convnet_half).
#
# Budgets $BUDGETS for seed 0, and $SEEDED_BUDGETS for seeds $SEEDS (either may be empty: BUDGETS= SEEDED_BUDGETS=0.75
# runs only the seeded budget). Restartable: a run whose <strategy>.json exists
# is skipped. The accuracies do not depend on the machine's load (each budget is counted in passes, not seconds,
# at the cost model's phi = 1/3 given as --sb_cost_phi, where the trainer would measure it on the run's first
# steps); the times in the logs do.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/lr_choice.sh
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
MODEL=${MODEL:-cifar_convnet_half}
WORKLOAD=${WORKLOAD:-finetune}
BUDGETS=${BUDGETS-0.25 0.5 0.75}
SEEDED_BUDGETS=${SEEDED_BUDGETS-0.5}
read -r -a EXTRA <<<"${EXTRA:-}"
case $WORKLOAD in
finetune)
    FINETUNE=${FINETUNE_RESULTS:-benchmarks/results/finetune-cifar10-$MODEL}
    R=${RESULTS:-benchmarks/results/budget-finetune-cifar10-$MODEL}
    CACHE=${FINETUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hf-selective-backprop/finetune}
    PRETRAIN_EPOCHS=${PRETRAIN_EPOCHS:-20}
    PRETRAINED=${PRETRAINED:-$CACHE/$MODEL-cifar10-classes0-4-$PRETRAIN_EPOCHS-epochs}
    [[ -f $PRETRAINED/model.safetensors ]] || {
        echo "no pretrained model in $PRETRAINED: run benchmarks/run_finetune.sh's pretrain part" >&2
        exit 2
    }
    LR_USED=${LR:-auto}
    [[ $LR_USED == auto ]] && LR_USED=$(best_lr "$FINETUNE/lr")
    TITLE="Fine-tuning at a compute budget: CIFAR-10 classes 5-9 from $MODEL"
    WORKLOAD_FLAGS=(--classes 5,6,7,8,9 --model_name_or_path "$PRETRAINED" --num_train_epochs "${EPOCHS:-6}"
        --learning_rate "$LR_USED")
    ;;
scratch)
    R=${RESULTS:-benchmarks/results/budget-scratch-cifar10-$MODEL}
    TITLE="From scratch at a compute budget: CIFAR-10, 2,500 images, $MODEL, ${EPOCHS:-60} epochs at budget 1"
    source benchmarks/paper_regime_workload.sh
    WORKLOAD_FLAGS=("${PAPER_REGIME_FLAGS[@]}" --num_train_epochs "${EPOCHS:-60}")
    ;;
*)
    echo "unknown WORKLOAD $WORKLOAD: finetune or scratch" >&2
    exit 2
    ;;
esac
STRATEGIES=traditional,uniform-keep0.5,sb,sb-keep0.5,stale-sb,infobatch,composer-card,topk-keep0.5

run_budget() {  # BUDGET SEED
    $PY benchmarks/benchmark.py --dataset "$DATA/cifar10" "${WORKLOAD_FLAGS[@]}" --cutout 0 --threads "${THREADS:-2}" \
        --batch_size 128 --evals_per_epoch 0 --sb_budget "$1" --sb_cost_phi 0.3333333333 --seed "$2" --keep 0.3333333333 --staleness 3 \
        --output_dir "$R/budget$1/seed$2" --strategies "$STRATEGIES" "${EXTRA[@]}"
}

for BUDGET in $BUDGETS; do
    run_budget "$BUDGET" 0
done
for BUDGET in $SEEDED_BUDGETS; do
    for SEED in ${SEEDS:-1 2}; do
        run_budget "$BUDGET" "$SEED"
    done
done
$PY benchmarks/budget_report.py --root "$R" --title "$TITLE"
