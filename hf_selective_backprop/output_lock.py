"""One run per output folder: a lock file that the scripts claim before they read any data.

The scripts refuse a folder that holds files, but two runs started at once both find it empty and would
write one folder (a checkpoint holding one run's weights and the other's ``trainer_state.json``). The first
to create the lock file (``O_EXCL``: atomic on a local or NFSv3+ file system) owns the folder until it
exits; the second is refused. A lock whose process is gone from this host, or that was left half written
long ago, is stale and taken over with a warning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time

from accelerate import PartialState

logger = logging.getLogger(__name__)

#: In the output folder while a run writes it. The leading underscore keeps it out of the Trainer's
#: ``push_to_hub`` uploads, which skip ``_*``.
LOCK_FILE = "_sb_run.lock"
#: A lock file this old that holds no owner is a leftover of a claim killed between create and write.
UNWRITTEN_LOCK_SECONDS = 10.0


@contextlib.contextmanager
def claimed(output_dir: str):
    """Hold ``output_dir`` for the duration (the main process claims it; the others rely on that)."""
    if not PartialState().is_main_process:
        yield
        return
    path = _claim(output_dir)
    try:
        yield
    finally:
        _release(path)


def _claim(output_dir: str) -> str:
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    for _ in range(3):
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if _live(holder, path):
                raise ValueError(_in_use(output_dir, holder, path)) from None
            logger.warning("--output_dir %r: taking over the lock of a run that is gone (%s)", output_dir, holder)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue
        with os.fdopen(descriptor, "w") as handle:
            json.dump(owner, handle)
        return path
    raise ValueError(_in_use(output_dir, _holder(path), path))


def _holder(path: str) -> dict | None:
    try:
        with open(path) as handle:
            holder = json.load(handle)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) and "pid" in holder else None


def _live(holder: dict | None, path: str) -> bool:
    if holder is None:  # being written now, or left unwritten by a kill
        try:
            return time.time() - os.path.getmtime(path) < UNWRITTEN_LOCK_SECONDS
        except FileNotFoundError:
            return False
    if holder.get("host") != socket.gethostname():
        return True  # another machine's process cannot be checked from here
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _in_use(output_dir: str, holder: dict | None, path: str) -> str:
    who = f"process {holder['pid']} on {holder.get('host')}" if holder else "a run that is starting"
    return (
        f"--output_dir {output_dir!r} is in use by another run ({who}): two runs would overwrite each other's "
        f"checkpoints. Wait for it to finish or choose another --output_dir (if no such run exists, delete {path})"
    )


def _release(path: str) -> None:
    holder = _holder(path)
    if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
