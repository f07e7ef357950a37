"""Meta-IO: task-partitioned Parquet/ORC data, converters, and task-batch readers.

A dataset is a directory of Parquet or ORC files in which the rows of a task (a user, an
ad, a scenario) are contiguous and every file holds whole tasks, plus ``manifest.json``
(schema, per-file counts and SHA-256, the seeded cold-start split). Storage layout:
``gmeta_tf.data.schema``; manifest: ``gmeta_tf.data.manifest``.

Batch layout of ``read_tasks`` (T tasks per batch, S support and Q query slots)::

    {
      "task_id": int64 [T],
      "support": {
        "<sparse>":    int64   [T, S]        padding rows hold PAD_ID (-1)
        "<multi_hot>": int64   [T, S, W]     unused slots hold PAD_ID (-1)
        "<dense>":     float32 [T, S]        or [T, S, D] for dim D > 1; padding 0.0
        "<label>":     float32 [T, S]        padding 0.0
        "mask":        float32 [T, S]        1.0 for a real row, 0.0 for padding
      },
      "query": { ... the same with Q ... },
    }

With ``support=None`` / ``query=None`` S and Q are the longest set in the batch; with
``ragged=True`` every feature is a ``tf.RaggedTensor`` [T, None, ...] and there is no mask.
The last batch of an epoch may have fewer than T tasks (not with ``equal_steps``, which is
the default on more than one rank so that all ranks take the same number of steps).

``read_rows`` yields ``{"task_id": [B], "is_query": int32 [B], "<feature>": [B] or [B, W]}``.

Example::

    from gmeta_tf import data
    data.convert_movielens("../shared/data/ml-100k", "/tmp/ml", seed=0)
    ds = data.read_tasks("/tmp/ml", tasks_per_batch=32, support=20, query=10, shuffle_seed=1)
    batch = next(iter(ds))
    batch["support"]["genres"].shape   # (32, 20, 6)
"""

from gmeta_tf.data.converters import (CsvMapping, OutputConfig, convert_criteo, convert_csv,
                                      convert_movielens)
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import Manifest
from gmeta_tf.data.readers import ReaderCrashed, reader_names
from gmeta_tf.data.schema import PAD_ID, Feature, FeatureKind, Schema
from gmeta_tf.data.split import SOURCE_SPLITS, SplitConfig, source_split
from gmeta_tf.data.task_dataset import TaskDataset, read_rows, read_tasks

__all__ = [
    "PAD_ID", "CsvMapping", "DataError", "Feature", "FeatureKind", "Manifest", "OutputConfig",
    "ReaderCrashed", "Schema", "SOURCE_SPLITS", "SplitConfig", "source_split", "TaskDataset", "convert_criteo", "convert_csv",
    "convert_movielens", "read_rows", "read_tasks", "reader_names",
]
