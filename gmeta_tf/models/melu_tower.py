"""MeLUTower: item and user embeddings concatenated into an MLP (Lee et al., KDD 2019)."""

from __future__ import annotations

from typing import Mapping, Sequence

import tensorflow as tf

from gmeta_tf.models.dense_stack import Params, add_dense_stack, apply_dense_stack
from gmeta_tf.models.tower import Tower


class MeLUTower(Tower):
    """MeLU's decision layers: ``concat(item embeddings, user embeddings) -> MLP -> 1``.

    MeLU adapts all of these weights (its MLP and output layer) per user in the inner loop;
    the embeddings stay slow.

    Args:
        item_features: Embedded item feature names (e.g. item_id, genres, year).
        user_features: Embedded user feature names (e.g. age, gender, occupation, zip).
        embedding_dim: Width of every embedding.
        hidden_units: Widths of the hidden ReLU layers (MeLU: 64, 64).
        seed: Initializer seed.

    Example::

        tower = MeLUTower(["item_id", "genres"], ["age", "gender"], embedding_dim=8)
        tower({"item_id": e, "genres": e, "age": e, "gender": e})   # e: [B, 8] -> [B]
    """

    def __init__(self, item_features: Sequence[str], user_features: Sequence[str],
                 embedding_dim: int, hidden_units: Sequence[int] = (64, 64), seed: int = 0,
                 **kwargs):
        super().__init__(tuple(item_features) + tuple(user_features), embedding_dim, None, seed,
                         **kwargs)
        self.item_features, self.user_features = tuple(item_features), tuple(user_features)
        self.hidden_units = tuple(int(u) for u in hidden_units)

    def _create_weights(self) -> dict[str, tf.Variable]:
        width = self.embedding_dim * len(self.sparse_features)
        return add_dense_stack(self, "mlp", width, (*self.hidden_units, 1), self.seed)

    def apply(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        x = tf.concat([features[f] for f in self.sparse_features], axis=-1)
        x = apply_dense_stack(params, "mlp", len(self.hidden_units) + 1, x, activate_last=False)
        return tf.squeeze(x, axis=-1)

    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("sparse_features", "dense_features"):
            config.pop(key)
        config.update(item_features=list(self.item_features),
                      user_features=list(self.user_features), hidden_units=list(self.hidden_units))
        return config
