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


import importlib

#: Each name this package exports and the module it lives in. They are imported on first use
#: (PEP 562), so that converting a file (``gmeta data csv``), which needs NumPy and Arrow
#: only, does not import TensorFlow through the readers.
_EXPORTS = {
    "CsvMapping": "gmeta_tf.data.converters", "OutputConfig": "gmeta_tf.data.converters",
    "convert_criteo": "gmeta_tf.data.converters", "convert_csv": "gmeta_tf.data.converters",
    "convert_movielens": "gmeta_tf.data.converters",
    "DataError": "gmeta_tf.data.errors",
    "Manifest": "gmeta_tf.data.manifest",
    "ReaderCrashed": "gmeta_tf.data.readers", "reader_names": "gmeta_tf.data.readers",
    "PAD_ID": "gmeta_tf.data.schema", "Feature": "gmeta_tf.data.schema",
    "FeatureKind": "gmeta_tf.data.schema", "Schema": "gmeta_tf.data.schema",
    "SOURCE_SPLITS": "gmeta_tf.data.split", "SplitConfig": "gmeta_tf.data.split",
    "source_split": "gmeta_tf.data.split",
    "TaskDataset": "gmeta_tf.data.task_dataset", "read_rows": "gmeta_tf.data.task_dataset",
    "read_tasks": "gmeta_tf.data.task_dataset",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
