"""MixCache (ScaleFreeCTR): hot embedding rows cached in front of the host hash table.

:class:`MixCachedHashTable` is a :class:`~gmeta_tf.embedding.HashTable` whose reads and
fused optimizer updates go through a cache of ``capacity`` hot rows (C++, ``ops/mix_cache.*``):

- a cached id's row and optimizer slots live in a dense array found through a small index
  sized to the cache, so hot ids never probe the host table's large index (on a GPU the
  array would be device memory, saving the host-to-device copies of hot rows);
- **admission** (exact LFU, decided in every lookup, no periodic re-fill needed): the host
  table counts each id's occurrences and the cache counts its own ids', so every id's
  frequency is known exactly. After a lookup, an id that missed the cache enters it when
  its accumulated frequency is at least ``min_count`` and either a slot is free or it is
  strictly more frequent than the least frequent cached id, which it replaces. The
  entering row, slots and counters are read from the host table, where the lookup just
  left them. So the cache tracks the ids most frequent so far, including ids first seen
  as rare that turned hot;
- :meth:`MixCachedHashTable.rebalance` makes the cache hold exactly the host table's
  ``capacity`` most frequent ids at once (one pass over the host index in C++, no export),
  e.g. after an import; :class:`HybridTrainer` calls it every ``rebalance_every`` steps
  when that is set;
- **eviction** writes the evicted rows (and slots and counters) back to the host table;
- **consistency**: export, checkpoint, eviction and import write every changed cached row
  back first, inside the same op, so what leaves the table is always what training saw:
  a model trained with the cache exports exactly the rows it exports without it.

The hit rate counts id occurrences: an id already cached scores its count in the lookup;
an id admitted by that lookup scores its count minus one (its first occurrence missed).
On ``benchmarks/hybrid.py``'s Zipf(1.1) batches (6 steps of 65536 x 26 ids, 2 owners),
with the cache holding 1% / 5% of the ids the run sees, the hit rate is 0.5468 / 0.5942:
0.996 / 0.952 of an oracle holding the run's most frequent 1% / 5% of ids from the start
(min_count 1, never rebalanced; min_count 2: 0.996 / 0.950). Missing just the first
occurrence of each of the oracle's ids would give 0.993 / 0.970 of it.

Example::

    table = MixCachedHashTable(16, MixCacheConfig(capacity=10_000), optimizer=Adagrad(0.05))
    rows = table.lookup_or_insert(unique_ids, step=1, counts=counts)   # [U, 16]
    table.apply_gradients(unique_ids, grads, step=1)
    table.cache_stats()["hit_rate"]
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from gmeta_tf import ops
from gmeta_tf.embedding import sparse_optimizers
from gmeta_tf.embedding.hash_table import HashTable, _names

_STATS = ("capacity", "size", "lookups", "hits", "unique_lookups", "unique_hits",
          "admitted", "evicted", "written_back")


@dataclasses.dataclass(frozen=True)
class MixCacheConfig:
    """Size and admission rule of one table's cache (per shard: per owner rank).

    Args:
        capacity: Rows the cache holds, >= 1.
        min_count: Occurrences (accumulated over every lookup) an id needs before it may
            enter the cache, >= 1. A full cache also needs it to be more frequent than its
            least frequent id, so ``min_count`` matters most while the cache fills: 1
            leaves no slot idle.
        rebalance_every: Every this many training steps, :class:`HybridTrainer` (and the
            training loop) calls ``rebalance``: the cache then holds exactly the shard's
            most frequent ids. Lookups already admit by exact frequency, so 0 (never) is
            the usual choice; a rebalance costs one pass over the shard's index.

    Example::

        MixCacheConfig(capacity=20_000, min_count=1)
    """

    capacity: int
    min_count: int = 2
    rebalance_every: int = 0

    def __post_init__(self):
        for name, low in (("capacity", 1), ("min_count", 1), ("rebalance_every", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"MixCacheConfig.{name} must be an integer >= {low}, "
                                 f"got {value!r}")
        if self.capacity >= 2**31:
            raise ValueError(f"MixCacheConfig.capacity must be below 2**31, got {self.capacity}")


def _library():
    lib = ops.library()
    if not hasattr(lib, "gmeta_cached_table"):
        raise ops.OpLibraryError(
            f"op library {ops.LIBRARY_PATH} has no MixCache ops (built before they existed); "
            "rebuild it: `make -C ops`")
    return lib


class MixCachedHashTable(HashTable):
    """A hash table with a MixCache of hot rows in front (same interface as HashTable).

    Args:
        dim: Row width.
        cache: Capacity and admission rule of the cache.
        optimizer, seed, initializer, init_scale, admit_after, default_value, name: as
            for :class:`HashTable`. With ``admit_after`` above 1 only ids that have a row
            (seen ``admit_after`` times) are cached.
    """

    def __init__(self, dim: int, cache: MixCacheConfig, optimizer=None, seed: int = 0,
                 initializer: str = "uniform", init_scale: float = 0.05, admit_after: int = 1,
                 default_value: float = 0.0, name: str | None = None):
        if not isinstance(cache, MixCacheConfig):
            raise TypeError(f"cache must be a MixCacheConfig, got {cache!r}")
        ops._check_positive("dim", dim)
        if initializer not in ops.INITIALIZERS:
            raise ValueError(f"initializer must be one of {ops.INITIALIZERS}, got {initializer!r}")
        # HashTable's state, with a cached-table resource in place of the plain one.
        tf.Module.__init__(self, name=name or "hash_table")
        self.cache = cache
        self.dim = dim
        self.optimizer = sparse_optimizers.get(optimizer or "sgd")
        self.config = dict(dim=dim, seed=seed, initializer=initializer, init_scale=init_scale,
                           admit_after=admit_after, default_value=default_value)
        self._shared_name = f"gmeta_cached_table_{self.name}_{next(_names)}_{id(self)}"
        with tf.init_scope():
            self.handle = self._create_handle()

    def _create_handle(self) -> tf.Tensor:
        return _library().gmeta_cached_table(
            shared_name=self._shared_name, dim=self.dim, num_slots=self.optimizer.num_slots,
            slot_init=float(self.optimizer.slot_init), seed=self.config["seed"],
            initializer=self.config["initializer"],
            init_scale=float(self.config["init_scale"]),
            admit_after=self.config["admit_after"],
            default_value=float(self.config["default_value"]),
            cache_capacity=self.cache.capacity, cache_min_count=self.cache.min_count)

    def lookup_or_insert(self, ids, step=0, counts=None) -> tf.Tensor:
        counts = tf.zeros([0], tf.int64) if counts is None else tf.cast(counts, tf.int64)
        return _library().gmeta_cached_table_lookup_or_insert(
            self.handle, ops._ids(ids), counts, tf.cast(step, tf.int64), dim=self.dim)

    def lookup(self, ids) -> tf.Tensor:
        return _library().gmeta_cached_table_lookup(self.handle, ops._ids(ids), dim=self.dim)[0]

    def apply_gradients(self, ids, grads, step=1) -> tf.Tensor:
        opt = self.optimizer
        grads = tf.convert_to_tensor(grads)
        if grads.dtype != tf.float32:
            raise TypeError(f"grads must be float32, got dtype {grads.dtype.name}")
        return _library().gmeta_cached_table_apply_gradients(
            self.handle, ops._ids(ids), grads, tf.cast(opt.learning_rate, tf.float32),
            tf.cast(getattr(opt, "epsilon", 1e-7), tf.float32),
            tf.cast(getattr(opt, "beta_1", 0.9), tf.float32),
            tf.cast(getattr(opt, "beta_2", 0.999), tf.float32),
            tf.cast(step, tf.int64), optimizer=opt.name)

    def size(self) -> tf.Tensor:
        """Ids the table knows (admitted or still being counted), cached ones included."""
        return _library().gmeta_cached_table_size(self.handle)[0]

    def num_rows(self) -> tf.Tensor:
        """Ids admitted to a trainable row, cached ones included."""
        return _library().gmeta_cached_table_size(self.handle)[1]

    def evict(self, step, max_age: int = -1, max_size: int = -1) -> tf.Tensor:
        return _library().gmeta_cached_table_evict(
            self.handle, tf.cast(step, tf.int64), tf.cast(max_age, tf.int64),
            tf.cast(max_size, tf.int64))

    def export(self) -> ops.TableSnapshot:
        """The host table after writing the cache back: exactly the trained state."""
        return ops.TableSnapshot(*_library().gmeta_cached_table_export(
            self.handle, dim=self.dim, num_slots=self.num_slots))

    def import_(self, snapshot, clear_first: bool = True, shard_index=0, num_shards=1):
        shape = tuple(snapshot.values.shape)
        if len(shape) != 2 or shape[1] != self.dim:
            raise ValueError(f"cannot import rows of shape {shape} into table '{self.name}' "
                             f"of dim {self.dim}")
        return _library().gmeta_cached_table_import(
            self.handle, ops._ids(snapshot.ids),
            tf.convert_to_tensor(snapshot.values, tf.float32),
            tf.convert_to_tensor(snapshot.slots, tf.float32),
            tf.convert_to_tensor(snapshot.freq, tf.int64),
            tf.convert_to_tensor(snapshot.last_seen, tf.int64),
            tf.convert_to_tensor(snapshot.admitted, tf.bool),
            tf.cast(shard_index, tf.int64), tf.cast(num_shards, tf.int64),
            clear_first=clear_first)

    # ---- cache-specific ----------------------------------------------------------------
    def flush(self) -> int:
        """Writes changed cached rows back to the host table; returns how many."""
        return int(_library().gmeta_cached_table_flush(self.handle))

    def rebalance(self) -> int:
        """Makes the cache hold exactly the host table's ``capacity`` most frequent ids
        (ties by ascending id), after writing the cache back: one pass over the host index
        and a partial selection in C++, no export. Rows, slots and counters are unchanged.
        Returns the number of ids cached."""
        return int(_library().gmeta_cached_table_rebalance(self.handle))

    def cache_stats(self) -> dict[str, float]:
        """Counters of the cache: capacity, size, lookups, hits (id occurrences),
        unique_lookups, unique_hits, admitted, evicted, written_back, and hit_rate."""
        values, _ = _library().gmeta_cached_table_stats(self.handle)
        stats: dict[str, float] = dict(zip(_STATS, (int(v) for v in values.numpy())))
        stats["hit_rate"] = stats["hits"] / stats["lookups"] if stats["lookups"] else 0.0
        return stats

    def cached_ids(self) -> np.ndarray:
        """The ids cached now, sorted."""
        return _library().gmeta_cached_table_stats(self.handle)[1].numpy()
