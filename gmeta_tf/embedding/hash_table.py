"""HashTable: the Python owner of one table resource of the op library, with or without a
MixCache (ScaleFreeCTR) of hot rows inside it.

A table given ``cache=MixCacheConfig(capacity, min_count)`` keeps ``capacity`` hot rows in
a cache inside the same C++ table (``ops/hash_table.h``, ``ops/table_cache.cc``):

- a cached id's row and optimizer slots live in a dense array found through a small index
  sized to the cache, so hot ids never probe the table's large index (on a GPU the array
  would be device memory, saving the host-to-device copies of hot rows);
- **admission** (exact LFU, decided in every lookup, no periodic re-fill needed): the
  table counts each id's occurrences and the cache counts its own ids', so every id's
  frequency is known exactly. After a lookup, an id that missed the cache enters it when
  its accumulated frequency is at least ``min_count`` and either a slot is free or it is
  strictly more frequent than the least frequent cached id, which it replaces. The
  entering row, slots and counters are read from the table, where the lookup just left
  them. So the cache tracks the ids most frequent so far, including ids first seen as
  rare that turned hot;
- :meth:`HashTable.rebalance` makes the cache hold exactly the table's ``capacity`` most
  frequent ids at once (one pass over the index in C++, no export), e.g. after an import;
  the training loops call it every ``rebalance_every`` steps when that is set;
- **eviction** from the cache writes the evicted rows (and slots and counters) back;
- **consistency**: export, checkpoint, eviction and import write every changed cached row
  back first, inside the same op, so what leaves the table is always what training saw:
  a model trained with the cache exports exactly the rows it exports without it. Reads
  and updates of cached and uncached rows are one code path in C++ (one fold, one
  optimizer routine).

The hit rate counts id occurrences: an id already cached scores its count in the lookup;
an id admitted by that lookup scores its count minus one (its first occurrence missed).
On ``benchmarks/hybrid.py``'s Zipf(1.1) batches (6 steps of 65536 x 26 ids, 2 owners),
with the cache holding 1% / 5% of the ids the run sees, the hit rate is 0.5468 / 0.5942:
0.996 / 0.952 of an oracle holding the run's most frequent 1% / 5% of ids from the start
(min_count 1, never rebalanced; min_count 2: 0.996 / 0.950). Missing just the first
occurrence of each of the oracle's ids would give 0.993 / 0.970 of it.
"""

from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf

from gmeta_tf.embedding import sparse_optimizers, table_ops
from gmeta_tf.embedding.config import MixCacheConfig, TableConfig

_names = itertools.count()


class HashTable(tf.Module):
    """An int64 -> float32[dim] table that grows without a vocabulary.

    Rows of new ids are a deterministic function of (seed, id), so every rank and every
    restart agrees on them. The table is checkpointable with ``tf.train.Checkpoint`` (it
    saves its full export: ids, rows, optimizer slots, counters).

    Args:
        dim: Row width.
        optimizer: The fused sparse optimizer (instance, name or dict; default SGD).
        seed, initializer, init_scale: Initial rows (uniform in [-scale, scale), normal
            with stddev scale, or zeros), a function of (seed, id).
        admit_after: Sightings an id needs before it gets a trainable row.
        default_value: What ids without a row read.
        cache: A :class:`MixCacheConfig` for a cache of hot rows inside the table, or None.
            With ``admit_after`` above 1 only ids that have a row are cached.

    Example::

        table = HashTable(dim=8, optimizer=Adagrad(0.05))
        rows = table.lookup_or_insert(tf.constant([3, -7], tf.int64))  # [2, 8]
        table.apply_gradients([3, -7], tf.ones([2, 8]))
        cached = HashTable(16, optimizer=Adagrad(0.05), cache=MixCacheConfig(10_000))
        cached.cache_stats()["hit_rate"]
    """

    def __init__(
        self,
        dim: int,
        optimizer=None,
        seed: int = TableConfig.seed,
        initializer: str = TableConfig.initializer,
        init_scale: float = TableConfig.init_scale,
        admit_after: int = TableConfig.admit_after,
        default_value: float = TableConfig.default_value,
        cache: MixCacheConfig | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name or "hash_table")
        if cache is not None and not isinstance(cache, MixCacheConfig):
            raise TypeError(f"cache must be a MixCacheConfig or None, got {cache!r}")
        self.dim = dim
        self.cache = cache
        self.optimizer = sparse_optimizers.get(optimizer or "sgd")
        self.config = dict(
            dim=dim,
            seed=seed,
            initializer=initializer,
            init_scale=init_scale,
            admit_after=admit_after,
            default_value=default_value,
        )
        self._shared_name = f"gmeta_table_{self.name}_{next(_names)}_{id(self)}"
        with tf.init_scope():
            self.handle = table_ops.create_table(
                self._shared_name,
                num_slots=self.optimizer.num_slots,
                slot_init=self.optimizer.slot_init,
                cache_capacity=cache.capacity if cache else 0,
                cache_min_count=cache.min_count if cache else 1,  # no cache: not read
                **self.config,
            )

    def __del__(self):
        try:
            if tf.executing_eagerly():
                table_ops.destroy_table(self.handle)
        except Exception:  # interpreter shutdown: nothing left to free
            pass

    @property
    def num_slots(self) -> int:
        return self.optimizer.num_slots

    def lookup_or_insert(self, ids, step=0, counts=None) -> tf.Tensor:
        """Rows [n, dim] of ids, inserting missing ones (see :meth:`lookup_for_update`)."""
        return self.lookup_for_update(ids, step=step, counts=counts).values

    def lookup_for_update(self, ids, step=0, counts=None) -> table_ops.LookedUp:
        """Rows of ids (inserting missing ones, counting ``counts`` occurrences at ``step``)
        and their row handles, which :meth:`apply_gradients` takes to update the same rows
        without probing the index again."""
        return table_ops.lookup_or_insert(self.handle, ids, self.dim, step=step, counts=counts)

    def lookup(self, ids) -> tf.Tensor:
        """Read-only: unknown or not yet admitted ids read the default row."""
        return table_ops.lookup(self.handle, ids, self.dim)[0]

    def apply_gradients(self, ids, grads, step=1, row_handles=None) -> tf.Tensor:
        """One step of the table's optimizer on the rows of ids (duplicates summed);
        ``row_handles`` from :meth:`lookup_for_update` spare the probes. Returns the
        number of rows updated."""
        return self.optimizer.apply(self.handle, ids, grads, step, row_handles=row_handles)

    def size(self) -> tf.Tensor:
        """Ids the table knows (admitted or still being counted), cached ones included."""
        return table_ops.table_size(self.handle)[0]

    def num_rows(self) -> tf.Tensor:
        """Ids admitted to a trainable row, cached ones included."""
        return table_ops.table_size(self.handle)[1]

    def evict(self, step, max_age: int = -1, max_size: int = -1) -> tf.Tensor:
        return table_ops.evict(self.handle, step, max_age=max_age, max_size=max_size)

    def export(self) -> table_ops.TableSnapshot:
        """Every entry, sorted by id (after writing the cache back: the trained state)."""
        return table_ops.export_table(self.handle, self.dim, self.num_slots)

    def import_(self, snapshot, clear_first: bool = True, shard_index=0, num_shards=1):
        """Loads a snapshot (e.g. from ``export``), keeping ids owned by this shard."""
        shape = tuple(snapshot.values.shape)
        if len(shape) != 2 or shape[1] != self.dim:
            raise ValueError(
                f"cannot import rows of shape {shape} (dim {shape[-1] if shape else None}) into table "
                f"'{self.name}' of dim {self.dim}"
            )
        return table_ops.import_table(
            self.handle, snapshot, clear_first=clear_first,
            shard_index=shard_index, num_shards=num_shards,
        )

    # ---- the cache's own ---------------------------------------------------------------
    def _require_cache(self, what: str) -> None:
        if self.cache is None:
            raise ValueError(f"table '{self.name}' has no cache: {what} needs one "
                             f"(create it with cache=MixCacheConfig(...))")

    def flush(self) -> int:
        """Writes changed cached rows back to the table; returns how many."""
        self._require_cache("flush")
        return int(table_ops.flush_cache(self.handle))

    def rebalance(self) -> int:
        """Makes the cache hold exactly the table's ``capacity`` most frequent ids (ties by
        ascending id), after writing the cache back: one pass over the index and a partial
        selection in C++, no export. Rows, slots and counters are unchanged. Returns the
        number of ids cached."""
        self._require_cache("rebalance")
        return int(table_ops.rebalance_cache(self.handle))

    def cache_stats(self) -> dict[str, float]:
        """Counters of the cache: capacity, size, lookups, hits (id occurrences),
        unique_lookups, unique_hits, admitted, evicted, written_back, and hit_rate."""
        self._require_cache("cache_stats")
        values, _ = table_ops.cache_stats(self.handle)
        stats: dict[str, float] = dict(zip(table_ops.CACHE_STATS,
                                           (int(v) for v in values.numpy())))
        stats["hit_rate"] = stats["hits"] / stats["lookups"] if stats["lookups"] else 0.0
        return stats

    def cached_ids(self) -> np.ndarray:
        """The ids cached now, sorted."""
        self._require_cache("cached_ids")
        return table_ops.cache_stats(self.handle)[1].numpy()

    # tf.train.Checkpoint integration: the table saves its full export.
    def _serialize_to_tensors(self):
        return dict(self.export()._asdict())

    def _restore_from_tensors(self, restored_tensors):
        snapshot = table_ops.TableSnapshot(
            **{k: restored_tensors[k] for k in table_ops.TableSnapshot._fields})
        return self.import_(snapshot)
