"""Loads the compiled op library and wraps its ops with checked, documented Python calls.

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
OPTIMIZERS = ("sgd", "adagrad", "adam")
INITIALIZERS = ("zeros", "uniform", "normal")


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


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def create_table(
    shared_name: str,
    dim: int,
    num_slots: int = 0,
    slot_init: float = 0.0,
    seed: int = 0,
    initializer: str = "uniform",
    init_scale: float = 0.05,
    admit_after: int = 1,
    default_value: float = 0.0,
) -> tf.Tensor:
    """Creates (or finds, by shared_name) a hash table; returns its resource handle."""
    _check_positive("dim", dim)
    if not isinstance(num_slots, int) or num_slots < 0:
        raise ValueError(f"num_slots must be an integer >= 0, got {num_slots!r}")
    if initializer not in INITIALIZERS:
        raise ValueError(f"initializer must be one of {INITIALIZERS}, got {initializer!r}")
    if not isinstance(admit_after, int) or admit_after < 0:
        raise ValueError(f"admit_after must be an integer >= 0, got {admit_after!r}")
    if not -(2**63) <= seed < 2**63:
        raise ValueError(f"seed must fit in int64, got {seed!r}")
    return library().gmeta_hash_table(
        shared_name=shared_name,
        dim=dim,
        num_slots=num_slots,
        slot_init=float(slot_init),
        seed=seed,
        initializer=initializer,
        init_scale=float(init_scale),
        admit_after=admit_after,
        default_value=float(default_value),
    )


def destroy_table(handle: tf.Tensor) -> None:
    tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)


def lookup_or_insert(handle, ids, dim: int, step=0, counts=None) -> tf.Tensor:
    """Rows [n, dim] of ids; missing ids are inserted with their initial row.

    ``counts`` (one per id, default 1) is added to each id's frequency and ``step`` is
    recorded as its last-seen step; both drive admission and eviction.
    """
    ids = _ids(ids)
    counts = tf.zeros([0], tf.int64) if counts is None else tf.cast(counts, tf.int64)
    return library().gmeta_table_lookup_or_insert(
        handle, ids, counts, tf.cast(step, tf.int64), dim=dim
    )


def lookup(handle, ids, dim: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Read-only rows [n, dim] and a found mask; unknown ids read the default row."""
    return library().gmeta_table_lookup(handle, _ids(ids), dim=dim)


def apply_gradients(
    handle,
    ids,
    grads,
    optimizer: str,
    learning_rate,
    epsilon=1e-7,
    beta1=0.9,
    beta2=0.999,
    step=1,
) -> tf.Tensor:
    """One fused sparse optimizer step on the rows of ids; returns rows updated."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    grads = tf.convert_to_tensor(grads)
    if grads.dtype != tf.float32:
        raise TypeError(f"grads must be float32, got dtype {grads.dtype.name}")
    return library().gmeta_table_apply_gradients(
        handle,
        _ids(ids),
        grads,
        tf.cast(learning_rate, tf.float32),
        tf.cast(epsilon, tf.float32),
        tf.cast(beta1, tf.float32),
        tf.cast(beta2, tf.float32),
        tf.cast(step, tf.int64),
        optimizer=optimizer,
    )


def table_size(handle) -> tuple[tf.Tensor, tf.Tensor]:
    """(ids known, ids with a row)."""
    return library().gmeta_table_size(handle)


def evict(handle, step, max_age: int = -1, max_size: int = -1) -> tf.Tensor:
    """Evicts ids unseen for max_age steps, then the least recently seen beyond max_size."""
    return library().gmeta_table_evict(
        handle, tf.cast(step, tf.int64), tf.cast(max_age, tf.int64), tf.cast(max_size, tf.int64)
    )


class TableSnapshot(NamedTuple):
    """Everything a table holds, sorted by id: the basis of checkpoints."""

    ids: tf.Tensor
    values: tf.Tensor
    slots: tf.Tensor
    freq: tf.Tensor
    last_seen: tf.Tensor
    admitted: tf.Tensor


def export_table(handle, dim: int, num_slots: int) -> TableSnapshot:
    return TableSnapshot(*library().gmeta_table_export(handle, dim=dim, num_slots=num_slots))


def import_table(
    handle, snapshot: TableSnapshot, clear_first: bool = True, shard_index=0, num_shards=1
) -> tf.Tensor:
    """Loads a snapshot, keeping only ids owned by shard_index of num_shards."""
    return library().gmeta_table_import(
        handle,
        _ids(snapshot.ids),
        tf.convert_to_tensor(snapshot.values, tf.float32),
        tf.convert_to_tensor(snapshot.slots, tf.float32),
        tf.convert_to_tensor(snapshot.freq, tf.int64),
        tf.convert_to_tensor(snapshot.last_seen, tf.int64),
        tf.convert_to_tensor(snapshot.admitted, tf.bool),
        tf.cast(shard_index, tf.int64),
        tf.cast(num_shards, tf.int64),
        clear_first=clear_first,
    )


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
