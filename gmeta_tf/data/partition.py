"""Out-of-core group-by-task: spill rows into hash buckets on disk, then read back one bucket
at a time. Every task lands whole in exactly one bucket, so a converter holds at most one
bucket in memory, never its whole input.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import pyarrow as pa

from gmeta_tf.data.schema import TASK_COLUMN
from gmeta_tf.data.split import mix64


class TaskPartitioner:
    """Appends record batches to ``num_buckets`` Arrow IPC spill files by hash of the task id.

    Rows keep their input order inside a bucket, which keeps the split reproducible.

    Example::

        with TaskPartitioner(tmp, num_buckets=4) as part:
            for batch in batches:
                part.add(batch)
            for table in part.buckets():   # each: whole tasks, input order
                ...
    """

    def __init__(self, spill_dir: str, num_buckets: int) -> None:
        self.spill_dir = spill_dir
        self.num_buckets = max(1, int(num_buckets))
        self.rows = 0
        self._writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self._schema: pa.Schema | None = None
        os.makedirs(spill_dir, exist_ok=True)

    def __enter__(self) -> "TaskPartitioner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _path(self, bucket: int) -> str:
        return os.path.join(self.spill_dir, f"bucket-{bucket:05d}.arrow")

    def _writer(self, bucket: int) -> pa.ipc.RecordBatchStreamWriter:
        if bucket not in self._writers:
            self._writers[bucket] = pa.ipc.new_stream(self._path(bucket), self._schema)
        return self._writers[bucket]

    def add(self, batch: pa.RecordBatch) -> None:
        """Spills one batch (its schema must match the first batch's)."""
        if batch.num_rows == 0:
            return
        if self._schema is None:
            self._schema = batch.schema
        batch = batch.cast(self._schema) if batch.schema != self._schema else batch
        self.rows += batch.num_rows
        if self.num_buckets == 1:
            self._writer(0).write_batch(batch)
            return
        tasks = batch.column(batch.schema.get_field_index(TASK_COLUMN)).to_numpy()
        bucket = (mix64(tasks.view(np.uint64)) % np.uint64(self.num_buckets)).astype(np.int64)
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(self.num_buckets + 1))
        taken = batch.take(pa.array(order))
        for b in range(self.num_buckets):
            if bounds[b + 1] > bounds[b]:
                self._writer(b).write_batch(taken.slice(bounds[b], bounds[b + 1] - bounds[b]))

    def buckets(self) -> Iterator[pa.Table]:
        """Closes the spill files and yields each non-empty bucket as one table."""
        self.close()
        for b in range(self.num_buckets):
            if os.path.exists(self._path(b)):
                with pa.OSFile(self._path(b)) as source:
                    table = pa.ipc.open_stream(source).read_all()
                yield table
                os.remove(self._path(b))

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()
