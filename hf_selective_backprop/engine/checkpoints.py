"""Checkpoint files of the selection state, and how to tell a complete checkpoint from a torn one."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
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
_RANK_STATE = re.compile(r"sb_rank_state_\d+\.pt")


@contextlib.contextmanager
def written_in_place_of(path: str):
    """A new temporary file beside ``path`` to write, then moved over it (os.replace): a link at ``path`` is replaced,
    never followed (it may point at a user's file outside the folder), and a failed write leaves ``path`` as it
    was. The temporary (``.{name}.{random}.partial``) is created afresh, so no link can wait there either."""
    partial_path = _fresh_temporary(path)
    try:
        yield partial_path
        os.replace(partial_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial_path)
        raise


def _fresh_temporary(path: str) -> str:
    folder, name = os.path.split(os.path.abspath(path))
    for _ in range(100):
        candidate = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.partial")
        try:
            # O_EXCL: never an existing file or link; mode 0o666 under the umask, as open() gives (mkstemp's 0o600
            # would leave a checkpoint or record only its owner can read).
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"no fresh temporary name for {path} in {folder}")


def partial_target(name: str) -> str | None:
    """The file a temporary of `written_in_place_of` named ``name`` stands in for; None for any other name."""
    if not (name.startswith(".") and name.endswith(".partial")):
        return None
    target, _, _ = name[1 : -len(".partial")].rpartition(".")  # the random part holds no dot
    return target or None


def atomic_save(obj, path: str) -> None:
    """torch.save through `written_in_place_of`, so ``path`` is never a truncated file nor a followed link."""
    try:
        with written_in_place_of(path) as partial_path, open(partial_path, "wb") as handle:
            # Through a Python file object: torch's writer reports a failed write (a full disk) as "unexpected pos
            # ...", naming neither the file nor the cause, and only the write's own OSError, left as its context,
            # says why.
            torch.save(obj, handle)
    except (OSError, RuntimeError) as error:
        cause = _os_error(error)
        why = os.strerror(cause.errno).lower() if cause is not None else f"{type(error).__name__}: {error}"
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        raise OSError(
            f"saving {path} failed ({why}); {free / 2**20:.1f} MiB are free on its disk: free space (or lower "
            "save_total_limit) and resume from the last complete checkpoint"
        ) from error


def _os_error(error: BaseException) -> OSError | None:
    """The first OSError with an errno in ``error``'s chain (itself, its cause or its context)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno is not None:
            return error
        error = error.__cause__ or error.__context__
    return None


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
            if length > os.path.getsize(path) - 8:  # garbage: reading that much would exhaust the memory
                return False
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return False
    if not isinstance(header, dict):
        return False
    ends = [entry["data_offsets"][1] for key, entry in header.items()
            if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    return os.path.getsize(path) == 8 + length + max(ends, default=0)


def missing_selection_state(folder: str) -> list[str]:
    """The selection state files that ``folder``, a checkpoint holding some, lacks: sb_state.pt beside a process's
    sb_rank_state_{r}.pt, or the sb_rank_state_{r}.pt of a process that saved sb_state.pt. A checkpoint without
    any (a run without selection's) lacks none; nor does one whose sb_state.pt cannot be read (`unreadable_files`
    names it)."""
    names = set(os.listdir(folder))
    if STATE_FILE not in names:
        return [STATE_FILE] if any(_RANK_STATE.fullmatch(name) for name in names) else []
    try:
        # mmap: the store's tensors are not read, only the few values beside them.
        world_size = torch.load(os.path.join(folder, STATE_FILE), weights_only=True, mmap=True)["world_size"]
    except Exception:  # whatever the damage, unreadable_files reports the file
        return []
    return [RANK_STATE_FILE.format(rank=rank) for rank in range(world_size)
            if RANK_STATE_FILE.format(rank=rank) not in names]


def damage(folder: str) -> str | None:
    """Why ``folder`` holds selection state that a resume cannot restore (`missing_selection_state`); None if
    it can, or holds none."""
    missing = missing_selection_state(folder)
    if not missing:
        return None
    if missing == [STATE_FILE]:
        ranks = sorted(name for name in os.listdir(folder) if _RANK_STATE.fullmatch(name))
        return (f"it holds {', '.join(ranks)}, the selection state of a run with selection, but lacks {STATE_FILE}: "
                "it is damaged (a run without selection would not continue it)")
    return f"it lacks {', '.join(missing)} (each process that saved it writes its own): it is damaged"


def require_intact_selection_state(checkpoint: str, flag: str = "resume_from_checkpoint") -> None:
    """Refuse a checkpoint with selection state that is missing a file (`damage`), naming ``flag``: with selection
    the queues and generators could not be restored, and without it the run would silently lose its selection."""
    why = damage(checkpoint) if os.path.isdir(checkpoint) else None
    if why is not None:
        raise ValueError(f"{flag} {checkpoint!r}: {why}; pass an earlier checkpoint, or True for the last complete one")


def is_complete_checkpoint(folder: str) -> bool:
    """True if ``folder`` holds the selection state, every file of it (`missing_selection_state`), and a readable
    trainer_state.json (written last), and no checkpoint file in it is truncated or garbage (`unreadable_files`)."""
    return _incomplete(folder) is None


def _incomplete(folder: str) -> str | None:
    """What makes ``folder`` no complete checkpoint of a run with selection, in words; None if it is one."""
    if not os.path.isdir(folder):
        return "it is not a folder"
    missing = [name for name in (TRAINER_STATE_NAME, STATE_FILE) if not os.path.isfile(os.path.join(folder, name))]
    missing += [name for name in missing_selection_state(folder) if name not in missing]
    problems = [f"it lacks {', '.join(missing)}"] if missing else []
    bad = unreadable_files(folder)  # trainer_state.json included
    if bad:
        problems.append(f"{', '.join(bad)} cannot be read (truncated or damaged)")
    return "; ".join(problems) or None


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The highest-step ``checkpoint-N`` folder of ``output_dir`` that is complete, or None. Each newer one is
    passed over with a warning naming what it lacks, or the file that cannot be read."""
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        prefix, _, step = name.rpartition("-")
        if prefix == PREFIX_CHECKPOINT_DIR and step.isdigit():
            steps.append(int(step))
    for step in sorted(steps, reverse=True):
        folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if not os.path.isdir(folder):
            continue
        why = _incomplete(folder)
        if why is None:
            return folder
        logger.warning("passing over %s: %s", folder, why)
    return None


def require_resumable(checkpoint: str, flag: str = "resume_from_checkpoint") -> None:
    """Refuse a checkpoint a resume would fail on, or silently not continue, naming ``flag`` and the file: selection
    state missing a file (`require_intact_selection_state`), an unreadable file, or a ``save_only_model`` checkpoint
    (no optimizer state to continue from)."""
    if not os.path.isdir(checkpoint):
        return  # the Trainer's own error names a path that is not there
    require_intact_selection_state(checkpoint, flag)
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
