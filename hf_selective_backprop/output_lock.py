"""One run per output folder: a lock file that the scripts claim before they read any data.

The scripts refuse a folder that holds files, but two runs started at once both find it empty and would
write one folder (a checkpoint holding one run's weights and the other's ``trainer_state.json``). A run owns
the folder while it holds an exclusive ``flock`` on the lock file, kept open for the run's life: the kernel
grants it to one process only and releases it when that process dies, so taking over a killed run's lock
deletes nothing and leaves no window in which two processes both find it free (deleting a stale lock and
creating another did: two processes that both read the stale lock could both own the folder). The file holds
the owner's host and pid for the messages. A free lock naming another host (whose process cannot be checked,
nor its ``flock`` on every file system), or a live process of this host and no ``flock`` (a run of an older
version), is still refused; one naming a process gone from this host is taken over with a warning. Anything
else at the lock's path (a symbolic link, which would lead the lock's writes out of the folder; a FIFO, whose read
would wait for good; a directory) is refused and left as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import stat
import time

from accelerate import PartialState

from .engine import distributed

logger = logging.getLogger(__name__)

#: In the output folder while a run writes it. The leading underscore keeps it out of the Trainer's
#: ``push_to_hub`` uploads, which skip ``_*``.
LOCK_FILE = "_sb_run.lock"


@contextlib.contextmanager
def claimed(output_dir: str):
    """Hold ``output_dir`` for the duration (the main process claims it; the others rely on that, and raise its
    refusal with it: on their own they would go on and wait in their first collective until its timeout)."""
    state = PartialState()
    lock = refusal = None
    if state.is_main_process:
        try:
            lock = _claim(output_dir)
        except (ValueError, OSError) as error:
            refusal = error
    distributed.fail_together(state, refusal)
    try:
        yield
    finally:
        if lock is not None:
            _release(lock)


def _claim(output_dir: str) -> tuple[str, int]:
    """The lock file's path and the descriptor holding its ``flock``; refused if another run holds it."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    while True:
        descriptor = _open_lock_file(output_dir, path)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(descriptor)
            os.close(descriptor)
            raise ValueError(_in_use(output_dir, holder, path)) from None
        if _same_file(descriptor, path):
            break
        # The owner this descriptor waited on has released the folder and deleted this file: claim the
        # one at the path now (or a newer claimant's) instead of an unlinked copy.
        os.close(descriptor)
    holder = _holder(descriptor)
    if holder is not None:
        if _live(holder):
            os.close(descriptor)
            raise ValueError(_in_use(output_dir, holder, path))
        logger.warning("--output_dir %r: taking over the lock of a run that is gone (%s)", output_dir, holder)
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "flock": True}
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(owner).encode(), 0)
    return path, descriptor


def _open_lock_file(output_dir: str, path: str) -> int:
    """A descriptor of the regular file at ``path``, created if need be; never through a symbolic link (which could
    lead out of the output folder) and without waiting on a FIFO."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as error:  # ELOOP: a symbolic link; EISDIR: a directory
        raise ValueError(_not_a_lock_file(output_dir, path)) from error
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ValueError(_not_a_lock_file(output_dir, path))
    return descriptor


def _not_a_lock_file(output_dir: str, path: str) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError as error:
        what = f"unusable ({error.strerror})"
    else:
        kinds = {stat.S_ISLNK: "a symbolic link", stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO",
                 stat.S_ISSOCK: "a socket"}
        what = next((kind for test, kind in kinds.items() if test(mode)), "a device or other special file")
    return (
        f"--output_dir {output_dir!r}: {path} is {what}, not the lock file a run keeps there (a regular file): "
        "delete it, or choose another --output_dir"
    )


def _same_file(descriptor: int, path: str) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _holder(descriptor: int) -> dict | None:
    """The owner the lock file names (read through its descriptor: the path is not opened again)."""
    try:
        holder = json.loads(os.pread(descriptor, 4096, 0))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) and "pid" in holder else None


def _live(holder: dict) -> bool:
    """Whether the run a lock file names may still run, its ``flock`` being free."""
    if holder.get("host") != socket.gethostname():
        return True  # another machine's process cannot be checked from here
    if holder.get("flock"):
        return False  # its owner held the flock until it ended, even if its pid has been reused since
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


def _release(lock: tuple[str, int]) -> None:
    # Deleted while still held: a process that opened this file meanwhile finds it unlinked once its
    # ``flock`` is granted, and claims the file at the path instead (_claim).
    path, descriptor = lock
    try:
        if _same_file(descriptor, path):
            os.remove(path)
    finally:
        os.close(descriptor)
