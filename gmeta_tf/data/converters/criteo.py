"""Criteo Display Advertising (raw Kaggle TSV) -> dataset.

Input rows: label, I1..I13 (integers, may be empty), C1..C26 (hex strings, may be empty),
tab-separated, no header. Integer features are either log-transformed into dense features
(``log(1 + max(x, 0))``, empty -> 0) or bucketized into sparse ids (the Criteo-winner
``floor(log(x)^2)`` buckets for x > 2, small values kept apart, empty -> id 0). Categorical
values are hashed to int64 (``gmeta_tf.data.hashing``, salted by column). The task is the
value of one categorical column (default C2, a few hundred values), kept as a feature too.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from gmeta_tf.data import hashing
from gmeta_tf.data.converters.pipeline import (OutputConfig, RawBatch, columns_to_batch, convert,
                                               record_batches)
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import Manifest
from gmeta_tf.data.schema import (LABEL_COLUMN, ROW_TASK_BITS, TASK_COLUMN, Feature, FeatureKind,
                                  Schema)
from gmeta_tf.data.split import SplitConfig

INT_COLUMNS = [f"I{i}" for i in range(1, 14)]
CAT_COLUMNS = [f"C{i}" for i in range(1, 27)]
RAW_LABEL = "label"  # the name this reader gives the click column, the first of a Criteo line
INT_MODES = ("log", "bucketize")


def criteo_schema(int_mode: str = "log") -> Schema:
    """The output schema for an integer-feature mode ("log" or "bucketize")."""
    if int_mode not in INT_MODES:
        raise DataError("unknown int_mode", value=int_mode, expected=f"one of {INT_MODES}")
    kind = FeatureKind.DENSE if int_mode == "log" else FeatureKind.SPARSE
    return Schema([Feature(c, kind) for c in INT_COLUMNS]
                  + [Feature(c, FeatureKind.SPARSE) for c in CAT_COLUMNS]
                  + [Feature(LABEL_COLUMN, FeatureKind.LABEL, value_range=(0.0, 1.0))])


def bucketize(x: np.ndarray) -> np.ndarray:
    """Sparse ids for raw Criteo integers (NaN = missing -> 0).

    Values <= 2 (Criteo has a few negatives, down to -3) map to ids 1..6; larger values to
    7 + floor(log(x)^2), so ids never collide with the missing id.
    """
    ids = np.zeros(len(x), np.int64)
    small = ~np.isnan(x) & (x <= 2)
    large = ~np.isnan(x) & (x > 2)
    ids[small] = np.maximum(x[small], -3).astype(np.int64) + 4
    ids[large] = 7 + np.floor(np.log(x[large]) ** 2).astype(np.int64)
    return ids


def _parse(batch: pa.RecordBatch, int_mode: str, task_column: str | None,
           first_task: int = 0) -> dict[str, np.ndarray]:
    cols: dict[str, np.ndarray] = {}
    for c in INT_COLUMNS:
        x = batch.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
        cols[c] = (np.log1p(np.maximum(np.nan_to_num(x, nan=0.0), 0.0)).astype(np.float32)
                   if int_mode == "log" else bucketize(x))
    for c in CAT_COLUMNS:
        cols[c] = hashing.to_ids(batch.column(c), c)
    cols[LABEL_COLUMN] = batch.column(RAW_LABEL).to_numpy(zero_copy_only=False).astype(np.float32)
    if task_column is None:
        tasks = np.arange(first_task, first_task + batch.num_rows, dtype=np.int64)
    else:
        tasks = cols[task_column]
    return {TASK_COLUMN: tasks, **cols}


def _raw_batches(paths: list[str], int_mode: str, task_column: str | None,
                 block_bytes: int) -> Iterator[RawBatch]:
    names = [RAW_LABEL, *INT_COLUMNS, *CAT_COLUMNS]
    types = {RAW_LABEL: pa.float64(), **{c: pa.float64() for c in INT_COLUMNS},
             **{c: pa.string() for c in CAT_COLUMNS}}
    for index, path in enumerate(paths):
        def open_reader(path=path):
            return pacsv.open_csv(
                path, read_options=pacsv.ReadOptions(column_names=names, block_size=block_bytes),
                parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
                convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True))

        for batch, first_row in record_batches(open_reader, path, "Criteo TSV"):
            first_task = (index << ROW_TASK_BITS) + first_row
            yield RawBatch(columns_to_batch(_parse(batch, int_mode, task_column, first_task)),
                           path, first_row)


def convert_criteo(src: str | list[str], out_dir: str, seed: int = 0, int_mode: str = "log",
                   task_column: str | None = "C2", split: SplitConfig | None = None,
                   output: OutputConfig | None = None, block_bytes: int = 16 << 20) -> Manifest:
    """Converts raw Criteo TSV file(s) to a task-partitioned dataset, streaming.

    Args:
        src: A TSV path or a list of paths.
        out_dir: Output dataset directory.
        seed: Split seed (ignored when ``split`` is given).
        int_mode: "log" (dense) or "bucketize" (sparse) for I1..I13.
        task_column: The categorical column whose value is the task; None: every row is
            its own task (row data, e.g. for a plain CTR model).
        split: Split parameters; default 80% warm tasks, 4 query rows, tasks with fewer
            than 8 rows dropped.
        output: File format and sizes.
        block_bytes: TSV bytes parsed per batch.

    Returns:
        The manifest of the written dataset.
    """
    paths = [src] if isinstance(src, str) else list(src)
    for p in paths:
        if not os.path.exists(p):
            raise DataError("input file not found", file=p)
    if task_column is not None and task_column not in CAT_COLUMNS:
        raise DataError("task column must be a categorical column", column=task_column,
                        expected="one of C1..C26")
    schema = criteo_schema(int_mode)
    split = split or SplitConfig(seed=seed, query_size=4, min_rows=8)
    return convert(_raw_batches(paths, int_mode, task_column, block_bytes), schema, out_dir,
                   split=split, output=output or OutputConfig(),
                   input_bytes=sum(os.path.getsize(p) for p in paths),
                   source={"kind": "criteo", "paths": paths, "int_mode": int_mode,
                           "task_column": task_column})
