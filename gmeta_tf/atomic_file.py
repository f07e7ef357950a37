"""Writes that must survive a crash: the new file is written beside its destination,
fsynced and renamed over it (then its directory fsynced), so a reader finds the old file or
the new one, never a part of one. No TensorFlow here: the config and tuning code use it.

A directory (a dataset, a SavedModel) is staged the same way (``staging_dir``,
``replace_dir``): written under a hidden name beside its destination that holds the
writing process's id and host, then renamed into place, what it replaces set aside until
then. The writer holds a lock (``flock``) on a file of the same name ending ``.lock``
until it is done (``release_staging``); the kernel lets it go when the writer dies, however
it dies. The next write into the same place clears what a killed one left
(``tidy_staging``) and puts back what it had set aside.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

_LOCK_SUFFIX = ".lock"
_held_locks: dict[str, int] = {}  # staging directory -> the descriptor holding its lock


def fsync_dir(path: str | os.PathLike) -> None:
    """Makes a directory's entries (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsyncs every file and directory under ``root`` (a staged directory, before it is
    renamed into place and what it replaces is let go)."""
    for directory, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(directory)


def write_atomically(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Calls ``write(tmp_path)``, fsyncs the file and renames it to ``path``; a failed write
    leaves ``path`` as it was and removes the temporary file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """``write_atomically`` of a text file."""
    write_atomically(path, lambda tmp: tmp.write_text(text))


def physical_path(target: str | os.PathLike) -> str:
    """``target`` made absolute with its directory resolved as the file system resolves it
    (a link followed before a ``..`` after it), where a rename into ``target`` lands: not
    ``os.path.abspath``'s lexical reading of ``link/..``. A trailing separator is dropped
    (``out/`` is ``out``)."""
    target = _joined(target)
    return os.path.join(os.path.realpath(os.path.dirname(target)), os.path.basename(target))


def _joined(target: str | os.PathLike) -> str:
    """``target`` joined to the working directory, unresolved, without a trailing
    separator."""
    return os.path.join(os.getcwd(), os.fspath(target)).rstrip(os.sep) or os.sep


def _staging_prefix(target: str) -> str:
    return f".{os.path.basename(target)}.tmp-"


def staging_dir(target: str | os.PathLike) -> str:
    """A new, empty hidden directory beside ``target``
    (``.<name>.tmp-<pid>@<host>.<random>``) to write it in before ``replace_dir``; the
    parent is made if needed. Its lock file, ``<staging>.lock``, is made and locked before
    the directory, and held until ``release_staging``: no ``tidy_staging`` takes it for a
    killed write meanwhile (on a file system without locks, none is made and its process id
    tells)."""
    # made as the file system reads the path (not abspath's lexical link/..)
    os.makedirs(os.path.dirname(_joined(target)), exist_ok=True)
    target = physical_path(target)
    prefix = os.path.join(os.path.dirname(target), f"{_staging_prefix(target)}{os.getpid()}@"
                                                   f"{socket.gethostname()}.")
    for _ in range(100):
        path = prefix + secrets.token_hex(4)
        try:
            fd = os.open(path + _LOCK_SUFFIX,
                         os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:  # a file system without locks: the process id tells
                os.close(fd)
                fd = -1
                os.unlink(path + _LOCK_SUFFIX)
                log.debug("no lock beside %s (%s): its process id says whether it runs",
                          path, e)
            # read by others once in place (a model server running as another user): the
            # mode a new directory gets under the process's umask
            os.mkdir(path)
        except BaseException as e:
            if fd >= 0:
                os.unlink(path + _LOCK_SUFFIX)
                os.close(fd)
            if isinstance(e, FileExistsError):  # a name left by an older scheme
                continue
            raise
        if fd >= 0:
            _held_locks[path] = fd
        return path
    raise FileExistsError(f"no free staging name beside {target} after 100 tries")


def release_staging(staging: str | os.PathLike) -> None:
    """Ends a staged write, done or given up: removes ``staging`` if it is still there (not
    moved into place), then its lock file, and lets the lock go."""
    staging = os.fspath(staging)
    shutil.rmtree(staging, ignore_errors=True)
    fd = _held_locks.pop(staging, None)
    if fd is None:
        return
    try:
        os.unlink(staging + _LOCK_SUFFIX)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def replace_dir(staging: str | os.PathLike, target: str | os.PathLike,
                check: Callable[[str], None] | None = None) -> None:
    """Moves a complete, fsynced ``staging`` directory (``staging_dir``) to ``target``. A
    directory already there is first ``check``ed (that it may be replaced), set aside as
    ``<staging>.old``, and removed only once the new one is in its place; if the move
    fails it is put back. A kill between the two renames leaves it set aside, for the
    next ``tidy_staging`` to put back."""
    staging, target = os.fspath(staging), os.fspath(target)
    old = None
    if os.path.lexists(target):
        if check is not None:
            check(target)
        old = staging + ".old"
        os.replace(target, old)
    try:
        os.replace(staging, target)
    except OSError:
        if old is not None:
            os.replace(old, target)
        raise
    fsync_dir(os.path.dirname(physical_path(target)))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    release_staging(staging)


def tidy_staging(target: str | os.PathLike, what: str = "a write") -> None:
    """Clears what ``what`` (e.g. "an export") into ``target`` killed on this host left beside it: its
    staging directory, removed, and the directory it had set aside to replace (the same
    name ending ``.old``), put back when nothing took its place (the kill came between
    ``replace_dir``'s two renames: the write never finished, so the target is as it was
    before it) or removed when the new one is in place. A write is taken as killed when
    its lock file can be locked (and a lock file left alone, by a write killed after its
    move, is removed): its process, in whatever process-id namespace (another
    container of the same host name), holds the lock while it runs. A staging directory
    without a lock file (its write killed before it made one) is read by its process id.
    What another host made is left: a lock is not seen across every network file
    system."""
    target = physical_path(target)
    parent, prefix = os.path.dirname(target), _staging_prefix(target)
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    owners = {}
    for name in names:
        owner = name[len(prefix):].removesuffix(".old").removesuffix(_LOCK_SUFFIX)
        owners.setdefault(owner, []).append(name)
    for owner, owned in owners.items():
        pid, at, host = owner.partition("@")
        if not (at and pid.isdigit() and host.rpartition(".")[0] == socket.gethostname()):
            continue
        lock_path = os.path.join(parent, prefix + owner + _LOCK_SUFFIX)
        lock = _lock_of_gone_writer(lock_path, int(pid))
        if lock is None:
            continue
        try:
            # the set-aside first: put back before anything else is removed
            for name in sorted(owned, key=lambda n: not n.endswith(".old")):
                if not name.endswith(_LOCK_SUFFIX):
                    _tidy_one(os.path.join(parent, name), target, what, pid)
            if lock >= 0:  # held: the file is the killed write's, not a new one's
                os.unlink(lock_path)
        except FileNotFoundError:
            pass
        finally:
            if lock >= 0:
                os.close(lock)


def _lock_of_gone_writer(lock_path: str, pid: int) -> int | None:
    """The lock file's descriptor, locked, when the writer that made it is gone (-1: no
    lock file and no process of that id); None while it runs."""
    try:
        try:  # for writing where it may: NFS takes an exclusive flock as a write lock
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:  # another user's: a local file system locks it read-only
            fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None if _running(pid) else -1
    except OSError:  # unreadable: left
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held (or a file system without locks): taken as running
        os.close(fd)
        return None
    return fd


def _tidy_one(path: str, target: str, what: str, pid: str) -> None:
    if path.endswith(".old") and not os.path.lexists(target):
        try:
            os.replace(path, target)
        except FileNotFoundError:  # another write put it back first
            return
        fsync_dir(os.path.dirname(target))
        log.warning("put back %s: %s killed while replacing it (process %s) had set "
                    "it aside as %s", target, what, pid, os.path.basename(path))
    elif os.path.lexists(path):
        log.info("removing %s, left by %s into %s that was killed (process %s)",
                 path, what, target, pid)
        shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
