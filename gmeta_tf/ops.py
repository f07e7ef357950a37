"""Loads the compiled op library; wraps its Virtual Sparse Id ops (dedup, partition, gather).

The hash table's own ops are wrapped beside the table, in ``gmeta_tf.embedding.table_ops``.

The kernels live in ``ops/`` (C++); ``make -C ops`` (run by ``scripts/setup.sh``) builds
``gmeta_tf/libgmeta_ops.so`` next to this file. A missing library or one built against
another TensorFlow raises :class:`OpLibraryError` naming the file and the fix, never a
crash of the process.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import NamedTuple

import tensorflow as tf

LIBRARY_PATH = Path(
    os.environ.get("GMETA_OPS_LIBRARY", Path(__file__).with_name("libgmeta_ops.so"))
)


class OpLibraryError(RuntimeError):
    """The op library is missing, unloadable or built for another TensorFlow."""


@functools.lru_cache(maxsize=None)
def library():
    """The loaded op module (cached). Raises OpLibraryError with the fix on failure."""
    path = LIBRARY_PATH
    fix = "build it with `make setup` (or `make -C ops`) from the project root"
    if not path.is_file():
        raise OpLibraryError(f"op library {path} not found; {fix}")
    stamp = path.with_suffix(".tfversion")
    built_for = stamp.read_text().strip() if stamp.is_file() else "unknown"
    if built_for != tf.__version__:
        raise OpLibraryError(
            f"op library {path} was built for TensorFlow {built_for}, this process runs "
            f"TensorFlow {tf.__version__}; rebuild it: `make -C ops clean && make setup`"
        )
    try:
        return tf.load_op_library(str(path))
    except (tf.errors.NotFoundError, OSError) as err:
        raise OpLibraryError(f"cannot load op library {path} ({err}); {fix}") from err


def _ids(ids, name: str = "ids") -> tf.Tensor:
    """Converts ids to an int64 vector; int32 is widened, anything else is an error."""
    ids = tf.convert_to_tensor(ids)
    if ids.dtype == tf.int32:
        ids = tf.cast(ids, tf.int64)
    if ids.dtype != tf.int64:
        raise TypeError(f"{name} must be int64 (or int32) ids, got dtype {ids.dtype.name}")
    if ids.shape.rank is not None and ids.shape.rank != 1:
        raise ValueError(f"{name} must be a vector (rank 1), got shape {ids.shape}")
    return ids


class Dedup(NamedTuple):
    """Virtual Sparse Id of a batch: ``ids == tf.gather(unique_ids, inverse)``.

    With num_partitions > 1 the unique ids are grouped by owner rank and ``splits[r]``
    of them belong to rank r, ready for ``hvd.alltoall(unique_ids, splits=splits)``.
    """

    unique_ids: tf.Tensor
    inverse: tf.Tensor
    counts: tf.Tensor
    splits: tf.Tensor


def dedup(ids, num_partitions=1) -> Dedup:
    return Dedup(*library().gmeta_dedup(_ids(ids), tf.cast(num_partitions, tf.int32)))


def partition_of(ids, num_partitions) -> tf.Tensor:
    """Owner rank of each id (the function dedup partitions by)."""
    ids = tf.convert_to_tensor(ids)
    if ids.dtype != tf.int64:
        raise TypeError(f"ids must be int64, got dtype {ids.dtype.name}")
    return library().gmeta_partition_of(ids, tf.cast(num_partitions, tf.int32))


def gather_rows(params, indices) -> tf.Tensor:
    """rows[i] = params[indices[i]] (float32 matrix, int32 indices), on all intra-op threads.

    Its gradient folds the row gradients per params row with :func:`scatter_add_rows`, a
    dense [len(params), dim] tensor (no IndexedSlices).
    """
    return library().gmeta_gather_rows(params, tf.cast(indices, tf.int32))


def scatter_add_rows(updates, indices, num_rows) -> tf.Tensor:
    """rows[k] = sum of updates[i] with indices[i] == k; rows has num_rows rows."""
    return library().gmeta_scatter_add_rows(updates, tf.cast(indices, tf.int32),
                                            tf.cast(num_rows, tf.int32))


@tf.RegisterGradient("GmetaGatherRows")
def _gather_rows_grad(op, grad):
    params, indices = op.inputs
    return scatter_add_rows(grad, indices, tf.shape(params)[0]), None


@tf.RegisterGradient("GmetaScatterAddRows")
def _scatter_add_rows_grad(op, grad):
    return gather_rows(grad, op.inputs[1]), None, None
