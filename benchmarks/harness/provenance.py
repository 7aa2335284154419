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


#: Result folders are left out of "clean tree": a benchmark rewrites its own report and plots after
#: every run, which must not mark the next run of the same command as made from modified code.
RESULTS_PATHSPEC = ":(exclude,glob)**/benchmarks/results/**"


def provenance() -> dict:
    """The commit the run is at, whether the code had uncommitted changes, the command and versions."""
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", RESULTS_PATHSPEC)
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
