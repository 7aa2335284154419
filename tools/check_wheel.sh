#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh virtual environment, and train one epoch
# on scikit-learn's bundled digits from outside the source tree: the model card must be written
# from the template that ships in the wheel; and check that installing the wheel beside newer transformers and TRL
# releases resolves without downgrading them. Offline; about a minute on two CPU cores.
#
#   bash tools/check_wheel.sh            # uses .venv/bin/python for the build and the dependencies
#   PYTHON=/path/to/python bash tools/check_wheel.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
unset PYTHONPATH  # the source tree must not be importable

# Build from a copy of the sources: setuptools would otherwise reuse stale files from ./build.
mkdir "$WORK/src"
tar -C "$ROOT" -cf - --exclude=./.venv --exclude=./.venv-oldest --exclude=./.git --exclude=./build --exclude=./dist --exclude=./outputs \
    --exclude='*.egg-info' --exclude=__pycache__ . | tar -C "$WORK/src" -xf -
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$WORK/dist" "$WORK/src"
WHEEL="$(ls "$WORK"/dist/hf_selective_backprop-*.whl)"
echo "built $(basename "$WHEEL")"
"$PYTHON" - "$WHEEL" <<'EOF'
import sys
import zipfile

names = set(zipfile.ZipFile(sys.argv[1]).namelist())
needed = {
    "hf_selective_backprop/templates/selective_backprop.md",
    "hf_selective_backprop/py.typed",
    "hf_selective_backprop/metrics/accuracy/accuracy.py",
}
missing = sorted(needed - names)
licence = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
if missing or not licence:
    sys.exit(f"wheel lacks {missing or 'the LICENSE'}")
# The library only: the benchmark harness (benchmarks/harness/, imported as `harness`), the scripts and the tests
# stay in the repository (docs/architecture.md, "What ships").
extra = sorted(name for name in names if not name.startswith("hf_selective_backprop/") and ".dist-info/" not in name)
if extra:
    sys.exit(f"wheel holds more than the library: {extra}")
print("wheel holds", ", ".join(sorted(needed)), "and", licence[0], "and nothing outside hf_selective_backprop/")
EOF

# The heavy dependencies (torch, transformers, ...) come from $PYTHON's site-packages through a
# .pth file, listed after the new environment's own site-packages, so the wheel's copy wins.
# Without pip: a venv's own pip and setuptools (the interpreter's bundled, older releases) would shadow the newer
# ones torch requires (setuptools>=77) and fail its resolution; $PYTHON's pip installs into the venv (--python).
"$PYTHON" -m venv --without-pip "$WORK/venv"
VPY="$WORK/venv/bin/python"
VPIP=("$PYTHON" -m pip --python "$VPY")
DEPS="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$DEPS" > "$SITE/zz_dependencies.pth"
"${VPIP[@]}" install --quiet --no-deps --no-index "$WHEEL"

# Beside a transformers and a TRL newer than any release (the requirements set no upper bound), installing the
# wheel resolves without downgrading them or changing anything else installed. Offline: the two newer releases
# are stand-ins (metadata only) offered from a local folder, every other requirement is met by what is installed.
"$PYTHON" - "$WORK/newer" <<'EOF'
import sys
import zipfile
from pathlib import Path

folder = Path(sys.argv[1])
folder.mkdir()
for name in ("transformers", "trl"):
    info = f"{name}-99.0.0.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 99.0.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: check_wheel.sh\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-99.0.0-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
EOF
# Only the stand-ins are offered: a find-links folder of the environment (PIP_FIND_LINKS) would add other releases.
env -u PIP_FIND_LINKS "${VPIP[@]}" install --quiet --dry-run --no-index --find-links "$WORK/newer" --report "$WORK/newer.json" \
    "$WHEEL[trl]" "transformers==99.0.0" "trl==99.0.0"
"$PYTHON" - "$WORK/newer.json" <<'EOF'
import json
import sys

report = json.load(open(sys.argv[1]))
planned = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in report["install"]}
planned.pop("hf-selective-backprop", None)  # the wheel itself, already installed above
assert planned == {"transformers": "99.0.0", "trl": "99.0.0"}, planned
print("the wheel installs beside transformers 99.0.0 and trl 99.0.0 without downgrading them")
EOF

cd "$WORK"
"$VPY" -c '
import sys, hf_selective_backprop
from importlib import metadata
assert hf_selective_backprop.__file__.startswith(sys.prefix), hf_selective_backprop.__file__
# One version string: the wheel'"'"'s metadata carries __version__.
assert metadata.version("hf-selective-backprop") == hf_selective_backprop.__version__
print("imports", hf_selective_backprop.__file__, "version", hf_selective_backprop.__version__)
'
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1 "$VPY" "$ROOT/scripts/train.py" \
    --dataset digits --model resnet18 --image_size 16 --max_train_samples 256 --max_eval_samples 64 \
    --per_device_train_batch_size 32 --num_train_epochs 1 --save_strategy no --disable_tqdm true \
    --use_cpu --output_dir "$WORK/run" 2>&1 | tail -n 1
"$VPY" - "$WORK" <<'EOF'
import json
import sys
from pathlib import Path

from huggingface_hub import ModelCard

run = Path(sys.argv[1], "run")
text = (run / "README.md").read_text()
card = ModelCard.load(run / "README.md")
assert "selective-backprop" in card.data.tags and "Strategy: `infobatch`" in text, text[:2000]  # the default
# The example record, and the card's section on it, from the installed package.
assert (run / "example_record.parquet").is_file() and "## Example record" in text, text[-3000:]
assert sys.argv[1] not in text, "a local path in the card"
stats = json.loads((run / "sb_stats.json").read_text())
assert f"| backward passes (examples) | {stats['backwards']:,} |" in text
print(f"card written from the installed template: {run / 'README.md'} ({stats['backwards']} backward passes)")
EOF
echo "wheel check passed"
