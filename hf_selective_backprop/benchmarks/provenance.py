"""What a result file records about where it came from: commit, clean tree, command, library versions."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

LIBRARIES = ("hf-selective-backprop", "torch", "transformers", "accelerate", "datasets", "timm")


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(("git", *args), capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def provenance() -> dict:
    """The commit the run is at, whether the tree had uncommitted changes, the command and versions."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "commit": _git("rev-parse", "HEAD"),
        "clean_tree": None if status is None else status == "",
        "command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "versions": versions,
    }
