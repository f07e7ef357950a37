"""Writes whole tasks into Parquet/ORC files and a manifest, atomically.

Everything goes to a temporary directory beside the target; only ``commit`` moves it into
place with ``os.replace``, so a converter that fails half way leaves no half-written dataset.
The temporary directory's name holds the converting process's id and host, and the
process holds a lock beside it while it converts, so that the next conversion into the
same place removes what a killed one left and puts back a dataset it had set aside to
replace (``atomic_file.tidy_staging``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq

from gmeta_tf.atomic_file import (fsync_tree, physical_path, release_staging, replace_dir,
                                  staging_dir, tidy_staging)
from gmeta_tf.data import filesystem as fs
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import FILE_FORMATS, MANIFEST_NAME, FileEntry, Manifest, sha256_of
from gmeta_tf.data.schema import TASK_COLUMN, Schema

log = logging.getLogger(__name__)


class _SplitFiles:
    """The rolling data files of one split: cuts whole-task blocks, rolls files by rows."""

    def __init__(self, writer: "DatasetWriter", split: str) -> None:
        self.writer, self.split = writer, split
        self.entries: list[FileEntry] = []
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._file: Any = None
        self._rel_path = ""
        self._blocks: list[list[int]] = []

    def add(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.writer.rows_per_block:
            self._flush(final=False)

    def close(self) -> None:
        self._flush(final=True)
        self._close_file()

    def _flush(self, final: bool) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        tasks = table.column(TASK_COLUMN).to_numpy()
        if len(tasks) == 0:
            return
        ends = np.append(np.flatnonzero(tasks[1:] != tasks[:-1]) + 1, len(tasks))
        # A block ends at the first task end that crosses a multiple of rows_per_block.
        crossing = np.flatnonzero(np.diff(np.concatenate([[0], ends // self.writer.rows_per_block])))
        cut = np.unique(np.append(ends[crossing], [len(tasks)] if final else []).astype(np.int64))
        start = 0
        for stop in cut:
            self._write_block(table.slice(start, stop - start), tasks[start:stop])
            start = int(stop)
        if start < len(tasks):
            self._pending, self._pending_rows = [table.slice(start)], len(tasks) - start

    def _write_block(self, block: pa.Table, tasks: np.ndarray) -> None:
        if self._file is None:
            self._open_file()
        n_tasks = int(np.count_nonzero(tasks[1:] != tasks[:-1]) + 1)
        if self.writer.file_format == "parquet":
            self._file.write_table(block, row_group_size=block.num_rows)
        else:
            self._file.write(block)
        self._blocks.append([block.num_rows, n_tasks])
        if sum(b[0] for b in self._blocks) >= self.writer.rows_per_file:
            self._close_file()

    def _open_file(self) -> None:
        w = self.writer
        self._rel_path = f"{self.split}/part-{len(self.entries):05d}.{w.file_format}"
        path = os.path.join(w.tmp_dir, self._rel_path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if w.file_format == "parquet":
            self._file = pq.ParquetWriter(path, w.arrow_schema, compression="snappy")
        else:
            self._file = orc.ORCWriter(path, compression="snappy")
        self._blocks = []

    def _close_file(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        path = os.path.join(self.writer.tmp_dir, self._rel_path)
        self.entries.append(FileEntry(
            path=self._rel_path, split=self.split,
            rows=sum(b[0] for b in self._blocks), tasks=sum(b[1] for b in self._blocks),
            bytes=os.path.getsize(path), sha256=sha256_of(path), blocks=self._blocks))


class DatasetWriter:
    """Writes tables of whole tasks, split by split, then commits the dataset atomically.

    Args:
        out_dir: Target dataset directory (local).
        schema: The dataset schema; every table written must have its columns.
        file_format: "parquet" or "orc".
        rows_per_file: A file is closed at the first block end past this many rows.
        rows_per_block: A block (Parquet row group; the unit of sharding) ends at the first
            task end past this many rows.
        overwrite: Replace an existing dataset at ``out_dir`` (a directory holding a
            dataset's manifest and files and nothing else) or an empty directory; anything
            else there is refused, never deleted.

    Example::

        with DatasetWriter(out, schema, "parquet") as w:
            w.write("warm", warm_table)     # tables sorted by task, whole tasks only
            manifest = w.commit(split={"seed": 0})
    """

    def __init__(self, out_dir: str, schema: Schema, file_format: str = "parquet",
                 rows_per_file: int = 1 << 20, rows_per_block: int = 1 << 16,
                 overwrite: bool = False) -> None:
        if fs.is_remote(out_dir):
            raise DataError("converters write local directories; copy the result with "
                            "tf.io.gfile or your storage tool", file=out_dir)
        if file_format not in FILE_FORMATS:
            raise DataError("unknown file format", value=file_format, expected=f"one of {FILE_FORMATS}")
        self.out_dir = physical_path(fs.local(out_dir))  # where the rename lands
        tidy_staging(self.out_dir, "a conversion")
        if os.path.lexists(self.out_dir):
            if not overwrite:
                raise DataError("output exists: a dataset there is replaced only with "
                                "--overwrite (in Python: output=OutputConfig(overwrite=True))", file=self.out_dir)
            _check_replaceable(self.out_dir)
        self.schema, self.file_format = schema, file_format
        self.arrow_schema = schema.arrow_schema()
        self.rows_per_file, self.rows_per_block = rows_per_file, rows_per_block
        try:
            self.tmp_dir = staging_dir(self.out_dir)
        except OSError as e:
            raise DataError(f"cannot write beside the output ({e.strerror or e})",
                            file=self.out_dir,
                            expected="a path in a directory this process can write") from e
        self._splits: dict[str, _SplitFiles] = {}

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if os.path.exists(self.tmp_dir):
            self.abort()
        else:  # moved into place, or failed after: the lock is let go all the same
            release_staging(self.tmp_dir)

    def write(self, split: str, table: pa.Table) -> None:
        """Appends whole tasks (sorted by task; no task continues in a later call)."""
        if table.num_rows == 0:
            return
        table = table.select(self.arrow_schema.names).cast(self.arrow_schema)
        self._splits.setdefault(split, _SplitFiles(self, split)).add(table)

    def commit(self, split: dict[str, Any]) -> Manifest:
        """Closes all files, writes the manifest and moves the dataset into place."""
        for s in self._splits.values():
            s.close()
        files = [e for name in sorted(self._splits) for e in self._splits[name].entries]
        manifest = Manifest(self.schema, self.file_format, files, split)
        manifest.save(self.tmp_dir)
        fsync_tree(self.tmp_dir)  # durable before the old dataset is let go

        def check(old: str) -> None:  # again: it may have changed while converting
            _check_replaceable(old)
            _log_replacement(old, manifest)

        replace_dir(self.tmp_dir, self.out_dir, check)
        log.info("wrote %s: %d files, %d rows, %d tasks", self.out_dir, len(files),
                 sum(f.rows for f in files), sum(f.tasks for f in files))
        return manifest

    def abort(self) -> None:
        """Drops everything written so far."""
        for s in self._splits.values():
            if s._file is not None:
                s._file.close()
        release_staging(self.tmp_dir)


def _check_replaceable(out_dir: str) -> None:
    """Refuses to replace what is not a dataset: a file, or a directory holding anything
    but a dataset's manifest and the files it lists (a raw input, a run's checkpoints, a
    user's notes). An empty directory, or one whose manifest is unreadable (a damaged
    dataset), may be replaced."""
    expected = (f"a new path, an empty directory or a dataset directory ({MANIFEST_NAME} and "
                f"its files only); --overwrite replaces a dataset, nothing else")
    if not os.path.isdir(out_dir) or os.path.islink(out_dir):
        raise DataError("output is not a directory", file=out_dir, expected=expected)
    entries = sorted(os.listdir(out_dir))
    if not entries:
        return
    if MANIFEST_NAME not in entries:
        raise DataError(f"output holds no dataset ({MANIFEST_NAME} missing) but "
                        f"{_some(entries)}: nothing there is deleted", file=out_dir,
                        expected=expected)
    try:
        listed = Manifest.load(out_dir).files
    except DataError:
        return  # a damaged dataset: replaced, with a warning (``_log_replacement``)
    ours = {MANIFEST_NAME} | {f.path.replace("\\", "/").split("/")[0] for f in listed}
    foreign = [e for e in entries if e not in ours]
    if foreign:
        raise DataError(f"the dataset directory also holds {_some(foreign)}, which its "
                        f"manifest does not list: nothing there is deleted", file=out_dir,
                        expected=expected)


def _some(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _log_replacement(out_dir: str, new: Manifest) -> None:
    """Says what an overwrite replaces, loudly when the new dataset holds fewer rows,
    tasks or splits than the old one."""
    try:
        old = Manifest.load(out_dir)
    except DataError:
        log.warning("replacing %s, which held no readable dataset", out_dir)
        return

    def counts(m: Manifest) -> tuple[int, int, list[str]]:
        return sum(f.rows for f in m.files), sum(f.tasks for f in m.files), sorted(
            {f.split for f in m.files})

    (old_rows, old_tasks, old_splits), (rows, tasks, splits) = counts(old), counts(new)
    smaller = rows < old_rows or tasks < old_tasks or set(old_splits) - set(splits)
    log.log(logging.WARNING if smaller else logging.INFO,
            "replacing dataset %s (%d rows, %d tasks, splits %s) with %d rows, %d tasks, "
            "splits %s%s", out_dir, old_rows, old_tasks, old_splits, rows, tasks, splits,
            ": the new dataset is SMALLER" if smaller else "")
