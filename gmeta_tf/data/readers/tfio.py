"""tensorflow-io readers, kept for remote file systems and for side-by-side benchmarks.

``TfioIOTensorReader`` reads Parquet column by column in ``CHUNK_ROWS`` slices (the fast,
sound way to use tensorflow-io). ``TfioDatasetReader`` uses ``IODataset`` (one row at a time,
slow); its ORC path runs in a child process because tensorflow-io's ORC reader crashes the
process on files above ~1,000 rows (tensorflow/io#1782): a crash there ends the child only
and surfaces here as ``ReaderCrashed``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from gmeta_tf.data.errors import DAMAGED, DataError, one_line
from gmeta_tf.data.readers.base import CHUNK_ROWS, Chunk, ColumnReader, ReaderCrashed


def _tfio() -> Any:
    import tensorflow_io as tfio

    return tfio


class TfioIOTensorReader(ColumnReader):
    """``tfio.IOTensor.from_parquet``, sliced per column in ``CHUNK_ROWS``-row ranges."""

    name = "tfio_iotensor"
    formats = ("parquet",)

    def __init__(self, file_format: str) -> None:
        super().__init__(file_format)
        self._tensors: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _iotensor(self, path: str) -> Any:
        with self._lock:
            if path not in self._tensors:
                self._tensors[path] = _tfio().IOTensor.from_parquet(path)
            return self._tensors[path]

    def read(self, path: str, start: int, stop: int, columns: list[str]) -> Iterator[Chunk]:
        try:
            io = self._iotensor(path)
            for lo in range(start, stop, CHUNK_ROWS):
                hi = min(lo + CHUNK_ROWS, stop)
                yield {c: io(c)[lo:hi].numpy() for c in columns}
        except Exception as e:  # tensorflow-io raises assorted TF and Python errors
            if isinstance(e, DataError):
                raise
            raise DataError(f"tensorflow-io IOTensor cannot read rows {start}..{stop}: {one_line(e)}{DAMAGED}",
                            file=path) from e

    def close(self) -> None:
        self._tensors.clear()


class _Cursor:
    """Where an open IODataset iterator of one file stands, with rows read ahead of it."""

    def __init__(self, path: str, start: int, columns: list[str]) -> None:
        ds = _tfio().IODataset.from_parquet(path, columns=columns)
        self.batches = iter(ds.skip(start).batch(CHUNK_ROWS))
        self.position, self.columns = start, columns
        self.buffer: Chunk = {c: np.zeros(0) for c in columns}

    def take(self, n: int) -> Chunk:
        while len(self.buffer[self.columns[0]]) < n:
            batch = next(self.batches)
            self.buffer = {c: np.concatenate([self.buffer[c], batch[c].numpy()]) for c in self.columns}
        out = {c: v[:n] for c, v in self.buffer.items()}
        self.buffer = {c: v[n:] for c, v in self.buffer.items()}
        self.position += n
        return out


class TfioDatasetReader(ColumnReader):
    """``tfio.IODataset.from_parquet`` in process; ``from_orc`` in a guarded child process.

    IODataset can only skip by reading, so a cursor per file continues where the previous
    block ended: reading blocks in file order is linear, a jump costs a re-read.
    """

    name = "tfio_dataset"
    formats = ("parquet", "orc")

    def __init__(self, file_format: str) -> None:
        super().__init__(file_format)
        self._cursors: dict[str, _Cursor] = {}
        self._lock = threading.Lock()

    def read(self, path: str, start: int, stop: int, columns: list[str]) -> Iterator[Chunk]:
        if self.file_format == "orc":
            yield from _read_orc_in_child(path, start, stop, columns)
            return
        try:
            with self._lock:
                cursor = self._cursors.get(path)
                if cursor is None or cursor.position != start or cursor.columns != columns:
                    cursor = self._cursors[path] = _Cursor(path, start, columns)
                chunk = cursor.take(stop - start)
            yield chunk
        except Exception as e:
            raise DataError(f"tensorflow-io IODataset cannot read rows {start}..{stop}: {one_line(e)}{DAMAGED}",
                            file=path) from e

    def close(self) -> None:
        self._cursors.clear()


def _read_orc_in_child(path: str, start: int, stop: int, columns: list[str]) -> Iterator[Chunk]:
    """Runs ``tfio.IODataset.from_orc`` in a child; streams its chunks back as Arrow IPC."""
    cmd = [sys.executable, "-m", "gmeta_tf.data.readers.tfio_orc_child", path, str(start),
           str(stop), ",".join(columns)]
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        with pa.ipc.open_stream(proc.stdout) as stream:
            for batch in stream:
                yield {c: batch.column(c).to_numpy(zero_copy_only=False) for c in columns}
    except pa.ArrowInvalid:
        pass  # the child died before or while writing: reported below
    finally:
        proc.stdout.close()
        stderr = proc.stderr.read().decode(errors="replace")
        code = proc.wait()
    if code != 0:
        raise ReaderCrashed(
            f"tensorflow-io ORC reader (tensorflow/io#1782) died in its child process "
            f"({_describe_exit(code, stderr)}); the training process is unharmed; use reader='arrow'",
            file=path)


def _describe_exit(code: int, stderr: str) -> str:
    """"SIGSEGV" / "exit code 1", plus the child's most telling stderr line."""
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    lines = [ln.strip() for ln in stderr.splitlines()]
    telling = [ln for ln in lines if any(w in ln for w in ("malloc", "free()", "corrupt", "Error",
                                                             "error", "Fatal", "Segmentation"))]
    last = (telling or [""])[-1]
    return f"{how}: {last[:200]}" if last else how


def _child_main(argv: list[str]) -> None:
    """Entry point of the guarded child: read with tensorflow-io, write Arrow IPC to stdout."""
    import tensorflow as tf

    path, start, stop, columns = argv[0], int(argv[1]), int(argv[2]), argv[3].split(",")
    ds = _tfio().IODataset.from_orc(path, columns=columns, capacity=CHUNK_ROWS)
    writer = None
    for batch in ds.skip(start).take(stop - start).batch(CHUNK_ROWS):
        arrays = [pa.array(np.asarray(batch[c].numpy())) for c in columns]
        rb = pa.RecordBatch.from_arrays(arrays, columns)
        writer = writer or pa.ipc.new_stream(sys.stdout.buffer, rb.schema)
        writer.write_batch(rb)
    if writer:
        writer.close()
    del tf
