#!/bin/bash
# The language-model run of docs/benchmarks/text.md: a tiny GPT-2 on SST-2's sentences, Traditional and SB,
# one epoch each; perplexity on the validation sentences. Not a timing benchmark (one seed); it shows
# the causal-LM path end to end. The models go to a scratch folder; their metrics and selection
# counters are kept in benchmarks/results/sst2-lm/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
R=benchmarks/results/sst2-lm
DATA=${DATA:-../shared/data}
SCRATCH=$(mktemp -d)
mkdir -p $R
for STRATEGY in none sb; do
    $PY scripts/train_text.py --dataset $DATA/sst2 --task causal-lm --max_train_samples 20000 --seed 0 \
        --sb_strategy $STRATEGY --sb_keep 0.5 --save_strategy no --output_dir $SCRATCH/$STRATEGY | tail -n 1 | tee $R/$STRATEGY.txt
    cp $SCRATCH/$STRATEGY/eval_results.json $R/$STRATEGY-eval_results.json
    cp $SCRATCH/$STRATEGY/sb_stats.json $R/$STRATEGY-sb_stats.json
done
rm -rf $SCRATCH
