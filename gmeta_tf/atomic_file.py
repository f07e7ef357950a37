"""Writes that must survive a crash: the new file is written beside its destination,
fsynced and renamed over it (then its directory fsynced), so a reader finds the old file or
the new one, never a part of one. No TensorFlow here: the config and tuning code use it.

A directory (a dataset, a SavedModel) is staged the same way (``staging_dir``,
``replace_dir``): written under a hidden name beside its destination that holds the
writing process's id and host, then renamed into place, what it replaces set aside until
then. The next write into the same place clears what a killed one left (``tidy_staging``)
and puts back what it had set aside.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)


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
    parent is made if needed."""
    # made as the file system reads the path (not abspath's lexical link/..)
    os.makedirs(os.path.dirname(_joined(target)), exist_ok=True)
    target = physical_path(target)
    parent = os.path.dirname(target)
    path = tempfile.mkdtemp(
        prefix=f"{_staging_prefix(target)}{os.getpid()}@{socket.gethostname()}.", dir=parent)
    # mkdtemp makes it 0700; renamed into place it is read by others (a model server
    # running as another user): the mode a new directory gets under the process's umask
    umask = os.umask(0o022)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)
    return path


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


def tidy_staging(target: str | os.PathLike, what: str = "a write") -> None:
    """Clears what ``what`` (e.g. "an export") into ``target`` killed on this host left beside it: its
    staging directory, removed, and the directory it had set aside to replace (the same
    name ending ``.old``), put back when nothing took its place (the kill came between
    ``replace_dir``'s two renames: the write never finished, so the target is as it was
    before it) or removed when the new one is in place. A directory whose process still
    runs, or that another host made, is left (liveness is read by process id, so a
    container that shares this host name but not its process ids is taken as this host)."""
    target = physical_path(target)
    parent, prefix = os.path.dirname(target), _staging_prefix(target)
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    for name in sorted(names, key=lambda n: not n.endswith(".old")):  # put back first
        owner = name[len(prefix):].removesuffix(".old")
        pid, at, host = owner.partition("@")
        if not (at and pid.isdigit() and host.rpartition(".")[0] == socket.gethostname()
                and not _running(int(pid))):
            continue
        path = os.path.join(parent, name)
        if name.endswith(".old") and not os.path.lexists(target):
            try:
                os.replace(path, target)
            except FileNotFoundError:  # another write put it back first
                continue
            fsync_dir(parent)
            log.warning("put back %s: %s killed while replacing it (process %s) had set "
                        "it aside as %s", target, what, pid, name)
        else:
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
