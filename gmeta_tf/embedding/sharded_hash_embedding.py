"""ShardedHashEmbedding: model-parallel hash embeddings exchanged by all-to-all.

Rows are owned by rank ``OwnerOf(id) = hash(id) % size``. One call looks up every
feature of every table of a batch with two all-to-alls forward (unique ids out, their
rows back) and one backward (Virtual Sparse Id):

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

The same exchanges are available as two explicit phases for hybrid training
(``gmeta_tf.training.hybrid``): :meth:`ShardedHashEmbedding.pull` (steps 1-4, no autodiff)
and :meth:`ShardedHashEmbedding.push` (the backward all-to-all and the fused update), with
the dense step in between. Tables with a ``TableConfig.cache`` (or listed in ``caches``)
get a MixCache inside their shard (see :class:`~gmeta_tf.embedding.HashTable`).

The owners' lookups return row handles with the rows; the fused update takes them back,
so it reaches the rows without probing the index a second time.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.trackable.data_structures import NoDependency

from gmeta_tf import distributed, ops
from gmeta_tf.embedding import table_ops
from gmeta_tf.embedding.config import FeatureConfig, MixCacheConfig, TableConfig
from gmeta_tf.embedding.hash_table import HashTable
from gmeta_tf.embedding.update_trigger import add_update_weights
from gmeta_tf.embedding.id_salt import salt_ids


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
        return _FlatFeature(salt_ids(ops._ids(ids, name), config.id_salt),
                            _pooler(config.combiner, row_ids, nrows))
    value = tf.convert_to_tensor(value)
    shape = tf.shape(value, out_type=tf.int64)
    ids = salt_ids(ops._ids(tf.reshape(value, [-1]), name), config.id_salt)

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


class _Request(NamedTuple):
    """The forward exchange of ids, seen from both ends (one per lookup)."""

    dedups: list  # per table: ops.Dedup of this rank's ids
    splits: tf.Tensor  # [tables, owners] int32: unique ids this rank asks of each owner
    owner_ids: list  # per table: ids this rank owns that were asked, requester by requester
    owner_counts: list  # per table: their occurrence counts
    headers: list  # per requester: [tables] int64 ids it asked of this rank


class PulledRows(NamedTuple):
    """What :meth:`ShardedHashEmbedding.pull` fetched for one batch, and what
    :meth:`ShardedHashEmbedding.push` needs to send the batch's row gradients back.

    All fields are tensors (or tuples of tensors, one per table in table order), so a
    PulledRows crosses ``tf.function`` boundaries and thread queues as it is.
    """

    unique_ids: tuple  # per table: [U_t] this rank's unique ids, grouped by owner
    unique_rows: tuple  # per table: [U_t, dim_t] their rows
    inverse: tuple  # per table: [n_t] int32, raw ids -> unique rows
    splits: tf.Tensor  # [tables, owners] int32
    owner_ids: tuple  # per table: ids this rank looked up as their owner
    headers: tf.Tensor  # [requesters, tables] int64
    step: tf.Tensor  # int64 scalar: the layer step of this lookup (and of its update)
    owner_handles: tuple = ()  # per table: row handles of owner_ids (for the update)


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
        caches: Mapping[str, MixCacheConfig] | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.table_configs = NoDependency(tuple(tables))
        self.feature_configs = NoDependency(tuple(features))
        self.cache_configs = NoDependency(dict(caches or {}))
        self._validate()
        # One map of every cached table: TableConfig.cache, plus the older ``caches=``.
        self.cache_configs = NoDependency({**{t.name: t.cache for t in self.table_configs
                                              if t.cache is not None}, **self.cache_configs})
        self.world_size = distributed.size()
        self.world_rank = distributed.rank()
        self.gradient_scale = (1.0 / self.world_size) if gradient_scale is None else gradient_scale
        # Each rank's shard; checkpointed per rank by gmeta_tf.checkpoint, not by the
        # model's tf.train.Checkpoint (rank 0 alone would hold only its own shard).
        self.shards = NoDependency({t.name: self._make_shard(t) for t in self.table_configs})

    def _make_shard(self, config: TableConfig) -> HashTable:
        return HashTable(config.dim, name=f"{self.name}_{config.name}",
                         cache=self.cache_configs.get(config.name), **config.table_kwargs())

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
        for table, cache in self.cache_configs.items():
            if table not in names:
                raise ValueError(f"caches: '{table}' is not one of the tables {names}")
            if not isinstance(cache, MixCacheConfig):
                raise TypeError(f"caches['{table}'] must be a MixCacheConfig, got {cache!r}")
            config = self.table_configs[names.index(table)]
            if config.cache is not None:
                raise ValueError(f"table '{table}' has a cache both in its TableConfig.cache "
                                 f"({config.cache}) and in caches= ({cache}): give it once")

    def build(self, input_shape):
        add_update_weights(self)
        super().build(input_shape)

    # ---- forward ------------------------------------------------------------------------
    def call(self, features, training=None):
        table_ids, assemble = self.prepare(features)
        return assemble(self.lookup(table_ids, training=training))

    def prepare(self, features) -> tuple[list[tf.Tensor], Callable[[list], dict]]:
        """Splits a feature dict into raw id vectors, one per table (in table order), and
        a function mapping their rows (``[n_t, dim_t]`` per table) to the layer's output."""
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

        def assemble(table_rows: list) -> dict:
            out = {}
            for t, rows in zip(self.table_configs, table_rows):
                feats = by_table[t.name]
                sizes = [tf.size(flat[f.name].ids) for f in feats]
                for f, part in zip(feats, tf.split(rows, sizes, num=len(feats)) if feats else []):
                    out[f.name] = flat[f.name].restore(part)
            return out

        return table_ids, assemble

    def lookup(self, table_ids: Sequence[tf.Tensor], training=None) -> list[tf.Tensor]:
        """Rows for raw id vectors, one per table (in table order): [n_t, dim_t] each."""
        request = self._request(table_ids)
        owner_rows = self._owner_rows(request.owner_ids, request.owner_counts, training)
        unique_rows = self._reply(owner_rows, request.headers, request.splits)
        return [ops.gather_rows(rows, d.inverse) for rows, d in zip(unique_rows, request.dedups)]

    def _request(self, table_ids: Sequence[tf.Tensor]) -> _Request:
        """Dedup per table, then ONE all-to-all of ids (with a header) to their owners."""
        size = self.world_size
        num_tables = len(self.table_configs)
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

        # Owner: parse each requester's segment.
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
        return _Request(dedups, splits,
                        [tf.concat(p, 0) for p in owner_ids],
                        [tf.cast(tf.concat(p, 0), tf.int64) for p in owner_counts],
                        headers)

    def _reply(self, owner_rows: list, headers: list, splits: tf.Tensor) -> list[tf.Tensor]:
        """ONE all-to-all of rows back to the requesters; returns each table's rows of this
        rank's unique ids (grouped by owner, as dedup ordered them)."""
        size = self.world_size
        num_tables = len(self.table_configs)
        dims = [t.dim for t in self.table_configs]
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

        # Requester: rows of each table's unique ids (grouped by owner).
        unique_rows = [[] for _ in range(num_tables)]
        for r, part in enumerate(tf.split(returned, self._floats_per_owner(splits), num=size)):
            pieces = tf.split(part, [splits[t, r] * dims[t] for t in range(num_tables)],
                              num=num_tables)
            for t, piece in enumerate(pieces):
                unique_rows[t].append(tf.reshape(piece, [-1, dims[t]]))
        return [tf.concat(unique_rows[t], 0) for t in range(num_tables)]

    def _floats_per_owner(self, splits: tf.Tensor) -> tf.Tensor:
        """Row values this rank exchanges with each owner: [owners] int32."""
        dims = [t.dim for t in self.table_configs]
        return tf.stack([tf.add_n([splits[t, r] * dims[t] for t in range(len(dims))])
                         for r in range(self.world_size)])

    # ---- phases (hybrid training) -------------------------------------------------------
    def pull(self, table_ids: Sequence[tf.Tensor]) -> PulledRows:
        """The forward half of a training step, without autodiff: dedup, the all-to-all of
        ids, lookup-or-insert on the owners, the all-to-all of rows back.

        Expand with ``tf.gather(pulled.unique_rows[t], pulled.inverse[t])``; hand the
        gradients of the loss with respect to ``pulled.unique_rows`` to :meth:`push`.
        Pulls and pushes must be issued in the same order on every rank.
        """
        request = self._request(table_ids)
        step = self.step.assign_add(1)
        shards = [self.shards[t.name] for t in self.table_configs]
        looked_up = [shard.lookup_for_update(i, step=step, counts=c)
                     for shard, i, c in zip(shards, request.owner_ids, request.owner_counts)]
        unique_rows = self._reply([r.values for r in looked_up], request.headers,
                                  request.splits)
        return PulledRows(tuple(d.unique_ids for d in request.dedups), tuple(unique_rows),
                          tuple(d.inverse for d in request.dedups),
                          request.splits, tuple(request.owner_ids),
                          tf.stack(request.headers), step,
                          tuple(r.row_handles for r in looked_up))

    def push(self, pulled: PulledRows, unique_row_grads: Sequence[tf.Tensor]) -> tf.Tensor:
        """The backward half: ONE all-to-all of the row gradients to the owners (counted
        as ``alltoall_grad``), where each table's fused optimizer applies them, scaled by
        ``gradient_scale``. Returns the number of rows updated on this rank."""
        size = self.world_size
        num_tables = len(self.table_configs)
        dims = [t.dim for t in self.table_configs]
        by_owner = [tf.split(g, pulled.splits[t], num=size)
                    for t, g in enumerate(unique_row_grads)]
        flat = tf.concat([tf.reshape(by_owner[t][r], [-1])
                          for r in range(size) for t in range(num_tables)], 0)
        received = _gradient_alltoall(flat, self._floats_per_owner(pulled.splits))
        headers = tf.cast(pulled.headers, tf.int32)
        owner_grads = [[] for _ in range(num_tables)]
        from_requester = tf.stack([tf.add_n([headers[q, t] * dims[t] for t in range(num_tables)])
                                   for q in range(size)])
        for q, seg in enumerate(tf.split(received, from_requester, num=size)):
            pieces = tf.split(seg, [headers[q, t] * dims[t] for t in range(num_tables)],
                              num=num_tables)
            for t, piece in enumerate(pieces):
                owner_grads[t].append(tf.reshape(piece, [-1, dims[t]]))
        handles = pulled.owner_handles or (None,) * num_tables
        updated = [
            self.shards[t.name].apply_gradients(
                pulled.owner_ids[i], self._scaled(tf.concat(owner_grads[i], 0)),
                step=pulled.step, row_handles=handles[i])
            for i, t in enumerate(self.table_configs)
        ]
        return tf.add_n(updated)

    def _owner_rows(self, ids: list, counts: list, training) -> list:
        shards = [self.shards[t.name] for t in self.table_configs]
        if training is False:
            return [shard.lookup(i) for shard, i in zip(shards, ids)]
        step = self.step.assign_add(1)

        @tf.custom_gradient
        def rows_with_fused_update(trigger):
            looked_up = [shard.lookup_for_update(i, step=step, counts=c)
                         for shard, i, c in zip(shards, ids, counts)]
            rows = [r.values for r in looked_up]

            def apply_updates(*d_rows):
                updates = [
                    shard.apply_gradients(i, self._scaled(tf.convert_to_tensor(d)), step=step,
                                          row_handles=r.row_handles)
                    for shard, i, d, r in zip(shards, ids, d_rows, looked_up) if d is not None
                ]
                with tf.control_dependencies(updates):
                    return tf.zeros_like(trigger)

            return rows, apply_updates

        return list(rows_with_fused_update(self.update_trigger))

    def _scaled(self, grads: tf.Tensor) -> tf.Tensor:
        """Row gradients times ``gradient_scale`` (no pass over them when it is 1)."""
        return grads if self.gradient_scale == 1.0 else grads * self.gradient_scale

    # ---- state --------------------------------------------------------------------------
    def rebalance_caches(self, step: int) -> int:
        """Re-fills each MixCache whose ``rebalance_every`` divides ``step`` with its shard's
        most frequent ids (local work on this rank's shards: no collective). Returns how
        many caches were re-filled."""
        refilled = 0
        for shard in self.shards.values():
            every = shard.cache.rebalance_every if shard.cache is not None else 0
            if every and step % every == 0:
                shard.rebalance()
                refilled += 1
        return refilled

    def cache_stats(self) -> dict[str, dict[str, float]]:
        """This rank's MixCache counters per cached table (see HashTable.cache_stats)."""
        return {name: shard.cache_stats() for name, shard in self.shards.items()
                if shard.cache is not None}

    def table_sizes(self) -> dict[str, int]:
        """Rows (admitted ids) held by this rank's shard of each table."""
        return {name: int(shard.num_rows()) for name, shard in self.shards.items()}

    def table_ids(self) -> dict[str, int]:
        """Ids (admitted or still being counted) known to this rank's shard of each table."""
        return {name: int(shard.size()) for name, shard in self.shards.items()}

    def export_shards(self) -> dict[str, dict[str, np.ndarray]]:
        """This rank's shard of every table, as NumPy arrays (see table_ops.TableSnapshot)."""
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
                shard.import_(table_ops.TableSnapshot(**snap[name]), clear_first=first,
                              shard_index=self.world_rank, num_shards=self.world_size)
                first = False

    def get_config(self):
        config = super().get_config()
        config.update(
            # Each table's cache is listed once, under ``caches``.
            tables=[dict({k: v for k, v in t.__dict__.items() if k != "cache"},
                         optimizer=dict(name=t.optimizer.name, **t.optimizer.__dict__))
                    for t in self.table_configs],
            features=[dict(f.__dict__) for f in self.feature_configs],
            gradient_scale=self.gradient_scale,
            caches={name: dict(c.__dict__) for name, c in self.cache_configs.items()},
        )
        return config


_LAYER_KEYS = ("name", "trainable", "dtype")


class HashEmbedding(ShardedHashEmbedding):
    """ShardedHashEmbedding with one table and one feature, called on the id tensor itself.

    The same layer, exchanges and fused update (at world size 1, no horovodrun, the
    exchanges are identities); only the input is a tensor instead of a feature dict, so it
    drops into ``tf.keras.Sequential`` like ``tf.keras.layers.Embedding``. Its table is
    ``layer.table`` (this rank's shard), tracked, so ``tf.train.Checkpoint(embedding=layer)``
    saves and restores it.

    Inputs: an int64 (or int32) tensor of any shape -> ``shape + [dim]``; with a combiner
    ('sum' or 'mean'), a ``tf.RaggedTensor`` [B, None], a ``tf.SparseTensor`` [B, N] or a
    dense [B, N] tensor of multi-hot ids -> [B, dim]. ``training=False`` reads without
    inserting (unknown ids read the default row).

    Example::

        layer = HashEmbedding(dim=16, optimizer=Adagrad(0.05))
        with tf.GradientTape() as tape:
            emb = layer(ids)                          # [B, 26] -> [B, 26, 16]
            loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, [1, 2]) - 1.0))
        tape.gradient(loss, layer.trainable_variables)  # updates the table
    """

    FEATURE = "ids"

    def __init__(self, dim: int, combiner: str | None = None, **kwargs):
        layer_kwargs = {k: kwargs.pop(k) for k in _LAYER_KEYS if k in kwargs}
        # the table's options (optimizer, seed, initializer, ...) and their defaults are
        # TableConfig's
        table = TableConfig(self.FEATURE, dim, **kwargs)
        super().__init__([table], [FeatureConfig(self.FEATURE, self.FEATURE, combiner=combiner)],
                         **layer_kwargs)
        self.dim = dim
        self.table = self.shards[self.FEATURE]

    def call(self, inputs, training=None):
        return super().call({self.FEATURE: inputs}, training=training)[self.FEATURE]

    def table_size(self) -> tf.Tensor:
        return self.table.size()

    def get_config(self):
        table, feature = self.table_configs[0], self.feature_configs[0]
        config = tf.keras.layers.Layer.get_config(self)
        config.update(dim=self.dim, combiner=feature.combiner, seed=table.seed,
                      optimizer=dict(name=table.optimizer.name, **table.optimizer.__dict__),
                      initializer=table.initializer, init_scale=table.init_scale,
                      admit_after=table.admit_after, default_value=table.default_value,
                      cache=dict(table.cache.__dict__) if table.cache else None)
        return config


def _gradient_alltoall(tensor: tf.Tensor, splits: tf.Tensor) -> tf.Tensor:
    """The all-to-all of row gradients to their owners, counted as ``alltoall_grad`` like
    the gradient of the forward exchange it replaces in :meth:`ShardedHashEmbedding.push`."""
    return distributed.alltoall(tensor, splits, kind="alltoall_grad")[0]
