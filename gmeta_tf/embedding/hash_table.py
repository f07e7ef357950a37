"""HashTable: the Python owner of one table resource of the op library."""

from __future__ import annotations

import itertools

import tensorflow as tf

from gmeta_tf import ops
from gmeta_tf.embedding import sparse_optimizers

_names = itertools.count()


class HashTable(tf.Module):
    """An int64 -> float32[dim] table that grows without a vocabulary.

    Rows of new ids are a deterministic function of (seed, id), so every rank and every
    restart agrees on them. The table is checkpointable with ``tf.train.Checkpoint`` (it
    saves its full export: ids, rows, optimizer slots, counters).

    Example::

        table = HashTable(dim=8, optimizer=Adagrad(0.05))
        rows = table.lookup_or_insert(tf.constant([3, -7], tf.int64))  # [2, 8]
        table.apply_gradients([3, -7], tf.ones([2, 8]))
    """

    def __init__(
        self,
        dim: int,
        optimizer=None,
        seed: int = 0,
        initializer: str = "uniform",
        init_scale: float = 0.05,
        admit_after: int = 1,
        default_value: float = 0.0,
        name: str | None = None,
    ):
        super().__init__(name=name or "hash_table")
        self.dim = dim
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
            self.handle = ops.create_table(
                self._shared_name,
                num_slots=self.optimizer.num_slots,
                slot_init=self.optimizer.slot_init,
                **self.config,
            )

    def __del__(self):
        try:
            if tf.executing_eagerly():
                ops.destroy_table(self.handle)
        except Exception:  # interpreter shutdown: nothing left to free
            pass

    @property
    def num_slots(self) -> int:
        return self.optimizer.num_slots

    def lookup_or_insert(self, ids, step=0, counts=None) -> tf.Tensor:
        return ops.lookup_or_insert(self.handle, ids, self.dim, step=step, counts=counts)

    def lookup(self, ids) -> tf.Tensor:
        """Read-only: unknown or not yet admitted ids read the default row."""
        return ops.lookup(self.handle, ids, self.dim)[0]

    def apply_gradients(self, ids, grads, step=1) -> tf.Tensor:
        return self.optimizer.apply(self.handle, ids, grads, step)

    def size(self) -> tf.Tensor:
        """Ids the table knows (admitted or still being counted)."""
        return ops.table_size(self.handle)[0]

    def num_rows(self) -> tf.Tensor:
        """Ids admitted to a trainable row."""
        return ops.table_size(self.handle)[1]

    def evict(self, step, max_age: int = -1, max_size: int = -1) -> tf.Tensor:
        return ops.evict(self.handle, step, max_age=max_age, max_size=max_size)

    def export(self) -> ops.TableSnapshot:
        return ops.export_table(self.handle, self.dim, self.num_slots)

    def import_(self, snapshot, clear_first: bool = True, shard_index=0, num_shards=1):
        """Loads a snapshot (e.g. from ``export``), keeping ids owned by this shard."""
        shape = tuple(snapshot.values.shape)
        if len(shape) != 2 or shape[1] != self.dim:
            raise ValueError(
                f"cannot import rows of shape {shape} (dim {shape[-1] if shape else None}) into table "
                f"'{self.name}' of dim {self.dim}"
            )
        return ops.import_table(
            self.handle, snapshot, clear_first=clear_first,
            shard_index=shard_index, num_shards=num_shards,
        )

    # tf.train.Checkpoint integration: the table saves its full export.
    def _serialize_to_tensors(self):
        return dict(self.export()._asdict())

    def _restore_from_tensors(self, restored_tensors):
        snapshot = ops.TableSnapshot(**{k: restored_tensors[k] for k in ops.TableSnapshot._fields})
        return self.import_(snapshot)
