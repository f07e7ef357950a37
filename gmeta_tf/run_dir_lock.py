"""One writer per run directory: ``gmeta train`` and ``gmeta tune`` hold a lock on
``<run_dir>/.gmeta.lock`` while they run, so a second one on the same ``run_dir`` is
refused at once instead of writing checkpoints beside the first's (a ``--fresh`` run
would set the first run's checkpoints aside and delete them).

The lock is an ``flock`` taken by the command's own process (with ``--np N``, the one
that starts the ranks; the ranks take none), so the kernel lets it go when that process
ends, however it ends: a killed run leaves nothing to clean up. The lock file says who
holds it (command, process, host, start time), for the refusal to name. On a file system
without ``flock`` no lock is taken (a debug line says so). No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
from pathlib import Path
from typing import Iterator

from gmeta_tf.config import ConfigError

log = logging.getLogger(__name__)

LOCK_FILE = ".gmeta.lock"
_held: dict[str, int] = {}  # run directory -> the descriptor holding its lock


class RunDirBusy(ConfigError):
    """Another gmeta command is writing the run directory."""


def writable_dir(path: str | os.PathLike, named: str, what: str, instead: str) -> Path:
    """Checks, before any work is done whose results could not be kept, that files can be
    written in ``path`` (where it is missing, in the nearest folder above it that exists:
    nothing is made); returns it. Otherwise raises ``ConfigError``: ``named`` says what
    gave the path (``config key 'run_dir'``), ``what`` what is written there, ``instead``
    how to give another."""
    directory = Path(path)
    existing = directory.absolute()
    while not existing.is_dir() and existing != existing.parent:
        if existing.exists():  # a file where a folder must be
            raise ConfigError(f"{named}: {existing} is a file, not a directory; {what}, so "
                              f"nothing was started: give a directory ({instead})")
        existing = existing.parent
    probe = existing / f".gmeta-write-check.{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"{named}: {existing} is not writable ({err.strerror}); {what}, "
                          f"so nothing was started: give a writable directory "
                          f"({instead})") from None
    return directory


@contextlib.contextmanager
def run_dir_held(run_dir: str | os.PathLike, command: str) -> Iterator[None]:
    """Holds the run directory's lock while the block runs (``command``: what holds it,
    e.g. "gmeta train"); the directory is made if missing. A block inside another that
    holds the same directory's lock takes nothing more.

    Raises:
        RunDirBusy: another process holds it (its command, process and host named).
        ConfigError: the run directory cannot be written.
    """
    directory = writable_dir(run_dir, "config key 'run_dir'", f"{command} writes its "
                             f"checkpoints and results there", "--set run_dir=...")
    directory.mkdir(parents=True, exist_ok=True)
    key = str(directory.resolve())
    if key in _held:
        yield
        return
    path = directory / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirBusy(f"config key 'run_dir' = {str(run_dir)!r}: {_holder(path)} is "
                         f"writing it (its lock: {path}); two runs in one run_dir would "
                         f"overwrite each other's checkpoints. Wait for it to end, or give "
                         f"this run its own: --set run_dir=...") from None
    except OSError as err:  # a file system without flock: the run goes on unguarded
        os.close(fd)
        log.debug("no lock on %s (%s): a second run there is not refused", path, err)
        yield
        return
    holder = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
              "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    _held[key] = fd
    try:
        yield
    finally:
        del _held[key]
        os.close(fd)  # the lock goes with it (the file stays: removing it would race)


def _holder(path: Path) -> str:
    """Who holds the lock, as its file says."""
    try:
        holder = json.loads(path.read_text())
        return (f"'{holder['command']}' (process {holder['pid']} on {holder['host']}, since "
                f"{holder['since']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another gmeta command"
