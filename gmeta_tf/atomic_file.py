"""Writes that must survive a crash: the new file is written beside its destination,
fsynced and renamed over it (then its directory fsynced), so a reader finds the old file or
the new one, never a part of one. No TensorFlow here: the config and tuning code use it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


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
