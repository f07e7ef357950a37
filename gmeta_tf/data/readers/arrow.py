"""pyarrow reader: Parquet by row group (a block of whole tasks), ORC by stripe."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq

from gmeta_tf.data import filesystem as fs
from gmeta_tf.data.errors import DAMAGED, DataError, one_line
from gmeta_tf.data.readers.base import CHUNK_ROWS, Chunk, ColumnReader
from gmeta_tf.data.schema import TASK_COLUMN


def _to_chunk(batch: pa.RecordBatch, columns: list[str]) -> Chunk:
    return {c: batch.column(c).to_numpy(zero_copy_only=False) for c in columns}


class ArrowReader(ColumnReader):
    """Reads with pyarrow; remote paths (s3://, hdfs://) through tf.io.gfile file objects."""

    name = "arrow"
    formats = ("parquet", "orc")

    def __init__(self, file_format: str) -> None:
        super().__init__(file_format)
        self._lock = threading.Lock()
        self._stripe_starts: dict[str, np.ndarray] = {}
        self._last_stripe: dict[str, tuple[tuple, pa.RecordBatch]] = {}

    def read(self, path: str, start: int, stop: int, columns: list[str]) -> Iterator[Chunk]:
        try:
            if self.file_format == "parquet":
                yield from self._read_parquet(path, start, stop, columns)
            else:
                yield from self._read_orc(path, start, stop, columns)
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"cannot read rows {start}..{stop}: {one_line(e)}{DAMAGED}", file=path) from e

    def close(self) -> None:
        self._last_stripe.clear()

    def _open(self, path: str) -> Any:
        return fs.local(path) if not fs.is_remote(path) else fs.open_binary(path)

    def _read_parquet(self, path: str, start: int, stop: int, columns: list[str]) -> Iterator[Chunk]:
        pf = pq.ParquetFile(self._open(path))
        sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        first = int(np.searchsorted(bounds, start, side="right") - 1)
        last = int(np.searchsorted(bounds, stop, side="left"))
        offset = int(bounds[first])
        for batch in pf.iter_batches(batch_size=CHUNK_ROWS, row_groups=range(first, last),
                                     columns=columns, use_threads=False):
            lo, hi = max(start - offset, 0), min(stop - offset, batch.num_rows)
            offset += batch.num_rows
            if hi > lo:
                yield _to_chunk(batch.slice(lo, hi - lo), columns)

    def _stripes(self, path: str, f: orc.ORCFile) -> np.ndarray:
        """Row offset of every stripe (ORC does not expose it; read the task column once)."""
        with self._lock:
            if path not in self._stripe_starts:
                rows = [f.read_stripe(i, columns=[TASK_COLUMN]).num_rows for i in range(f.nstripes)]
                self._stripe_starts[path] = np.concatenate([[0], np.cumsum(rows)])
            return self._stripe_starts[path]

    def _stripe(self, path: str, f: orc.ORCFile, index: int, columns: list[str]) -> pa.RecordBatch:
        """A decoded stripe; the last one of each file is kept, as consecutive blocks share it."""
        key = (index, tuple(columns))
        with self._lock:
            cached = self._last_stripe.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        stripe = f.read_stripe(index, columns=columns)
        with self._lock:
            self._last_stripe[path] = (key, stripe)
        return stripe

    def _read_orc(self, path: str, start: int, stop: int, columns: list[str]) -> Iterator[Chunk]:
        f = orc.ORCFile(self._open(path))
        bounds = self._stripes(path, f)
        first = int(np.searchsorted(bounds, start, side="right") - 1)
        last = int(np.searchsorted(bounds, stop, side="left"))
        for i in range(first, last):
            stripe = self._stripe(path, f, i, columns)
            offset = int(bounds[i])
            lo, hi = max(start - offset, 0), min(stop - offset, stripe.num_rows)
            if hi > lo:
                yield _to_chunk(stripe.slice(lo, hi - lo), columns)
