"""ShardedHashEmbedding: model-parallel hash embeddings exchanged by all-to-all.

Rows are owned by rank ``OwnerOf(id) = hash(id) % size``. One call looks up every
feature of every table of a batch with one exchange each way (Virtual Sparse Id):

1. per table, the batch's ids are deduplicated once and grouped by owner (fused op);
2. ONE all-to-all sends each owner its unique ids of all tables (with a small header of
   per-table counts and the ids' occurrence counts, packed two int32 per int64);
3. each owner runs lookup-or-insert on its shard;
4. ONE all-to-all returns the rows; a gather expands them to the batch layout.

Backward, the row gradients go back through ONE all-to-all (the exchange's gradient) to
the owners, where a gradient function applies the table's fused sparse optimizer (it
folds duplicates, so an id requested by several ranks gets one update with the summed
gradient). Gradients are scaled by ``gradient_scale`` (1/size by default), so N ranks that
each average their loss over their share of a batch make the same update as one rank
averaging over the whole batch. Dense gradients never pass through here.

At size 1 (no horovodrun) the exchanges are identities: the same code path runs.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.trackable.data_structures import NoDependency

from gmeta_tf import distributed, ops
from gmeta_tf.embedding.config import FeatureConfig, TableConfig
from gmeta_tf.embedding.hash_table import HashTable


class _FlatFeature(NamedTuple):
    ids: tf.Tensor  # int64 vector
    restore: Callable[[tf.Tensor], tf.Tensor]  # rows [len(ids), dim] -> feature output


def _flatten(config: FeatureConfig, value) -> _FlatFeature:
    """A feature's ids as a vector, plus how to shape its rows back (and pool them)."""
    name = f"feature '{config.name}'"
    if isinstance(value, tf.Tensor) and config.pad_id is not None:
        value = tf.RaggedTensor.from_tensor(value, padding=tf.cast(config.pad_id, value.dtype))
    if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
        if config.combiner is None:
            raise ValueError(f"{name}: multi-hot (ragged/sparse) ids need combiner 'sum' or "
                             f"'mean' in its FeatureConfig")
        if isinstance(value, tf.RaggedTensor):
            if value.ragged_rank != 1:
                raise ValueError(f"{name}: ragged ids must be [batch, None], got {value.shape}")
            ids, row_ids, nrows = value.flat_values, value.value_rowids(), value.nrows()
        else:
            ids, row_ids, nrows = value.values, value.indices[:, 0], value.dense_shape[0]
        return _FlatFeature(ops._ids(ids, name), _pooler(config.combiner, row_ids, nrows))
    value = tf.convert_to_tensor(value)
    shape = tf.shape(value, out_type=tf.int64)
    ids = ops._ids(tf.reshape(value, [-1]), name)

    def restore(rows):
        out = tf.reshape(rows, tf.concat([shape, [tf.shape(rows, out_type=tf.int64)[1]]], 0))
        if config.combiner == "sum":
            return tf.reduce_sum(out, axis=-2)
        if config.combiner == "mean":
            return tf.reduce_mean(out, axis=-2)
        return out

    return _FlatFeature(ids, restore)


def _pooler(combiner: str, row_ids, nrows) -> Callable[[tf.Tensor], tf.Tensor]:
    def pool(rows):
        total = tf.math.unsorted_segment_sum(rows, row_ids, nrows)
        if combiner == "sum":
            return total
        count = tf.math.unsorted_segment_sum(tf.ones_like(row_ids, tf.float32), row_ids, nrows)
        return total / tf.maximum(count, 1.0)[:, None]

    return pool


def _pack_int32(values: tf.Tensor) -> tf.Tensor:
    """int32 vector -> int64 vector of half the length (two per word)."""
    padded = tf.pad(values, [[0, tf.size(values) % 2]])
    return tf.bitcast(tf.reshape(padded, [-1, 2]), tf.int64)


def _unpack_int32(words: tf.Tensor, n) -> tf.Tensor:
    return tf.reshape(tf.bitcast(words, tf.int32), [-1])[:n]


class ShardedHashEmbedding(tf.keras.layers.Layer):
    """All sparse features of a model, in hash tables sharded over the ranks by id.

    Example::

        emb = ShardedHashEmbedding(
            tables=[TableConfig("user", 16), TableConfig("item", 16)],
            features=[FeatureConfig("user_id", "user"),
                      FeatureConfig("genres", "item", combiner="mean")])
        out = emb({"user_id": ids,               # [B] int64
                   "genres": genre_ids})         # ragged [B, None]
        out["user_id"].shape, out["genres"].shape  # [B, 16], [B, 16]

    Train it by computing the loss gradient with respect to ``emb.trainable_variables``
    (its ``update_trigger``, whose gradient is zero) exactly once per call: that sends the
    row gradients to their owners and applies each table's fused sparse optimizer there.
    ``training=False`` reads without inserting.
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        features: Sequence[FeatureConfig],
        gradient_scale: float | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.table_configs = NoDependency(tuple(tables))
        self.feature_configs = NoDependency(tuple(features))
        self._validate()
        self.world_size = distributed.size()
        self.world_rank = distributed.rank()
        self.gradient_scale = (1.0 / self.world_size) if gradient_scale is None else gradient_scale
        # Each rank's shard; checkpointed per rank by gmeta_tf.checkpoint, not by the
        # model's tf.train.Checkpoint (rank 0 alone would hold only its own shard).
        self.shards = NoDependency({
            t.name: HashTable(t.dim, name=f"{self.name}_{t.name}", **t.table_kwargs())
            for t in self.table_configs
        })

    def _validate(self):
        names = [t.name for t in self.table_configs]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        if not self.table_configs:
            raise ValueError("ShardedHashEmbedding needs at least one TableConfig")
        seen = set()
        for f in self.feature_configs:
            if f.table not in names:
                raise ValueError(f"feature '{f.name}' uses table '{f.table}', which is not one "
                                 f"of the tables {names}")
            if f.name in seen:
                raise ValueError(f"feature '{f.name}' is configured twice")
            seen.add(f.name)

    def build(self, input_shape):
        self.update_trigger = self.add_weight(
            name="update_trigger", shape=[], initializer="zeros", trainable=True
        )
        self.update_trigger._gmeta_update_trigger = True
        self.step = self.add_weight(
            name="step", shape=[], dtype=tf.int64, initializer="zeros", trainable=False
        )
        super().build(input_shape)

    # ---- forward ------------------------------------------------------------------------
    def call(self, features, training=None):
        missing = [f.name for f in self.feature_configs if f.name not in features]
        if missing:
            raise KeyError(f"{self.name}: input has no feature(s) {missing}; it has "
                           f"{sorted(features)}")
        flat = {f.name: _flatten(f, features[f.name]) for f in self.feature_configs}
        by_table = {t.name: [f for f in self.feature_configs if f.table == t.name]
                    for t in self.table_configs}
        table_ids = [
            tf.concat([flat[f.name].ids for f in by_table[t.name]], 0)
            if by_table[t.name] else tf.zeros([0], tf.int64)
            for t in self.table_configs
        ]
        table_rows = self.lookup(table_ids, training=training)
        out = {}
        for t, rows in zip(self.table_configs, table_rows):
            feats = by_table[t.name]
            sizes = [tf.size(flat[f.name].ids) for f in feats]
            for f, part in zip(feats, tf.split(rows, sizes, num=len(feats)) if feats else []):
                out[f.name] = flat[f.name].restore(part)
        return out

    def lookup(self, table_ids: Sequence[tf.Tensor], training=None) -> list[tf.Tensor]:
        """Rows for raw id vectors, one per table (in table order): [n_t, dim_t] each."""
        size = self.world_size
        num_tables = len(self.table_configs)
        dims = [t.dim for t in self.table_configs]
        dedups = [ops.dedup(ids, size) for ids in table_ids]
        splits = tf.stack([d.splits for d in dedups])  # [tables, owners] int32

        # Requester -> owners: per owner [per-table counts, ids..., packed occurrences].
        ids_by_owner = [tf.split(d.unique_ids, d.splits, num=size) for d in dedups]
        counts_by_owner = [tf.split(tf.cast(d.counts, tf.int32), d.splits, num=size)
                           for d in dedups]
        segments, send_splits = [], []
        for r in range(size):
            packed = _pack_int32(tf.concat([c[r] for c in counts_by_owner], 0))
            segments += [tf.cast(splits[:, r], tf.int64)] + [i[r] for i in ids_by_owner]
            segments.append(packed)
            send_splits.append(num_tables + tf.reduce_sum(splits[:, r]) + tf.size(packed))
        received, received_splits = distributed.alltoall(tf.concat(segments, 0),
                                                         tf.stack(send_splits))

        # Owner: parse each requester's segment, look up the shard.
        owner_ids = [[] for _ in range(num_tables)]
        owner_counts = [[] for _ in range(num_tables)]
        headers = []
        for seg in tf.split(received, received_splits, num=size):
            header = seg[:num_tables]
            n = tf.cast(tf.reduce_sum(header), tf.int32)
            headers.append(header)
            counts = _unpack_int32(seg[num_tables + n:], n)
            for t, (ids_t, counts_t) in enumerate(zip(
                    tf.split(seg[num_tables:num_tables + n], header, num=num_tables),
                    tf.split(counts, header, num=num_tables))):
                owner_ids[t].append(ids_t)
                owner_counts[t].append(counts_t)
        owner_ids = [tf.concat(p, 0) for p in owner_ids]
        owner_counts = [tf.cast(tf.concat(p, 0), tf.int64) for p in owner_counts]
        owner_rows = self._owner_rows(owner_ids, owner_counts, training)

        # Owners -> requesters: the rows, flattened, in the order they were asked for.
        rows_by_requester = [
            tf.split(rows, [h[t] for h in headers], num=size) for t, rows in enumerate(owner_rows)
        ]
        reply, reply_splits = [], []
        for q in range(size):
            reply += [tf.reshape(rows_by_requester[t][q], [-1]) for t in range(num_tables)]
            reply_splits.append(tf.add_n([tf.cast(headers[q][t], tf.int32) * dims[t]
                                          for t in range(num_tables)]))
        returned, _ = distributed.alltoall(tf.concat(reply, 0), tf.stack(reply_splits))

        # Requester: rows of each table's unique ids (grouped by owner), then expand.
        expected = [tf.add_n([splits[t, r] * dims[t] for t in range(num_tables)])
                    for r in range(size)]
        unique_rows = [[] for _ in range(num_tables)]
        for r, part in enumerate(tf.split(returned, tf.stack(expected), num=size)):
            pieces = tf.split(part, [splits[t, r] * dims[t] for t in range(num_tables)],
                              num=num_tables)
            for t, piece in enumerate(pieces):
                unique_rows[t].append(tf.reshape(piece, [-1, dims[t]]))
        return [tf.gather(tf.concat(unique_rows[t], 0), dedups[t].inverse)
                for t in range(num_tables)]

    def _owner_rows(self, ids: list, counts: list, training) -> list:
        shards = [self.shards[t.name] for t in self.table_configs]
        if training is False:
            return [shard.lookup(i) for shard, i in zip(shards, ids)]
        step = self.step.assign_add(1)
        scale = self.gradient_scale

        @tf.custom_gradient
        def rows_with_fused_update(trigger):
            rows = [shard.lookup_or_insert(i, step=step, counts=c)
                    for shard, i, c in zip(shards, ids, counts)]

            def apply_updates(*d_rows):
                updates = [
                    shard.apply_gradients(i, tf.convert_to_tensor(d) * scale, step=step)
                    for shard, i, d in zip(shards, ids, d_rows) if d is not None
                ]
                with tf.control_dependencies(updates):
                    return tf.zeros_like(trigger)

            return rows, apply_updates

        return list(rows_with_fused_update(self.update_trigger))

    # ---- state --------------------------------------------------------------------------
    def table_sizes(self) -> dict[str, int]:
        """Ids held by this rank's shard of each table."""
        return {name: int(shard.size()) for name, shard in self.shards.items()}

    def export_shards(self) -> dict[str, dict[str, np.ndarray]]:
        """This rank's shard of every table, as NumPy arrays (see ops.TableSnapshot)."""
        return {name: {k: v.numpy() for k, v in shard.export()._asdict().items()}
                for name, shard in self.shards.items()}

    def import_shards(self, snapshots: Sequence[dict[str, dict[str, np.ndarray]]]) -> None:
        """Loads snapshots saved by any number of ranks, keeping the ids this rank owns
        under the current world size (resharding)."""
        for name, shard in self.shards.items():
            first = True
            for snap in snapshots:
                if name not in snap:
                    raise KeyError(f"{self.name}: a saved shard set has no table '{name}' "
                                   f"(it has {sorted(snap)})")
                shard.import_(ops.TableSnapshot(**snap[name]), clear_first=first,
                              shard_index=self.world_rank, num_shards=self.world_size)
                first = False

    def get_config(self):
        config = super().get_config()
        config.update(
            tables=[dict(t.__dict__, optimizer=dict(name=t.optimizer.name, **t.optimizer.__dict__))
                    for t in self.table_configs],
            features=[dict(f.__dict__) for f in self.feature_configs],
            gradient_scale=self.gradient_scale,
        )
        return config


def dense_variables(model: tf.keras.layers.Layer) -> list[tf.Variable]:
    """The model's trainable variables that a dense optimizer and all-reduce should see."""
    return [v for v in model.trainable_variables if not getattr(v, "_gmeta_update_trigger", False)]


def embedding_triggers(model: tf.keras.layers.Layer) -> list[tf.Variable]:
    """The update triggers of the model's hash embeddings (gradient = fused update)."""
    return [v for v in model.trainable_variables if getattr(v, "_gmeta_update_trigger", False)]
