"""StaticEmbedding: frozen hash tables as stock TensorFlow ops, for serving.

TensorFlow Serving cannot load gmeta-tf's op library, so an exported model holds each
table as two variables: its ids, sorted, and their rows plus one last row, the default
row (what the training table returns for an unknown or not yet admitted id). A lookup is
``tf.searchsorted`` of the ids, a match check and a gather: stock ops only, and a
variable (not a constant) so tables far beyond the 2 GB GraphDef limit still save.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from gmeta_tf.embedding import FeatureConfig
from gmeta_tf.embedding.id_salt import salt_ids
from gmeta_tf.models.label_prior import lookup_sorted


class FrozenTable(NamedTuple):
    """One table's admitted ids and rows (any order), and its default row's value."""

    ids: np.ndarray
    values: np.ndarray
    default_value: float


class StaticEmbedding(tf.Module):
    """Drop-in, read-only stand-in of a ``ShardedHashEmbedding`` made of stock ops.

    Called like the trained layer (``{name: ids [n] or ragged [n, None]}`` ->
    ``{name: [n, dim]}``, multi-hot features pooled by their combiner), with the same rows.

    Args:
        tables: Table name -> its frozen content.
        features: The features, as configured in the trained layer.

    Example::

        emb = StaticEmbedding({"item": FrozenTable(ids, rows, 0.0)},
                              [FeatureConfig("item_id", "item")])
        emb({"item_id": tf.constant([3, 99], tf.int64)})["item_id"].shape   # [2, dim]
    """

    def __init__(self, tables: Mapping[str, FrozenTable], features: Sequence[FeatureConfig],
                 name: str = "static_embedding"):
        super().__init__(name=name)
        self._features = {f.name: (f.table, f.combiner, f.id_salt) for f in features}
        self.ids, self.rows = {}, {}
        for table, frozen in tables.items():
            order = np.argsort(frozen.ids, kind="stable")
            ids = np.asarray(frozen.ids, np.int64)[order]
            values = np.asarray(frozen.values, np.float32)[order]
            default = np.full([1, values.shape[1]], frozen.default_value, np.float32)
            self.ids[table] = tf.Variable(ids, trainable=False, name=f"{table}_ids")
            self.rows[table] = tf.Variable(np.concatenate([values, default]), trainable=False,
                                           name=f"{table}_rows")

    def lookup(self, table: str, ids: tf.Tensor) -> tf.Tensor:
        """Rows ``[n, dim]`` of an id vector; unknown ids get the default row."""
        return lookup_sorted(self.ids[table], self.rows[table], ids)

    def __call__(self, features: Mapping[str, tf.Tensor], training=None) -> dict:
        out = {}
        for name, value in features.items():
            if name not in self._features:
                raise KeyError(f"{self.name}: no feature {name!r}; it has {sorted(self._features)}")
            table, combiner, salt = self._features[name]
            if isinstance(value, tf.RaggedTensor):
                rows = self.lookup(table, salt_ids(value.flat_values, salt))
                out[name] = _pool(rows, value.value_rowids(), value.nrows(), combiner)
            else:
                out[name] = self.lookup(table, salt_ids(tf.reshape(value, [-1]), salt))
        return out


def _pool(rows: tf.Tensor, row_ids: tf.Tensor, nrows: tf.Tensor, combiner: str | None):
    """Pools multi-hot rows per example exactly as the training layer does."""
    if combiner is None:
        raise ValueError("multi-hot (ragged) ids need a combiner 'sum' or 'mean'")
    total = tf.math.unsorted_segment_sum(rows, row_ids, nrows)
    if combiner == "sum":
        return total
    count = tf.math.unsorted_segment_sum(tf.ones_like(row_ids, tf.float32), row_ids, nrows)
    return total / tf.maximum(count, 1.0)[:, None]
