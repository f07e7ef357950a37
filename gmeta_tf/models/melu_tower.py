"""MeLUTower: item and user embeddings concatenated into an MLP (Lee et al., KDD 2019)."""

from __future__ import annotations

from typing import Mapping, Sequence

import tensorflow as tf

from gmeta_tf.models.dense_stack import (Params, add_dense_stack, apply_dense_stack, dense,
                                         layer_names)
from gmeta_tf.models.tower import Tower


class MeLUTower(Tower):
    """MeLU's decision layers: ``concat(item embeddings, user embeddings) -> MLP -> 1``.

    MeLU adapts all of these weights (its MLP and output layer) per user in the inner loop;
    the embeddings stay slow.

    With ``context_dim`` the MLP also reads a context vector, a weight of that width that
    starts at zero (CAVIA, Zintgraf et al. ICML 2019): adapting only it per task
    (``meta.fast_weights: [context]``) gives each user a learned-from-support embedding
    while the MLP, shared by every task, cannot memorise one; the MLP's first layer sees
    ``concat(embeddings, context)``.

    With ``linear`` the output also adds the first-order term: each embedded row carries
    one more column, its id's weight (an item's bias, a user group's), summed beside the
    output layer (a multi-hot feature's pooled one). The term lives in the embedding rows,
    so adapting the decision layers per user leaves each item's learned bias as it is, as
    the item mean + user offset reference keeps it; the adapted output bias is the user's
    offset. The tower then reads rows of ``embedding_dim + 1`` (``input_width``).

    Args:
        item_features: Embedded item feature names (e.g. item_id, genres, year).
        user_features: Embedded user feature names (e.g. age, gender, occupation, zip).
        embedding_dim: Width of every embedding.
        hidden_units: Widths of the hidden ReLU layers (MeLU: 64, 64).
        seed: Initializer seed.
        context_dim: Width of the context vector (0: none).
        linear: Add the first-order term (see above).

    Example::

        tower = MeLUTower(["item_id", "genres"], ["age", "gender"], embedding_dim=8)
        tower({"item_id": e, "genres": e, "age": e, "gender": e})   # e: [B, 8] -> [B]
    """

    def __init__(self, item_features: Sequence[str], user_features: Sequence[str],
                 embedding_dim: int, hidden_units: Sequence[int] = (64, 64), seed: int = 0,
                 context_dim: int = 0, linear: bool = False, **kwargs):
        super().__init__(tuple(item_features) + tuple(user_features), embedding_dim, None, seed,
                         linear, **kwargs)
        self.item_features, self.user_features = tuple(item_features), tuple(user_features)
        self.hidden_units = tuple(int(u) for u in hidden_units)
        if not isinstance(context_dim, int) or isinstance(context_dim, bool) or context_dim < 0:
            raise ValueError(f"{self.name}: context_dim={context_dim!r}, expected an int >= 0")
        self.context_dim = context_dim

    def _create_weights(self) -> dict[str, tf.Variable]:
        params = {}
        if self.context_dim:
            params["context"] = self.add_weight(name="context", shape=[self.context_dim],
                                                initializer="zeros")
        width = self.embedding_dim * len(self.sparse_features) + self.context_dim
        params.update(add_dense_stack(self, "mlp", width, (*self.hidden_units, 1), self.seed))
        return params

    @property
    def output_layer(self) -> tuple[str, str]:
        return layer_names("mlp", len(self.hidden_units) + 1)[-1]

    def hidden(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        x = tf.concat(self.vectors(features), axis=-1)
        if self.context_dim:
            context = params["context"]
            if context.shape.rank == 2:      # one context per task: [T, C], x [T, N, W]
                context = context[:, None, :]
            shape = tf.concat([tf.shape(x)[:-1], [self.context_dim]], axis=0)
            x = tf.concat([x, tf.broadcast_to(context, shape)], axis=-1)
        return apply_dense_stack(params, "mlp", len(self.hidden_units), x)

    def apply(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        kernel, bias = self.output_layer
        out = tf.squeeze(dense(self.hidden(params, features), params[kernel], params[bias]),
                         axis=-1)
        linear = self.linear_term(params, features)
        return out if linear is None else out + linear

    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("sparse_features", "dense_features"):
            config.pop(key)
        config.update(item_features=list(self.item_features),
                      user_features=list(self.user_features), hidden_units=list(self.hidden_units),
                      context_dim=self.context_dim)
        return config
