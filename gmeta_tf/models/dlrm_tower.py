"""DLRMTower: bottom MLP on dense features, pairwise dot interactions, top MLP."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from gmeta_tf.models.dense_stack import (Params, add_dense_stack, apply_dense_stack,
                                         layer_names)
from gmeta_tf.models.tower import Tower


class DLRMTower(Tower):
    """The DLRM / DeepFM-style CTR tower (Naumov et al. 2019; Guo et al. 2017).

    The dense features go through a bottom MLP to one ``embedding_dim`` vector; it and the
    sparse embeddings interact by all pairwise dot products (the factorization-machine
    term); the products, concatenated with the bottom vector, go through a top MLP to one
    logit. Without dense features the interactions are among the embeddings only and the
    top MLP also sees the embeddings themselves (DeepFM's deep part).

    With ``linear`` the tower also has the first-order term of a factorization machine (the
    "wide" part of DeepFM, a logistic regression inside the model): each embedded row
    carries one more column, its id's linear weight, and the logit adds the sum of the
    features' weights (a multi-hot feature's pooled one) plus a linear map of the dense
    features. The tower then reads rows of ``embedding_dim + 1`` (``input_width``).

    Args:
        sparse_features: Embedded feature names.
        embedding_dim: Width of every embedding (and of the bottom MLP's output).
        dense_features: Dense feature name -> width.
        bottom_units: Hidden widths of the bottom MLP (its last layer has ``embedding_dim``).
        top_units: Hidden widths of the top MLP (its last layer has 1 unit).
        seed: Initializer seed.
        linear: Add the first-order term (see above).

    Example::

        tower = DLRMTower([f"C{i}" for i in range(26)], 16, {"dense": 13})
        tower({**{f"C{i}": e for i in range(26)}, "dense": d})   # e [B, 16], d [B, 13] -> [B]
    """

    def __init__(self, sparse_features: Sequence[str], embedding_dim: int,
                 dense_features: Mapping[str, int] | None = None,
                 bottom_units: Sequence[int] = (64,), top_units: Sequence[int] = (64, 32),
                 seed: int = 0, linear: bool = False, **kwargs):
        super().__init__(sparse_features, embedding_dim, dense_features, seed, linear, **kwargs)
        self.bottom_units = tuple(int(u) for u in bottom_units)
        self.top_units = tuple(int(u) for u in top_units)
        vectors = len(self.sparse_features) + (1 if self.dense_features else 0)
        upper = np.triu_indices(vectors, k=1)
        self._pairs = tf.constant(upper[0] * vectors + upper[1], tf.int32)
        self._num_vectors = vectors

    @property
    def _top_input_width(self) -> int:
        pairs = self._num_vectors * (self._num_vectors - 1) // 2
        if self.dense_features:
            return pairs + self.embedding_dim
        return pairs + self.embedding_dim * len(self.sparse_features)

    @property
    def final_layer(self) -> tuple[str, str]:
        """The top MLP's last layer."""
        return layer_names("top", len(self.top_units) + 1)[-1]

    def _create_weights(self) -> dict[str, tf.Variable]:
        params = {}
        if self.dense_features:
            params.update(add_dense_stack(self, "bottom", self.dense_width,
                                          (*self.bottom_units, self.embedding_dim), self.seed))
        params.update(add_dense_stack(self, "top", self._top_input_width, (*self.top_units, 1),
                                      self.seed + 1))
        if self.linear and self.dense_features:
            params["linear/dense"] = self.add_weight(name="linear/dense", shape=[self.dense_width],
                                                     initializer="zeros")
        return params

    def apply(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        vectors = self.vectors(features)
        dense_in = self._dense_input(features)
        if dense_in is not None:
            bottom = apply_dense_stack(params, "bottom", len(self.bottom_units) + 1, dense_in)
            vectors.insert(0, bottom)
            passthrough = bottom
        else:
            passthrough = tf.concat(vectors, axis=-1)
        z = tf.stack(vectors, axis=-2)                        # [..., V, dim]
        dots = tf.matmul(z, z, transpose_b=True)              # [..., V, V]
        flat = tf.reshape(dots, tf.concat([tf.shape(dots)[:-2], [-1]], axis=0))
        interactions = tf.gather(flat, self._pairs, axis=-1)  # [..., V(V-1)/2]
        x = tf.concat([passthrough, interactions], axis=-1)
        x = apply_dense_stack(params, "top", len(self.top_units) + 1, x, activate_last=False)
        logit = tf.squeeze(x, axis=-1)
        linear = self.linear_term(params, features)
        if linear is not None:
            logit += linear
        if self.linear and dense_in is not None:
            logit += tf.reduce_sum(dense_in * params["linear/dense"], axis=-1)
        return logit

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(bottom_units=list(self.bottom_units), top_units=list(self.top_units))
        return config
