"""Atomic file writes, and one process at a time in a folder.

Every writer goes through a temporary file in the same directory followed by ``os.replace``, which
is atomic on POSIX and Windows file systems: a crash never leaves a half-written file where a complete
one was expected. :func:`exclusive_lock` lets two jobs of a sweep that need the same output (a training
run, a stimulus set) make it once: the second waits and then reuses it. Used by checkpoints, run
directories and stimulus sets.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, one process per output folder is up to the user
    fcntl = None

LOCK_WAIT_LOG_S = 600  # while waiting for another process, say so again this often

logger = logging.getLogger(__name__)


class LockBusyError(RuntimeError):
    """Another process holds the lock (``holder``: what its lock file says: pid, host and since when)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


@contextlib.contextmanager
def exclusive_lock(lock_file: str | os.PathLike, *, what: str, activity: str, wait: bool = True, poll_s: float = 2.0) -> Iterator[None]:
    """Hold ``lock_file`` (``flock``) for this process: released when the process ends, however it ends, so a killed
    job never leaves a stale lock. While another process holds it, wait (logging "``what`` is ``activity`` by another
    process (holder): waiting for it" every :data:`LOCK_WAIT_LOG_S`) or, with ``wait=False``, raise
    :class:`LockBusyError`. Advisory, like every ``flock``: on a shared file system it holds across nodes where the
    file system supports ``flock`` (NFSv4, Lustre and GPFS with their lock options)."""
    # A plain flock, not the filelock package: the lock file itself names its holder for the waiting message.
    if fcntl is None:
        yield
        return
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+", encoding="utf-8") as handle:
        waited_since = last_log = None
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "holder unknown"
                if not wait:
                    raise LockBusyError(holder) from None
                now = time.monotonic()
                if last_log is None or now - last_log >= LOCK_WAIT_LOG_S:
                    waited = "" if waited_since is None else f" (waiting {(now - waited_since) / 60:.0f} min)"
                    logger.warning("%s is %s by another process (%s): waiting for it%s", what, activity, holder, waited)
                    waited_since, last_log = waited_since or now, now
                time.sleep(poll_s)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp makes 0600 files, and some writers (safetensors) replace the file they are given: published
        # files follow the umask, set once the writer is done.
        os.chmod(tmp_path, 0o666 & ~_umask())
        with open(tmp_path, "rb+") as f:  # make the bytes durable before the rename
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty staging directory beside ``path``; on success it takes ``path``'s place (a directory that was
    there is moved aside first and deleted only after the swap), with the umask's mode rather than mkdtemp's 0700.
    On an error the staging directory goes and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield staging
        os.chmod(staging, 0o777 & ~_umask())
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / path.name)
        os.replace(staging, path)
        if old is not None:
            shutil.rmtree(old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def exit_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, ``kill``, Slurm's ``scancel`` and time limit) end the process through Python's cleanup,
    as Ctrl-C does: ``finally`` blocks and context managers run, so staging folders (:func:`atomic_directory`) and
    temporary files go with it; Python's default for SIGTERM leaves them behind. The exit status stays 143 (128 +
    SIGTERM). Installed by the command-line entry points, from the main thread only, and only where SIGTERM has no
    handler yet (a launcher's own stays)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_for_signal)


def _exit_for_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=_json_default) + "\n")


def atomic_save(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` (e.g. ``torch.save`` or ``safetensors.torch.save_file``), then publish."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line; each line is written with one ``write`` call and flushed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _json_default(obj: Any) -> Any:
    """Serialise numpy / torch scalars and arrays, and paths."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")
