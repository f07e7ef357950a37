"""Paths for Meta-IO: local files natively, anything else (s3://, hdfs://, gs://) via tf.io.gfile.

Local paths go straight to the OS (fastest for pyarrow); a URI with a scheme goes through
TensorFlow's file systems, which tensorflow-io extends with s3:// and hdfs:// on import.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO


def is_remote(path: str) -> bool:
    """True for a URI with a scheme (``s3://bucket/x``), False for a local path."""
    return "://" in path and not path.startswith("file://")


def local(path: str) -> str:
    """Strips a ``file://`` prefix."""
    return path[len("file://"):] if path.startswith("file://") else path


def _gfile():
    import tensorflow as tf
    import tensorflow_io  # noqa: F401  (registers s3://, hdfs:// ... with tf.io.gfile)

    return tf.io.gfile


def join(base: str, *parts: str) -> str:
    """Joins path parts with '/', for local paths and URIs alike."""
    return "/".join([base.rstrip("/"), *parts]) if is_remote(base) else os.path.join(local(base), *parts)


def exists(path: str) -> bool:
    return _gfile().exists(path) if is_remote(path) else os.path.exists(local(path))


def size(path: str) -> int:
    return _gfile().stat(path).length if is_remote(path) else os.path.getsize(local(path))


def open_binary(path: str) -> BinaryIO:
    """Opens a file for binary reading, local or remote (pyarrow accepts either object)."""
    if is_remote(path):
        return io.BufferedReader(_GFileRaw(_gfile().GFile(path, "rb")))
    return open(local(path), "rb")


class _GFileRaw(io.RawIOBase):
    """A ``tf.io.gfile.GFile`` as a standard raw binary stream: pyarrow needs the file
    protocol (``closed``, ``readinto``, ``seek`` returning the position) GFile lacks."""

    def __init__(self, gfile) -> None:
        super().__init__()
        self._file = gfile

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self._file.read(len(buffer))
        buffer[:len(chunk)] = chunk
        return len(chunk)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._file.seek(offset, whence)
        return self._file.tell()

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()
