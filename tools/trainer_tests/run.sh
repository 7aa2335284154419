#!/bin/bash
# transformers' own Trainer tests three ways: the Trainer itself, SelectiveBackpropTrainer with sb_strategy="none",
# and with the default strategy (docs/reliability.md, "transformers' own Trainer tests").
#
#   TESTS=path/to/transformers bash tools/trainer_tests/run.sh      # a clone at the release `make test` pins
#
# Runs FILES of $TESTS/tests/trainer from copies in a scratch folder (the swap's conftest.py beside the swapped
# copy), and prints passed/failed/skipped per configuration and every test whose outcome differs from the Trainer's.
# The tests need `parameterized`; HF_HUB_OFFLINE=1 on a machine without the Hub makes its tests fail at once.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
: "${TESTS:?set TESTS to a transformers clone (git clone --branch v5.24.0 https://github.com/huggingface/transformers)}"
FILES=${FILES:-test_trainer_callback.py test_trainer_checkpointing.py test_trainer_resume.py test_trainer_data.py
test_trainer_evaluation.py test_trainer_optimizers.py test_loss_reduction.py}
ROOT=$PWD
OUT=$(realpath -m "${OUT:-outputs/trainer_tests}")
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
mkdir -p "$OUT"
for MODE in stock none default; do
    mkdir -p "$SCRATCH/$MODE/tests"
    cp -r "$TESTS/tests/trainer" "$SCRATCH/$MODE/tests/"
    touch "$SCRATCH/$MODE/tests/__init__.py"
    printf '[pytest]\nmarkers =\n    is_staging_test\n    run_first\n    order\n    flash_attn_test\n    torch_compile_test\n    torch_export_test\n    generate\n    training_ci\n    tensor_parallel_ci\n' >"$SCRATCH/$MODE/pytest.ini"
    [[ $MODE != stock ]] && cp tools/trainer_tests/conftest.py "$SCRATCH/$MODE/"
    (cd "$SCRATCH/$MODE" && SB_SWAP_MODE=$MODE PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$ROOT/$PY" -m pytest -q \
        -p no:cacheprovider -n 2 --timeout 600 --junitxml="$OUT/$MODE.xml" \
        $(for FILE in $FILES; do echo "tests/trainer/$FILE"; done) >"$OUT/$MODE.log" 2>&1) || true
done
$PY tools/trainer_tests/compare_outcomes.py "$OUT"/stock.xml "$OUT"/none.xml "$OUT"/default.xml
