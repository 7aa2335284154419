"""Checkpoint files of the selection state, and how to tell a complete checkpoint from a torn one."""

from __future__ import annotations

import json
import os

import torch
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

#: Shared selection state (history, store, position in the epoch), written once per checkpoint.
STATE_FILE = "sb_state.pt"
#: Per-process state (generator, queue, counters, selector).
RANK_STATE_FILE = "sb_rank_state_{rank}.pt"


def atomic_save(obj, path: str) -> None:
    """torch.save through a temporary file, so ``path`` is never a truncated file."""
    partial_path = f"{path}.partial"
    torch.save(obj, partial_path)
    os.replace(partial_path, path)


def is_complete_checkpoint(folder: str) -> bool:
    """True if ``folder`` holds the selection state and a readable trainer_state.json (written last)."""
    state = os.path.join(folder, TRAINER_STATE_NAME)
    if not (os.path.isfile(os.path.join(folder, STATE_FILE)) and os.path.isfile(state)):
        return False
    try:
        with open(state) as handle:
            json.load(handle)
    except (OSError, ValueError):
        return False
    return True


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The highest-step ``checkpoint-N`` folder of ``output_dir`` that is complete, or None."""
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        prefix, _, step = name.rpartition("-")
        if prefix == PREFIX_CHECKPOINT_DIR and step.isdigit():
            if is_complete_checkpoint(os.path.join(output_dir, name)):
                steps.append(int(step))
    return os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{max(steps)}") if steps else None


def require_complete_checkpoint(output_dir: str) -> str:
    """`last_complete_checkpoint`, or a ValueError saying what a complete checkpoint holds."""
    checkpoint = last_complete_checkpoint(output_dir)
    if checkpoint is None:
        raise ValueError(f"No complete checkpoint (with {TRAINER_STATE_NAME} and {STATE_FILE}) in {output_dir}")
    return checkpoint
