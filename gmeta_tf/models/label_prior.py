"""LabelPrior: each value of one feature's damped mean label, a fixed term of the output.

A new user's first ratings say little about a rare item; the training split says more
about the item than its few embedding updates learn. The bias model that teams ship for
cold start (item mean from the warm users + the new user's offset) starts from that
knowledge; with a prior the towers start from it too and learn the rest:

    raw output = tower(...) + scale * prior[item]
    prior[item] = g((sum_item + d * mean) / (count_item + d)) - g(mean)

over the training split's rows, ``g`` the head's link (identity for ratings, logit for
clicks), ``d`` the damping (chosen on the validation split unless configured). Unknown
values get 0 (the global mean).

A training row must not see its own label through its prior: on a value with few rows
the prior would all but give the label away (target leakage), the towers would learn to
trust the prior more than it deserves on new tasks, and a new task's rows never count in
it. So with ``folds`` K > 1 the training tasks are cut into K folds by task id
(``task_id mod K``) and a training row reads the prior fitted without its fold's tasks
(out-of-fold target statistics, as a new task sees one fitted without it); every other
row (validation, evaluation, serving) reads the prior of all training rows.

The prior is fitted once before the first step and never trained: adapting a task's
weights (the meta model's inner loop, the baseline's fine-tuning) leaves it as it is, as
the bias model keeps its item means; the adapted output bias is then the task's offset
and the adapted ``scale`` (a tower weight, ``Tower.PRIOR_SCALE``, starting at 1) how far
the task follows the items' means.

With ``factors`` F > 0 (ratings) the prior is a biased matrix factorisation of the
training split instead, fitted by alternating least squares (``references.FactorModel``):
each value's bias (its prior, as above) and a factor vector of width F, which MeLU's
output layer reads beside its last hidden layer (``PRIOR_FACTORS``). Adapting that layer
per user (inner steps, or the ridge solve of ``meta.ridge``) is then the fold-in of a new
user's factor against the items' fixed factors, the matrix-factorisation reference made
a part of the tower, with the MLP beside it to learn what the factorisation misses. Out
of fold as the means are: a training row reads factors fitted without its fold's tasks.
The tower reads the factor vectors scaled down to an RMS norm of at most
``MAX_FACTOR_NORM`` (``factor_scale``), and the fold-in's strength on their weights is
raised by the square of that scale, so the fold-in is the same: the factors' scale comes
from the data (the empirical-Bayes fold-in multiplies them by the users' factor spread
over their bias spread, large on a log whose users barely differ in mean rating), and
the inner loop's gradient steps at a given rate diverge on inputs too large.

The table is variables (the values' ids, sorted; their priors plus a last row for unknown
ids, 0 but under a factorisation's empirical fold-in prior; with folds, the out-of-fold
priors; with factors, their rows likewise) read with stock ops (``lookup_sorted``), so
it lives in checkpoints and in the exported SavedModel as the dense weights do.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

#: The tower input that carries each row's prior (``Tower.raw_inputs``).
PRIOR_INPUT = "label_prior"
#: The tower input that carries each row's prior factors (``factors`` > 0).
PRIOR_FACTORS = "label_prior_factors"
#: The largest RMS norm of the factor vectors the tower reads (``LabelPrior.factor_scale``):
#: above the 0.5-1.2 of MovieLens 100K's factorisations (32 factors, L2 3-10), below the
#: 3-6 of a log whose users share one mean rating, on which MAML's inner loop diverged.
MAX_FACTOR_NORM = 1.5
_EPS = 1e-3


def sorted_positions(keys: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Each id's position in sorted ``keys [n]``, ``n`` for an unknown id (an id vector):
    ``tf.searchsorted`` and a match."""
    n = tf.size(keys, out_type=tf.int64)
    ids = tf.cast(ids, tf.int64)
    position = tf.searchsorted(keys, ids, side="left", out_type=tf.int64)
    padded = tf.concat([keys, tf.zeros([1], tf.int64)], 0)  # position n is valid
    found = (position < n) & tf.equal(tf.gather(padded, position), ids)
    return tf.where(found, position, n)


def lookup_sorted(keys: tf.Tensor, rows: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Rows of an id vector from sorted ``keys [n]`` and ``rows [n + 1, ...]`` whose last
    row is the default (what unknown ids get)."""
    return tf.gather(rows, sorted_positions(keys, ids))


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
        folds: K, the folds of training tasks whose rows read out-of-fold priors (1: every
            row reads the prior of all training rows, its own label included).
        factors: F, the width of each value's factor vector (0: a mean label only).
        factors_in_output: A MeLU output layer reads the factors beside its last hidden
            layer (False: they serve only the factorisation's own fold-in, which adapted
            predictions are blended with, and the tower reads the item's bias alone).

    Example::

        prior = LabelPrior("item_id", "rating")
        prior.assign(np.array([3, 7]), np.array([0.4, -0.2]), damping=10.0)
        prior(tf.constant([[3, 8]]))      # [[0.4, 0.0]]
    """

    def __init__(self, feature: str, kind: str, folds: int = 1, factors: int = 0,
                 factors_in_output: bool = True, name: str = "label_prior"):
        super().__init__(name=name)
        if kind not in ("binary", "rating"):
            raise ValueError(f"LabelPrior: kind={kind!r}, expected 'binary' or 'rating'")
        for key, value, least in (("folds", folds, 1), ("factors", factors, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"LabelPrior: {key}={value!r}, expected an int >= {least}")
        if factors and kind != "rating":
            raise ValueError(f"LabelPrior: factors={factors} with kind {kind!r}, expected "
                             f"0 (the factorisation is of ratings)")
        self.feature, self.kind, self.folds, self.factors = feature, kind, folds, factors
        # Whether a MeLU output layer reads the factors (False: only the fold-in does).
        self.factors_in_output = bool(factors) and bool(factors_in_output)
        with self.name_scope:
            self.ids = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]),
                                   trainable=False, name="ids")
            self.values = tf.Variable(tf.zeros([1]), shape=tf.TensorShape([None]),
                                      trainable=False, name="values")
            # [folds, n + 1]: the prior of each id fitted without fold k's tasks (folds > 1).
            self.fold_values = tf.Variable(tf.zeros([0, 1]), shape=tf.TensorShape([None, None]),
                                           trainable=False, name="fold_values")
            # The damping it was fitted with; -1 before it is fitted.
            self.damping = tf.Variable(-1.0, trainable=False, name="damping")
            if factors:  # [n + 1, F] and [folds, n + 1, F] (folds > 1), last row 0
                # The fold-in's ridge strength chosen with it; -1: none (a checkpoint from
                # before it), the L2 in its place (``fold_in_strength``).
                self.fold_in = tf.Variable(-1.0, trainable=False, name="fold_in")
                self.factor_rows = tf.Variable(
                    tf.zeros([1, factors]), shape=tf.TensorShape([None, factors]),
                    trainable=False, name="factor_rows")
                self.fold_factor_rows = tf.Variable(
                    tf.zeros([0, 1, factors]), shape=tf.TensorShape([None, None, factors]),
                    trainable=False, name="fold_factor_rows")
                # ``factor_scale``, set with the factors: 1 in a checkpoint from before it,
                # whose tower was trained on the factors as fitted.
                self.factor_scale_value = tf.Variable(1.0, trainable=False, name="factor_scale")

    @property
    def fitted(self) -> bool:
        """Fitted, out-of-fold priors included (a checkpoint from before them is not)."""
        fitted = (float(self.damping.numpy()) >= 0.0
                  and (self.folds == 1 or int(tf.shape(self.fold_values)[0]) == self.folds))
        if fitted and self.factors:
            fitted = (int(tf.shape(self.factor_rows)[0]) == int(tf.shape(self.values)[0])
                      and (self.folds == 1
                           or int(tf.shape(self.fold_factor_rows)[0]) == self.folds))
        return fitted

    def assign(self, ids: np.ndarray, priors: np.ndarray, damping: float,
               fold_priors: np.ndarray | None = None, factors: np.ndarray | None = None,
               fold_factors: np.ndarray | None = None, fold_in: float | None = None,
               unknown: float = 0.0) -> None:
        """Sets the prior of each id (any order; ids must be distinct) and, with folds,
        ``fold_priors [folds, n]``: each id's prior fitted without fold k's tasks; with
        ``factors`` F > 0, also ``factors [n, F]``, (folds) ``fold_factors [folds, n, F]``
        and the fold-in strength ``fold_in`` (None: the damping). ``unknown`` is the prior
        of an id not in ``ids`` (its factors are 0), in every fold alike."""
        ids = np.asarray(ids, np.int64)
        order = np.argsort(ids, kind="stable")
        ids, priors = ids[order], np.asarray(priors, np.float32)[order]
        if len(ids) > 1 and np.any(ids[1:] == ids[:-1]):
            raise ValueError(f"LabelPrior({self.feature!r}): duplicate ids")
        folded = np.zeros((0, 1), np.float32)
        if self.folds > 1:
            shape = None if fold_priors is None else np.shape(fold_priors)
            if shape != (self.folds, len(ids)):
                raise ValueError(f"LabelPrior({self.feature!r}): fold_priors of shape {shape}, "
                                 f"expected ({self.folds}, {len(ids)}), a prior per fold and id")
            folded = np.asarray(fold_priors, np.float32)[:, order]
            folded = np.concatenate([folded, np.full((self.folds, 1), unknown, np.float32)],
                                    axis=1)
        if not (np.all(np.isfinite(priors)) and np.all(np.isfinite(folded))):
            raise ValueError(f"LabelPrior({self.feature!r}): non-finite priors")
        if self.factors:
            rows, fold_rows = self._factor_rows(order, factors, fold_factors)
        self.ids.assign(ids)
        self.values.assign(np.concatenate([priors, np.full(1, unknown, np.float32)]))
        self.fold_values.assign(folded)
        if self.factors:
            self.factor_rows.assign(rows)
            self.fold_factor_rows.assign(fold_rows)
            self.fold_in.assign(float(damping if fold_in is None else fold_in))
            known = rows[:-1].astype(np.float64)  # the last row is the unknown id's zeros
            norm = float(np.sqrt(np.square(known).sum(-1).mean())) if len(known) else 0.0
            self.factor_scale_value.assign(MAX_FACTOR_NORM / norm if norm > MAX_FACTOR_NORM
                                           else 1.0)
        self.damping.assign(float(damping))

    def fold_in_strength(self) -> tf.Tensor:
        """The ridge strength of a new task's factor and bias in the fold-in (``factors`` >
        0): the one chosen with the factorisation, or its L2 for a prior saved without it."""
        return tf.where(self.fold_in >= 0.0, self.fold_in, self.damping)

    def factor_scale(self) -> tf.Tensor:
        """``c`` in (0, 1]: ``factors_of`` gives every factor vector times ``c``, so that
        their RMS norm over the known ids is at most ``MAX_FACTOR_NORM``; exactly 1 where
        it is already. Set by ``assign`` and kept in checkpoints and the SavedModel (a
        checkpoint from before it reads 1: its tower was trained on the unscaled factors)."""
        return tf.convert_to_tensor(self.factor_scale_value)

    def fold_in_strengths(self) -> tf.Tensor:
        """``[F + 1]``: the fold-in's ridge strength on each weight of a factor vector as
        ``factors_of`` scales it (``fold_in_strength`` times ``factor_scale`` squared: the
        same fold-in as on the unscaled factors), then on the bias."""
        strength = self.fold_in_strength()
        return tf.concat([tf.fill([self.factors], strength * tf.square(self.factor_scale())),
                          [strength]], axis=0)

    def _factor_rows(self, order: np.ndarray, factors, fold_factors):
        """The factor variables' values, in ``order`` with the unknown id's zero row."""
        n, f = len(order), self.factors
        checks = [("factors", factors, (n, f))]
        if self.folds > 1:
            checks.append(("fold_factors", fold_factors, (self.folds, n, f)))
        for key, value, shape in checks:
            if value is None or np.shape(value) != shape:
                raise ValueError(f"LabelPrior({self.feature!r}): {key} of shape "
                                 f"{None if value is None else np.shape(value)}, expected "
                                 f"{shape}")
            if not np.all(np.isfinite(value)):
                raise ValueError(f"LabelPrior({self.feature!r}): non-finite {key}")
        rows = np.concatenate([np.asarray(factors, np.float32)[order],
                               np.zeros((1, f), np.float32)])
        fold_rows = np.zeros((0, 1, f), np.float32)
        if self.folds > 1:
            fold_rows = np.concatenate([np.asarray(fold_factors, np.float32)[:, order],
                                        np.zeros((self.folds, 1, f), np.float32)], axis=1)
        return rows, fold_rows

    def set_means(self, ids: np.ndarray, means: np.ndarray, global_mean: float,
                  damping: float, fold_means: np.ndarray | None = None) -> None:
        """Sets each id's prior from its (damped) mean label on the training rows (and,
        with folds, ``fold_means [folds, n]``: on the rows of the other folds' tasks) and
        the global mean, in the head's output space (``training.prior_fit`` computes them
        as the item-mean reference does, ``references.FeatureMean``)."""
        if not len(ids):
            raise ValueError(f"LabelPrior({self.feature!r}): no training rows to fit on")
        g = link(self.kind, global_mean)
        self.assign(ids, link(self.kind, means) - g, damping,
                    None if fold_means is None else link(self.kind, fold_means) - g)

    def fold_of(self, task_ids: tf.Tensor) -> tf.Tensor:
        """The fold of each training task: ``task_id mod folds``."""
        return tf.math.floormod(tf.cast(task_ids, tf.int64), self.folds)

    def __call__(self, ids: tf.Tensor, task_ids: tf.Tensor | None = None) -> tf.Tensor:
        """The prior of every id, same shape as ``ids``. ``task_ids`` (training rows only:
        their tasks', broadcastable to ``ids``) reads each row's out-of-fold prior."""
        ids = tf.convert_to_tensor(ids)
        flat_ids = tf.reshape(ids, [-1])
        if task_ids is None or self.folds == 1:
            flat = lookup_sorted(self.ids, self.values, flat_ids)
        else:
            folds = tf.reshape(self.fold_of(tf.broadcast_to(task_ids, tf.shape(ids))), [-1])
            at = tf.stack([folds, sorted_positions(self.ids, flat_ids)], axis=1)
            flat = tf.gather_nd(self.fold_values, at)
        return tf.reshape(flat, tf.shape(ids))

    def factors_of(self, ids: tf.Tensor, task_ids: tf.Tensor | None = None) -> tf.Tensor:
        """The factor vector of every id times ``factor_scale``, ``ids``' shape + ``[F]``
        (``factors`` > 0); ``task_ids`` as in ``__call__``."""
        ids = tf.convert_to_tensor(ids)
        positions = sorted_positions(self.ids, tf.reshape(ids, [-1]))
        if task_ids is None or self.folds == 1:
            flat = tf.gather(self.factor_rows, positions)
        else:
            folds = tf.reshape(self.fold_of(tf.broadcast_to(task_ids, tf.shape(ids))), [-1])
            flat = tf.gather_nd(self.fold_factor_rows, tf.stack([folds, positions], axis=1))
        return tf.reshape(flat * self.factor_scale(), tf.concat([tf.shape(ids), [self.factors]], 0))
