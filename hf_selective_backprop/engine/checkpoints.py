"""Checkpoint files of the selection state, and how to tell a complete checkpoint from a torn one."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import struct
import zipfile

import torch
from transformers.trainer import OPTIMIZER_NAME, OPTIMIZER_NAME_BIN, TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

#: Shared selection state (history, store, position in the epoch), written once per checkpoint.
STATE_FILE = "sb_state.pt"
#: Per-process state (generator, queue, counters, selector).
RANK_STATE_FILE = "sb_rank_state_{rank}.pt"


def atomic_save(obj, path: str) -> None:
    """torch.save through a temporary file, so ``path`` is never a truncated file."""
    partial_path = f"{path}.partial"
    try:
        torch.save(obj, partial_path)
    except (OSError, RuntimeError) as error:
        # A full disk surfaces from torch's writer as "unexpected pos ..." without naming the file or the cause.
        with contextlib.suppress(OSError):
            os.remove(partial_path)
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        raise OSError(
            f"saving {path} failed ({type(error).__name__}: {error}); {free / 2**20:.1f} MiB are free on its disk: "
            "free space (or lower save_total_limit) and resume from the last complete checkpoint"
        ) from error
    os.replace(partial_path, path)


def unreadable_files(folder: str) -> list[str]:
    """The checkpoint files in ``folder`` that a resume could not load: truncated or garbage.

    Cheap checks, no tensor is loaded: a torch file (``.pt``, ``.pth``, ``.bin``: torch.save's zip format) needs
    its zip directory, which is written last; a ``.safetensors`` file needs a JSON header whose tensors end
    where the file does; trainer_state.json must parse.
    """
    bad = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if name.endswith((".pt", ".pth", ".bin")) and not _opens_as_zip(path):
            bad.append(name)
        elif name.endswith(".safetensors") and not _safetensors_whole(path):
            bad.append(name)
        elif name == TRAINER_STATE_NAME and not _json_whole(path):
            bad.append(name)
    return bad


def require_readable_model(path: str | None, flag: str = "--model_name_or_path") -> None:
    """Refuse a local model folder with a file ``from_pretrained`` could not read (weights cut short by a kill, a
    full disk or an interrupted copy, a truncated config.json or tokenizer.json), naming ``flag`` and the file:
    the loaders' own errors name neither. A Hub id, or a path that is not a folder, is left to them."""
    if path is None or not os.path.isdir(path):
        return
    bad = set(unreadable_files(path))
    bad.update(name for name in os.listdir(path)
               if name.endswith(".json") and os.path.isfile(os.path.join(path, name))
               and not _json_whole(os.path.join(path, name)))
    if bad:
        raise ValueError(
            f"{flag} {path!r}: {', '.join(sorted(bad))} cannot be read (truncated or damaged, e.g. by a kill, a full "
            "disk or an interrupted copy); pass a complete model folder"
        )


def _json_whole(path: str) -> bool:
    try:
        with open(path) as handle:
            json.load(handle)
    except (OSError, ValueError):
        return False
    return True


def _opens_as_zip(path: str) -> bool:
    try:
        with zipfile.ZipFile(path):
            return True
    except (OSError, zipfile.BadZipFile):
        return False


def _safetensors_whole(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            length = struct.unpack("<Q", handle.read(8))[0]
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return False
    if not isinstance(header, dict):
        return False
    ends = [entry["data_offsets"][1] for key, entry in header.items()
            if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    return os.path.getsize(path) == 8 + length + max(ends, default=0)


def is_complete_checkpoint(folder: str) -> bool:
    """True if ``folder`` holds the selection state and a readable trainer_state.json (written last), and no
    checkpoint file in it is truncated or garbage (`unreadable_files`)."""
    state = os.path.join(folder, TRAINER_STATE_NAME)
    if not (os.path.isfile(os.path.join(folder, STATE_FILE)) and os.path.isfile(state)):
        return False
    return not unreadable_files(folder)  # trainer_state.json included


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The highest-step ``checkpoint-N`` folder of ``output_dir`` that is complete, or None. A newer one that
    has the selection state and trainer_state.json but an unreadable file is passed over with a warning naming
    the file."""
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        prefix, _, step = name.rpartition("-")
        if prefix == PREFIX_CHECKPOINT_DIR and step.isdigit():
            steps.append(int(step))
    for step in sorted(steps, reverse=True):
        folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if is_complete_checkpoint(folder):
            return folder
        bad = unreadable_files(folder) if os.path.isfile(os.path.join(folder, TRAINER_STATE_NAME)) else []
        if bad:
            logger.warning("passing over %s: %s cannot be read (truncated or damaged)", folder, ", ".join(bad))
    return None


def require_resumable(checkpoint: str, flag: str = "resume_from_checkpoint") -> None:
    """Refuse a checkpoint a resume would fail on, or silently not continue, naming ``flag`` and the file: an
    unreadable file, or a ``save_only_model`` checkpoint (no optimizer state to continue from)."""
    if not os.path.isdir(checkpoint):
        return  # the Trainer's own error names a path that is not there
    bad = unreadable_files(checkpoint)
    if bad:
        raise ValueError(
            f"{flag} {checkpoint!r}: {', '.join(bad)} cannot be read (truncated or damaged, e.g. by a kill or a full "
            "disk during the save); pass an earlier checkpoint, or True for the last complete one"
        )
    entries = os.listdir(checkpoint)
    # DeepSpeed and FSDP keep the optimizer in subfolders of their own (global_stepN/, optimizer_0/).
    sharded = any(os.path.isdir(os.path.join(checkpoint, name)) for name in entries)
    if not sharded and not {OPTIMIZER_NAME, OPTIMIZER_NAME_BIN} & set(entries):
        # The scripts' flags on the command line, the Python API's arguments otherwise.
        if flag.startswith("--"):
            setting, new_run = "--save_only_model", f"--model_name_or_path {checkpoint} and no {flag}"
        else:
            setting = "save_only_model=True"
            new_run = f"the model loaded with from_pretrained({checkpoint!r}) and no {flag}"
        raise ValueError(
            f"{flag} {checkpoint!r} has no {OPTIMIZER_NAME}: it was saved with {setting}, and a resume would "
            "continue with a fresh optimizer and learning-rate schedule. Start a new run from its weights instead "
            f"({new_run}), or resume from a checkpoint saved without {setting}"
        )


def require_complete_checkpoint(output_dir: str) -> str:
    """`last_complete_checkpoint`, or a ValueError saying what a complete checkpoint holds."""
    checkpoint = last_complete_checkpoint(output_dir)
    if checkpoint is None:
        # The Trainer's own words first: code that matches on them keeps working.
        raise ValueError(
            f"No valid checkpoint found in output directory ({output_dir}): no checkpoint-N folder there holds a "
            f"readable {TRAINER_STATE_NAME} and {STATE_FILE}"
        )
    return checkpoint
