#!/bin/bash
# SFT throughput (docs/benchmarks/text.md, "What selection saves in SFT, measured"): TRL's SFTTrainer on SST-2 sentences, a
# 2-layer GPT-2 from scratch, plain (sb_strategy none), with SB (keep 1/3) and with Stale-SB (n = 2), one
# seed, the same data and epochs, padded and packed; then tokens per second beside the cost model's ideal, and
# the final validation loss. Run with nothing else on the machine. Restartable: a run with eval_results.json is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
R=${RESULTS:-benchmarks/results/sst2-sft}
DATA=${DATA:-../shared/data}
export OMP_NUM_THREADS=${THREADS:-2}
COMMON=(--dataset $DATA/sst2 --max_train_samples ${SAMPLES:-8000} --max_eval_samples 872 --num_train_epochs
        ${EPOCHS:-2} --seed 0 --save_strategy no --eval_strategy no --disable_tqdm true)

run() {  # NAME FLAGS...: the first run learns the tokenizer, the others reuse it
    local NAME=$1
    shift
    [[ -f $R/$NAME/eval_results.json ]] && return
    rm -rf "$R/$NAME"
    local TOKENIZER=()
    [[ $NAME != none ]] && TOKENIZER=(--tokenizer_name $R/none)
    $PY scripts/train_sft.py "${COMMON[@]}" "${TOKENIZER[@]}" --output_dir $R/$NAME "$@"
}

run none --sb_strategy none
run sb --sb_strategy sb --sb_keep 0.3333
run stale-sb --sb_strategy sb --sb_keep 0.3333 --sb_staleness 2
# Packed (TRL's bfd packing into rows of max_length 64 tokens, padding-free): selection keeps or drops sequences.
run packed-none --sb_strategy none --packing true
run packed-sb --sb_strategy sb --sb_keep 0.3333 --packing true
run packed-stale-sb --sb_strategy sb --sb_keep 0.3333 --sb_staleness 2 --packing true
$PY benchmarks/sft_report.py --runs $R/none $R/sb $R/stale-sb $R/packed-none $R/packed-sb $R/packed-stale-sb | tee $R/report.md
