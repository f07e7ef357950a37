"""The hash table's ops (``ops/table_ops.cc``), wrapped with checked, documented calls.

One table resource serves tables with and without a cache of hot rows: the same ops read,
train, evict, export and import both; only the cache's own three (flush, rebalance,
stats) need a table created with ``cache_capacity > 0``.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from gmeta_tf.ops import _ids, library

OPTIMIZERS = ("sgd", "adagrad", "adam")
INITIALIZERS = ("zeros", "uniform", "normal")
CACHE_STATS = ("capacity", "size", "lookups", "hits", "unique_lookups", "unique_hits",
               "admitted", "evicted", "written_back")


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def create_table(
    shared_name: str,
    dim: int,
    *,
    num_slots: int,
    slot_init: float,
    seed: int,
    initializer: str,
    init_scale: float,
    admit_after: int,
    default_value: float,
    cache_capacity: int,
    cache_min_count: int,
) -> tf.Tensor:
    """Creates (or finds, by shared_name) a hash table; returns its resource handle.
    (``HashTable`` is the way to make one; the options' defaults are ``TableConfig``'s.)

    ``cache_capacity`` > 0 gives it a cache of that many hot rows (admission by exact
    frequency, from ``cache_min_count`` occurrences on).
    """
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
        cache_capacity=cache_capacity,
        cache_min_count=cache_min_count,
    )


def destroy_table(handle: tf.Tensor) -> None:
    tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)


class LookedUp(NamedTuple):
    """Rows of a lookup-or-insert, and where each lives (for :func:`apply_gradients`)."""

    values: tf.Tensor  # [n, dim] float32
    row_handles: tf.Tensor  # [n] int64


def lookup_or_insert(handle, ids, dim: int, step=0, counts=None) -> LookedUp:
    """Rows [n, dim] of ids; missing ids are inserted with their initial row.

    ``counts`` (one per id, default 1) is added to each id's frequency and ``step`` is
    recorded as its last-seen step; both drive admission and eviction. The row handles
    let :func:`apply_gradients` reach the same rows without probing the index again
    (handles made stale by an eviction or import in between are detected and ignored).
    """
    ids = _ids(ids)
    counts = tf.zeros([0], tf.int64) if counts is None else tf.cast(counts, tf.int64)
    return LookedUp(*library().gmeta_table_lookup_or_insert(
        handle, ids, counts, tf.cast(step, tf.int64), dim=dim))


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
    row_handles=None,
) -> tf.Tensor:
    """One fused sparse optimizer step on the rows of ids; returns rows updated.

    ``row_handles``: :func:`lookup_or_insert`'s for these ids (optional: without them
    every id is probed)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    grads = tf.convert_to_tensor(grads)
    if grads.dtype != tf.float32:
        raise TypeError(f"grads must be float32, got dtype {grads.dtype.name}")
    row_handles = (tf.zeros([0], tf.int64) if row_handles is None
                   else tf.convert_to_tensor(row_handles, tf.int64))
    return library().gmeta_table_apply_gradients(
        handle,
        _ids(ids),
        row_handles,
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


def flush_cache(handle) -> tf.Tensor:
    """Writes changed cached rows back to the table; returns how many."""
    return library().gmeta_table_cache_flush(handle)


def rebalance_cache(handle) -> tf.Tensor:
    """Makes the cache hold the table's most frequent ids; returns how many are cached."""
    return library().gmeta_table_cache_rebalance(handle)


def cache_stats(handle) -> tuple[tf.Tensor, tf.Tensor]:
    """The cache's counters (``CACHE_STATS`` order) and its ids, sorted."""
    return library().gmeta_table_cache_stats(handle)
