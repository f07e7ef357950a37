"""HashEmbedding: a Keras embedding layer over a growing hash table (single process)."""

from __future__ import annotations

import tensorflow as tf

from gmeta_tf import ops
from gmeta_tf.embedding import sparse_optimizers
from gmeta_tf.embedding.hash_table import HashTable
from gmeta_tf.embedding.update_trigger import add_update_weights

COMBINERS = (None, "sum", "mean")


class HashEmbedding(tf.keras.layers.Layer):
    """Embeds unbounded int64 ids through a hash table trained by a fused sparse optimizer.

    The optimizer is fused into the backward pass: computing the gradient of the loss with
    respect to ``layer.trainable_variables`` (its single ``update_trigger`` variable)
    applies one step of the layer's sparse optimizer to the rows the forward pass looked up,
    with their gradients folded per unique id (Virtual Sparse Id). The gradient returned for
    ``update_trigger`` is zero, so any Keras optimizer that also receives it changes
    nothing. Compute that gradient exactly once per forward pass (as ``fit`` and ordinary
    custom loops do).

    Inputs: an int64 (or int32) tensor of any shape -> ``shape + [dim]``; with a combiner
    ('sum' or 'mean'), a ``tf.RaggedTensor`` [B, None], a ``tf.SparseTensor`` [B, N] or a
    dense [B, N] tensor of multi-hot ids -> [B, dim]. ``training=False`` reads without
    inserting (unknown ids read the default row); otherwise missing ids are inserted.

    Example::

        layer = HashEmbedding(dim=16, optimizer=Adagrad(0.05))
        with tf.GradientTape() as tape:
            emb = layer(ids)                          # [B, 26] -> [B, 26, 16]
            loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, [1, 2]) - 1.0))
        tape.gradient(loss, layer.trainable_variables)  # updates the table
    """

    def __init__(
        self,
        dim: int,
        optimizer=None,
        combiner: str | None = None,
        seed: int = 0,
        initializer: str = "uniform",
        init_scale: float = 0.05,
        admit_after: int = 1,
        default_value: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if combiner not in COMBINERS:
            raise ValueError(f"combiner must be one of {COMBINERS}, got {combiner!r}")
        self.dim = dim
        self.combiner = combiner
        self.optimizer = sparse_optimizers.get(optimizer or "adagrad")
        self.table = HashTable(
            dim,
            optimizer=self.optimizer,
            seed=seed,
            initializer=initializer,
            init_scale=init_scale,
            admit_after=admit_after,
            default_value=default_value,
            name=f"{self.name}_table",
        )
        self._table_config = self.table.config

    def build(self, input_shape):
        add_update_weights(self)
        super().build(input_shape)

    def call(self, inputs, training=None):
        if isinstance(inputs, tf.RaggedTensor):
            return self._combine_ragged(inputs, training)
        if isinstance(inputs, tf.SparseTensor):
            return self._combine_sparse(inputs, training)
        ids = ops._ids(tf.reshape(inputs, [-1]), name=f"{self.name} inputs")
        emb = self.embed_flat(ids, training)
        out_shape = tf.concat([tf.shape(inputs), [self.dim]], axis=0)
        emb = tf.reshape(emb, out_shape)
        if self.combiner is None:
            return emb
        if self.combiner == "sum":
            return tf.reduce_sum(emb, axis=-2)
        return tf.reduce_mean(emb, axis=-2)

    def embed_flat(self, ids: tf.Tensor, training=None) -> tf.Tensor:
        """Rows [n, dim] of an int64 id vector: dedup once, look up unique ids, gather."""
        unique = ops.dedup(ids)
        if training is False:
            rows = self.table.lookup(unique.unique_ids)
        else:
            step = self.step.assign_add(1)
            rows = self._trained_rows(unique.unique_ids, unique.counts, step)
        return ops.gather_rows(rows, unique.inverse)

    def _trained_rows(self, unique_ids, counts, step):
        table = self.table

        @tf.custom_gradient
        def rows_with_fused_update(trigger):
            rows = table.lookup_or_insert(unique_ids, step=step, counts=counts)

            def apply_update(d_rows):
                # IndexedSlices from the gather fold to one gradient row per unique id.
                d_rows = tf.convert_to_tensor(d_rows)
                updated = table.apply_gradients(unique_ids, d_rows, step=step)
                with tf.control_dependencies([updated]):
                    return tf.zeros_like(trigger)

            return rows, apply_update

        return rows_with_fused_update(self.update_trigger)

    def _combine_ragged(self, ids: tf.RaggedTensor, training) -> tf.Tensor:
        if self.combiner is None:
            raise ValueError(f"{self.name}: ragged (multi-hot) ids need combiner='sum' or 'mean'")
        if ids.ragged_rank != 1:
            raise ValueError(f"{self.name}: ragged ids must be [batch, None], got {ids.shape}")
        emb = self.embed_flat(ops._ids(ids.flat_values, name=f"{self.name} inputs"), training)
        return self._segment_combine(emb, ids.value_rowids(), ids.nrows())

    def _combine_sparse(self, ids: tf.SparseTensor, training) -> tf.Tensor:
        if self.combiner is None:
            raise ValueError(f"{self.name}: sparse (multi-hot) ids need combiner='sum' or 'mean'")
        emb = self.embed_flat(ops._ids(ids.values, name=f"{self.name} inputs"), training)
        return self._segment_combine(emb, ids.indices[:, 0], ids.dense_shape[0])

    def _segment_combine(self, emb, row_ids, nrows) -> tf.Tensor:
        total = tf.math.unsorted_segment_sum(emb, row_ids, nrows)
        if self.combiner == "sum":
            return total
        count = tf.math.unsorted_segment_sum(tf.ones_like(row_ids, tf.float32), row_ids, nrows)
        return total / tf.maximum(count, 1.0)[:, None]

    def table_size(self) -> tf.Tensor:
        return self.table.size()

    def get_config(self):
        config = super().get_config()
        config.update(
            combiner=self.combiner,
            optimizer=dict(name=self.optimizer.name, **self.optimizer.__dict__),
            **self._table_config,
        )
        return config
