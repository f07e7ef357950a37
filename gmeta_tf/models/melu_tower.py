"""MeLUTower: item and user embeddings concatenated into an MLP (Lee et al., KDD 2019)."""

from __future__ import annotations

from typing import Mapping, Sequence

import tensorflow as tf

from gmeta_tf.models.dense_stack import (Params, add_dense_stack, apply_dense_stack, dense,
                                         layer_names)
from gmeta_tf.models.label_prior import PRIOR_FACTORS
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

    With ``item_factors`` the output layer reads the item embeddings beside the last hidden
    layer (a skip connection): ``out = h . w_h + e_item . w_e + b``. Adapting the output
    layer per user then fits the user a vector ``w_e`` of weights on the item embeddings,
    the fold-in of a matrix factorisation (user factor . item factor), which an MLP over
    ``concat(embeddings, context)`` learns only roughly; a model trained through the
    adaptation (MAML) learns item embeddings that such a fold-in can use.

    A label prior with factors (``LabelPrior``, ``factors`` > 0) puts the row's fixed
    factor vector beside them in the same way: ``out = h . w_h + q_item . w_q + b``, so
    the adapted ``w_q`` is a new user's factor folded in against the factorisation's
    items, which need no training.

    Args:
        item_features: Embedded item feature names (e.g. item_id, genres, year).
        user_features: Embedded user feature names (e.g. age, gender, occupation, zip).
        embedding_dim: Width of every embedding.
        hidden_units: Widths of the hidden ReLU layers (MeLU: 64, 64).
        seed: Initializer seed.
        context_dim: Width of the context vector (0: none).
        linear: Add the first-order term (see above).
        item_factors: The output layer also reads the item embeddings (see above).

    Example::

        tower = MeLUTower(["item_id", "genres"], ["age", "gender"], embedding_dim=8)
        tower({"item_id": e, "genres": e, "age": e, "gender": e})   # e: [B, 8] -> [B]
    """

    def __init__(self, item_features: Sequence[str], user_features: Sequence[str],
                 embedding_dim: int, hidden_units: Sequence[int] = (64, 64), seed: int = 0,
                 context_dim: int = 0, linear: bool = False, item_factors: bool = False,
                 **kwargs):
        super().__init__(tuple(item_features) + tuple(user_features), embedding_dim, None, seed,
                         linear, **kwargs)
        self.item_features, self.user_features = tuple(item_features), tuple(user_features)
        self.hidden_units = tuple(int(u) for u in hidden_units)
        if not isinstance(context_dim, int) or isinstance(context_dim, bool) or context_dim < 0:
            raise ValueError(f"{self.name}: context_dim={context_dim!r}, expected an int >= 0")
        self.context_dim = context_dim
        self.item_factors = bool(item_factors)
        if self.item_factors and not self.item_features:
            raise ValueError(f"{self.name}: item_factors needs item_features")

    def _create_weights(self) -> dict[str, tf.Variable]:
        params = {}
        if self.context_dim:
            params["context"] = self.add_weight(name="context", shape=[self.context_dim],
                                                initializer="zeros")
        width = self.embedding_dim * len(self.sparse_features) + self.context_dim
        if not self._skip_width:
            params.update(add_dense_stack(self, "mlp", width, (*self.hidden_units, 1), self.seed))
            return params
        params.update(add_dense_stack(self, "mlp", width, self.hidden_units, self.seed))
        kernel, bias = self.output_layer  # reads the last hidden layer and the item vectors
        fan_in = self.hidden_units[-1] + self._skip_width
        init = tf.keras.initializers.GlorotUniform(seed=self.seed * 1000 + len(self.hidden_units))
        params[kernel] = self.add_weight(name=kernel, shape=[fan_in, 1], initializer=init)
        params[bias] = self.add_weight(name=bias, shape=[1], initializer="zeros")
        return params

    @property
    def _prior_factors(self) -> int:
        """How many prior factors the output layer reads (``LabelPrior.factors_in_output``)."""
        return self.prior.factors if self.prior is not None and self.prior.factors_in_output \
            else 0

    @property
    def _skip_width(self) -> int:
        """Width of what the output layer reads beside the last hidden layer: the item
        embeddings (``item_factors``) and the prior's factors."""
        items = self.embedding_dim * len(self.item_features) if self.item_factors else 0
        return items + self._prior_factors

    @property
    def output_layer(self) -> tuple[str, str]:
        return layer_names("mlp", len(self.hidden_units) + 1)[-1]

    def hidden(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        vectors = self.vectors(features)
        x = tf.concat(vectors, axis=-1)
        if self.context_dim:
            context = params["context"]
            if context.shape.rank == 2:      # one context per task: [T, C], x [T, N, W]
                context = context[:, None, :]
            shape = tf.concat([tf.shape(x)[:-1], [self.context_dim]], axis=0)
            x = tf.concat([x, tf.broadcast_to(context, shape)], axis=-1)
        h = apply_dense_stack(params, "mlp", len(self.hidden_units), x)
        if not self._skip_width:
            return h
        # sparse_features: item features first
        skip = list(vectors[:len(self.item_features)]) if self.item_factors else []
        if self._prior_factors:
            skip.append(features[PRIOR_FACTORS])
        return tf.concat([h, *skip], axis=-1)

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
                      context_dim=self.context_dim, item_factors=self.item_factors)
        return config
