"""Tower: the dense part of a recommendation model, callable with its own or given weights."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from gmeta_tf.models.dense_stack import Params
from gmeta_tf.models.label_prior import PRIOR_FACTORS, PRIOR_INPUT, LabelPrior

#: The tower weight that scales the label prior (with ``prior``).
PRIOR_SCALE = "prior/scale"
#: The tower's blend of its adapted output with the prior's fold-in (prior factors).
PRIOR_BLEND = "prior/blend"


class Tower(tf.keras.layers.Layer):
    """Base of the towers: a Keras layer whose math is also a pure function of its weights.

    ``call(features)`` runs the tower with its own variables (plain CTR training);
    ``apply(params, features)`` runs it with any weights of the same names, where a weight
    may carry a leading task axis ``[T, ...]`` and the features are then ``[T, N, ...]``
    (the meta model's batched fast weights). Subclasses create their weights in
    ``_create_weights`` and define ``apply``.

    Args:
        sparse_features: Names of the embedded features the tower reads, each ``[..., dim]``.
        dense_features: Name -> width of the float features it reads (``[...]`` for width
            1, ``[..., width]`` otherwise).
        embedding_dim: Width of every embedded feature.
        seed: Seed of the weight initializers.
        linear: The first-order term: every embedded row carries one more column, its
            id's weight, and ``linear_term`` sums the features' weights (a multi-hot
            feature's pooled one) into the raw output.

    ``prior`` (a ``LabelPrior``, shared by the towers of a pipeline; set before the
    weights are built) adds each row's fixed prior, times the tower's weight
    ``prior/scale`` (starting at 1), to the raw output beside the linear term; it reads
    the raw ids of its feature (``raw_inputs``). The scale is a tower weight like any
    other: adapted per task, it is how much a user follows the items' consensus. Under a
    prior with factors the tower also holds ``prior_blend`` (a weight, not trained; 1
    until set): how much of an adapted task's output is the tower's, the rest the
    factorisation's own fold-in (``task_adapter.adapted_outputs``; chosen on validation,
    ``evaluation.Validator``).
    """

    def __init__(self, sparse_features: Sequence[str], embedding_dim: int,
                 dense_features: Mapping[str, int] | None = None, seed: int = 0,
                 linear: bool = False, **kwargs):
        super().__init__(**kwargs)
        if not sparse_features:
            raise ValueError(f"{self.name}: sparse_features is empty, expected at least one name")
        if embedding_dim < 1:
            raise ValueError(f"{self.name}: embedding_dim={embedding_dim}, expected >= 1")
        self.sparse_features = tuple(sparse_features)
        self.dense_features = dict(dense_features or {})
        self.embedding_dim = int(embedding_dim)
        self.seed = int(seed)
        self.linear = bool(linear)
        self._params: dict[str, tf.Variable] = {}
        #: The dense inputs' scaling (``set_dense_scaling``; not trained, not adapted): the
        #: tower reads ``(x - shift) * scale``, ``x`` first taken to its signed logarithm
        #: ``sign(x) log(1 + |x|)`` where ``dense_log`` is 1. Identity until set.
        self.dense_shift: tf.Variable | None = None
        self.dense_scale: tf.Variable | None = None
        self.dense_log: tf.Variable | None = None
        self.prior: LabelPrior | None = None
        self.prior_blend: tf.Variable | None = None

    @property
    def input_width(self) -> int:
        """Width of each embedded feature the tower reads: ``embedding_dim``, plus the
        id's weight with ``linear``."""
        return self.embedding_dim + (1 if self.linear else 0)

    def vectors(self, features: Mapping[str, tf.Tensor]) -> list[tf.Tensor]:
        """The embedding vectors ``[..., embedding_dim]`` of the sparse features, in order
        (without the linear weight column)."""
        rows = [features[f] for f in self.sparse_features]
        return [r[..., :self.embedding_dim] for r in rows] if self.linear else rows

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Every input the tower reads: sparse (embedded) then dense."""
        return self.sparse_features + tuple(self.dense_features)

    @property
    def dense_width(self) -> int:
        """Width of the dense inputs concatenated."""
        return sum(self.dense_features.values())

    def build(self, input_shape=None) -> None:
        if not self._params:
            if self.dense_features:
                self.dense_shift = self.add_weight(name="dense/shift", shape=[self.dense_width],
                                                   initializer="zeros", trainable=False)
                self.dense_scale = self.add_weight(name="dense/scale", shape=[self.dense_width],
                                                   initializer="ones", trainable=False)
                # zeros: a checkpoint from before it restores with no input logged
                self.dense_log = self.add_weight(name="dense/log", shape=[self.dense_width],
                                                 initializer="zeros", trainable=False)
            self._params = self._create_weights()
            if self.prior is not None:
                self._params[PRIOR_SCALE] = self.add_weight(name=PRIOR_SCALE, shape=[],
                                                            initializer="ones")
                if self.prior.factors:  # not a parameter: neither adapted nor trained
                    self.prior_blend = self.add_weight(name=PRIOR_BLEND, shape=[],
                                                       initializer="ones", trainable=False)
        super().build(input_shape)

    def _create_weights(self) -> dict[str, tf.Variable]:
        raise NotImplementedError

    def set_dense_scaling(self, shift, scale, logged=None) -> None:
        """Sets the dense inputs' shift and scale and which inputs are read as their signed
        logarithm first (each ``[dense_width]``; ``logged`` None: none; builds if
        needed)."""
        if not self.built:
            self.build(None)
        self.dense_shift.assign(tf.constant(shift, tf.float32))
        self.dense_scale.assign(tf.constant(scale, tf.float32))
        self.dense_log.assign(tf.constant(
            np.zeros(self.dense_width) if logged is None else np.asarray(logged, np.float64),
            tf.float32))

    def dense_scaling_variables(self) -> list[tf.Variable]:
        """The variables of the dense inputs' scaling (none without dense inputs): what a
        SavedModel of the tower must hold besides ``params``."""
        return [v for v in (self.dense_shift, self.dense_scale, self.dense_log)
                if v is not None]

    def params(self) -> dict[str, tf.Variable]:
        """Parameter name -> the tower's variable, in a fixed order (builds if needed)."""
        if not self.built:
            self.build(None)
        return dict(self._params)

    def apply(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """The tower's raw output (a logit or a rating) ``[...]`` under ``params``."""
        raise NotImplementedError

    #: ``(kernel, bias)`` names of the output layer, a linear map of ``hidden`` to the raw
    #: output (None: the tower has no such layer, e.g. DLRM's top MLP).
    output_layer: tuple[str, str] | None = None

    @property
    def final_layer(self) -> tuple[str, str] | None:
        """``(kernel, bias)`` names of the layer that makes the raw output from the deep
        part (``output_layer`` unless the tower says otherwise): with its kernel zero the
        output is its bias plus ``linear_term`` (and DLRM's dense linear map)."""
        return self.output_layer

    def hidden(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """The last hidden layer ``[..., width]``, which ``output_layer`` maps to the raw
        output: ``apply == hidden @ kernel + bias + linear_term`` (towers with an
        ``output_layer``)."""
        raise NotImplementedError(f"{self.name} has no output layer over a hidden layer")

    def linear_term(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor | None:
        """The first-order term of the raw output ``[...]``: the sum of the sparse
        features' id weights (with ``linear``) and the row's prior (with ``prior``); None
        without either."""
        terms = []
        if self.linear:
            terms += [features[f][..., self.embedding_dim] for f in self.sparse_features]
        if self.prior is not None:
            prior, scale = features[PRIOR_INPUT], params.get(PRIOR_SCALE)
            if scale is not None:  # [] or, adapted per task, [T] against a prior [T, N]
                prior = prior * (scale[:, None] if scale.shape.rank == 1 else scale)
            terms.append(prior)
        return tf.add_n(terms) if terms else None

    @property
    def out_of_fold(self) -> bool:
        """Whether training rows read out-of-fold priors (``raw_inputs`` needs their
        tasks)."""
        return self.prior is not None and self.prior.folds > 1

    def raw_inputs(self, features: Mapping[str, tf.Tensor],
                   training_tasks: tf.Tensor | None = None) -> dict:
        """What the tower reads besides the embedded rows, from a batch's raw features
        (``[...]`` ids and values): its dense features, and the rows' prior.
        ``training_tasks``: for training rows, their task ids (broadcastable to the
        features' ``[...]``), so that each reads its out-of-fold prior (``LabelPrior``);
        with prior factors, also the rows' factor vectors ``[..., F]`` (``PRIOR_FACTORS``)."""
        out = {n: features[n] for n in self.dense_features}
        if self.prior is not None:
            ids = features[self.prior.feature]
            out[PRIOR_INPUT] = self.prior(ids, training_tasks)
            if self.prior.factors:
                out[PRIOR_FACTORS] = self.prior.factors_of(ids, training_tasks)
        return out

    def call(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return self.apply(self.params(), features)

    def _dense_input(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor | None:
        """The dense features concatenated: ``[..., sum(widths)]``, None without any."""
        parts = []
        for name, width in self.dense_features.items():
            x = tf.cast(features[name], tf.float32)
            parts.append(x[..., None] if width == 1 else x)
        if not parts:
            return None
        x = tf.concat(parts, axis=-1)
        x = tf.where(self.dense_log > 0, tf.sign(x) * tf.math.log1p(tf.abs(x)), x)
        return (x - self.dense_shift) * self.dense_scale

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(sparse_features=list(self.sparse_features), embedding_dim=self.embedding_dim,
                      dense_features=self.dense_features, seed=self.seed, linear=self.linear)
        return config
