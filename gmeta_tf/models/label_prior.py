"""LabelPrior: each value of one feature's damped mean label, a fixed term of the output.

A new user's first ratings say little about a rare item; the training split says more
about the item than its few embedding updates learn. The bias model that teams ship for
cold start (item mean from the warm users + the new user's offset) starts from that
knowledge; with a prior the towers start from it too and learn the rest:

    raw output = tower(...) + scale * prior[item]
    prior[item] = g((sum_item + d * mean) / (count_item + d)) - g(mean)

over the training split's rows, ``g`` the head's link (identity for ratings, logit for
clicks), ``d`` the damping (chosen on the validation split unless configured). Unknown
values get 0 (the global mean). The prior is fitted once before the first step and never
trained: adapting a task's weights (the meta model's inner loop, the baseline's
fine-tuning) leaves it as it is, as the bias model keeps its item means; the adapted
output bias is then the task's offset and the adapted ``scale`` (a tower weight,
``Tower.PRIOR_SCALE``, starting at 1) how far the task follows the items' means.

The table is two variables (the values' ids, sorted, and their priors plus a last 0 for
unknown ids) read with stock ops (``lookup_sorted``), so it lives in checkpoints and in the
exported SavedModel as the dense weights do.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

#: The tower input that carries each row's prior (``Tower.raw_inputs``).
PRIOR_INPUT = "label_prior"
_EPS = 1e-3


def lookup_sorted(keys: tf.Tensor, rows: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Rows of an id vector from sorted ``keys [n]`` and ``rows [n + 1, ...]`` whose last
    row is the default (what unknown ids get): ``tf.searchsorted``, a match, a gather."""
    n = tf.size(keys, out_type=tf.int64)
    ids = tf.cast(ids, tf.int64)
    position = tf.searchsorted(keys, ids, side="left", out_type=tf.int64)
    padded = tf.concat([keys, tf.zeros([1], tf.int64)], 0)  # position n is valid
    found = (position < n) & tf.equal(tf.gather(padded, position), ids)
    return tf.gather(rows, tf.where(found, position, n))


def link(kind: str, mean: np.ndarray) -> np.ndarray:
    """A mean label in the head's output space: a rating as it is, a rate as its logit."""
    mean = np.asarray(mean, np.float64)
    if kind == "binary":
        p = np.clip(mean, _EPS, 1.0 - _EPS)
        return np.log(p) - np.log1p(-p)
    return mean


class LabelPrior(tf.Module):
    """The prior of one single-valued feature (see the module docstring).

    Args:
        feature: The feature whose values get a prior (an item id).
        kind: The head's kind, "binary" or "rating".

    Example::

        prior = LabelPrior("item_id", "rating")
        prior.assign(np.array([3, 7]), np.array([0.4, -0.2]), damping=10.0)
        prior(tf.constant([[3, 8]]))      # [[0.4, 0.0]]
    """

    def __init__(self, feature: str, kind: str, name: str = "label_prior"):
        super().__init__(name=name)
        if kind not in ("binary", "rating"):
            raise ValueError(f"LabelPrior: kind={kind!r}, expected 'binary' or 'rating'")
        self.feature, self.kind = feature, kind
        with self.name_scope:
            self.ids = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]),
                                   trainable=False, name="ids")
            self.values = tf.Variable(tf.zeros([1]), shape=tf.TensorShape([None]),
                                      trainable=False, name="values")
            # The damping it was fitted with; -1 before it is fitted.
            self.damping = tf.Variable(-1.0, trainable=False, name="damping")

    @property
    def fitted(self) -> bool:
        return float(self.damping.numpy()) >= 0.0

    def assign(self, ids: np.ndarray, priors: np.ndarray, damping: float) -> None:
        """Sets the prior of each id (any order; ids must be distinct)."""
        ids = np.asarray(ids, np.int64)
        order = np.argsort(ids, kind="stable")
        ids, priors = ids[order], np.asarray(priors, np.float32)[order]
        if len(ids) > 1 and np.any(ids[1:] == ids[:-1]):
            raise ValueError(f"LabelPrior({self.feature!r}): duplicate ids")
        if not np.all(np.isfinite(priors)):
            raise ValueError(f"LabelPrior({self.feature!r}): non-finite priors")
        self.ids.assign(ids)
        self.values.assign(np.concatenate([priors, np.zeros(1, np.float32)]))
        self.damping.assign(float(damping))

    def set_means(self, ids: np.ndarray, means: np.ndarray, global_mean: float,
                  damping: float) -> None:
        """Sets each id's prior from its (damped) mean label on the training rows and the
        global mean, in the head's output space (``training.prior_fit`` computes them as
        the item-mean reference does, ``references.FeatureMean``)."""
        if not len(ids):
            raise ValueError(f"LabelPrior({self.feature!r}): no training rows to fit on")
        self.assign(ids, link(self.kind, means) - link(self.kind, global_mean), damping)

    def __call__(self, ids: tf.Tensor) -> tf.Tensor:
        """The prior of every id, same shape as ``ids``."""
        ids = tf.convert_to_tensor(ids)
        flat = lookup_sorted(self.ids, self.values, tf.reshape(ids, [-1]))
        return tf.reshape(flat, tf.shape(ids))
