"""Reference predictors: what a team could ship without a neural model, scored on the same
rows as the models so every evaluation table says what the models are worth.

Fitted in NumPy on the training split's rows (every row of the warm tasks, what the
baseline trains on); every setting they have is chosen on the validation split, as the
models' settings are:

- ``global mean``: the mean label (mean rating, click rate).
- ``<feature> mean``: the damped mean label of the row's value of one feature,
  ``(sum + d * mean) / (count + d)``; the feature (among the candidates, e.g. every sparse
  feature the tower reads: the item for ratings, a site or ad id for clicks) and ``d`` are
  chosen on validation; unseen values get the global mean.
- ``<feature> mean + task offset`` (task data only): the above plus the task's mean
  residual on its support rows, ``sum(y - m) / (n + d_task)``: the classic bias model of a
  new user (item bias + user bias from the few rows the user gave). Its ``d`` and
  ``d_task`` are chosen together, and of task data both references' dampings are chosen
  on validation pooled with training tasks held out in turn, as the factorisation's
  settings are (below; ``mean_offset_grid``).
- ``matrix factorisation fold-in`` (ratings or clicks of tasks whose training rows carry
  their ``task_id``): a biased matrix factorisation ``mean + b_item + b_task + p_task .
  q_item`` of the training rows by alternating least squares (``MF_FACTORS`` factors, L2
  ``reg``); a new task's bias and factor are the ridge fit (strength ``fold_in``) of its
  support residuals on the item factors, the classic fold-in of a new user. The fold-in's
  prior over the new task's bias and factor is either ``isotropic`` (zero mean, the same
  strength on every coordinate: plain ridge) or ``empirical`` (the mean and covariance of
  the training tasks' fitted biases and factors: the empirical-Bayes fold-in, which shrinks
  a new task toward the typical task rather than toward zero, along the directions in which
  tasks differ; ``FactorModel.with_fold_in_prior``). ``reg``, the item bias, ``fold_in``
  and the prior are chosen on validation pooled with training tasks held out in turn
  (``HeldOutProtocol``, ``held_out_grid``): a validation split of a few dozen tasks cannot
  tell the settings apart. Of clicks it is a linear probability model (least squares on 0/1
  labels, its predictions clipped into (0, 1)), chosen by log loss like every click
  reference, over a grid reaching lower L2s (``MF_REGS_CLICKS``: labels of variance at most
  1/4 need a weaker penalty than ratings for the same fit) and over the factor width too
  (``MF_FACTORS_CLICKS``: a 0/1 label says less than a rating; on the default pipeline's
  generated clicks validation chose 8 factors beside the generator's 4, with the
  empirical-Bayes fold-in prior).
- ``logistic regression`` (binary labels): one weight per (feature, id) of every sparse
  feature the tower reads and one per dense input, plus a bias; Adagrad on log loss with
  an L2 penalty chosen on validation, and as many epochs as validation log loss improves.

A predictor maps a task batch (Meta-IO layout, NumPy or tensors) to ``[T, Q]`` query
predictions, or a row batch to ``[B]``, like the models' predict functions.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable, Iterable, Mapping, NamedTuple, TypeVar

import numpy as np
from threadpoolctl import threadpool_limits

from gmeta_tf.data.schema import TASK_COLUMN
from gmeta_tf.data.split import mix64
from gmeta_tf.meta import metrics
from gmeta_tf.models.ensemble_tower import MEMBER_SEED_STRIDE

log = logging.getLogger(__name__)
DAMPINGS = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0)
L2_PENALTIES = (1e-6, 1e-5, 1e-4, 1e-3)
MF_FACTORS = 32
MF_REGS = (3.0, 10.0, 30.0)       # L2 of the factorisation's factors and biases
MF_REGS_CLICKS = (1.0, 3.0, 10.0)  # the same, of 0/1 labels
MF_FACTORS_CLICKS = (4, 8, MF_FACTORS)  # factor widths chosen from, of 0/1 labels
MF_FOLD_IN = (0.3, 1.0, 3.0, 10.0, 30.0)  # ridge strength of a new task's factor and bias
MF_SWEEPS = 6
T = TypeVar("T")
R = TypeVar("R")
_BATCH_ROWS = 1 << 16  # padded rows per batch of the factorisation's least-squares solves
#: A new task's prior in the fold-in (``FactorModel.with_fold_in_prior``), both tried.
FOLD_IN_PRIORS = ("isotropic", "empirical")
# how the factorisation fits an item's bias: with the factors, or held at its mean residual
# damped by each count (FactorModel's item_bias)
MF_ITEM_BIASES = ("fitted", 3.0, 10.0, 30.0)
#: Folds of the training tasks, each held out in turn (the factorisation fitted without it)
#: to score the factorisation's settings beside the validation split (``HeldOutProtocol``).
MF_HELD_OUT_FOLDS = 5
#: ... scored only when the validation split has fewer query rows than this: a larger one
#: tells the settings apart itself, and the folds cost five more fits of each setting.
MF_HELD_OUT_BELOW_ROWS = 3000
_EPS = 1e-3


def sorted_lookup(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's position in sorted ``keys`` (clipped into range) and whether it is
    there: ``(positions, known)``, both shaped as ``values``."""
    values = np.asarray(values)
    if not len(keys):
        return np.zeros(values.shape, np.int64), np.zeros(values.shape, bool)
    at = np.clip(np.searchsorted(keys, values), 0, len(keys) - 1)
    return at, keys[at] == values


@dataclasses.dataclass(frozen=True)
class ReferenceData:
    """What the references read: label kind, the reference feature, the features of the
    linear model."""

    kind: str                      # "binary" or "rating"
    label: str                     # the head's label
    candidates: tuple[str, ...]    # features the mean-label references may use (best kept)
    sparse: tuple[str, ...]        # sparse / multi-hot features of the linear model
    dense: tuple[str, ...] = ()    # dense features of the linear model
    feature: str = ""              # the chosen candidate (set by fit_references)
    # the dense inputs' scaling, over their concatenated width, as the tower's
    # (``Tower.set_dense_scaling``): the linear model reads (x - shift) * scale, x first
    # taken to sign(x) log(1 + |x|) where dense_log is 1
    dense_shift: tuple[float, ...] = ()
    dense_scale: tuple[float, ...] = ()
    dense_log: tuple[float, ...] = ()


def signed_log(x: np.ndarray) -> np.ndarray:
    """``sign(x) log(1 + |x|)``, in ``x``'s precision: monotone, 0 at 0, a count's order of
    magnitude (what a tower reads of a dense input its scaling logs, ``Tower._dense_input``;
    ``dense_scaling`` chooses which)."""
    return np.sign(x) * np.log1p(np.abs(x))


def rows_of(batches: Iterable[Mapping], names: Iterable[str]) -> dict[str, np.ndarray]:
    """Concatenated real rows of row batches or task batches (support and query)."""
    names = list(names)
    out: dict[str, list] = {n: [] for n in names}
    for batch in batches:
        if "support" in batch:
            for role in ("support", "query"):
                real = np.asarray(batch[role]["mask"]) > 0
                for n in names:
                    out[n].append(np.asarray(batch[role][n])[real])
        else:
            for n in names:
                out[n].append(np.asarray(batch[n]))
    return {n: np.concatenate(v) if v else np.zeros(0) for n, v in out.items()}


def loss_of(kind: str, labels: np.ndarray, predictions: np.ndarray) -> float:
    """What the references' settings are chosen by: log loss of clicks (predictions
    clipped away from 0 and 1), mean absolute error of ratings."""
    if kind == "binary":
        return metrics.log_loss(labels, _clip(kind, predictions))
    return metrics.mae(labels, predictions)


class FeatureMean:
    """Damped mean label per value of one feature (global mean for unseen values)."""

    def __init__(self, values: np.ndarray, labels: np.ndarray, damping: float = 0.0):
        self.global_mean = float(np.mean(labels)) if len(labels) else 0.0
        self.keys, inverse = np.unique(values, return_inverse=True)
        self.sums = np.bincount(inverse, weights=labels, minlength=len(self.keys))
        self.counts = np.bincount(inverse, minlength=len(self.keys)).astype(np.float64)
        self.damping = damping

    @classmethod
    def from_sums(cls, keys: np.ndarray, sums: np.ndarray, counts: np.ndarray,
                  damping: float = 0.0) -> "FeatureMean":
        """The mean of rows summarised in parts (one per rank, say): the parts' ``keys``,
        ``sums`` and ``counts`` concatenated, a key in several parts counted in each."""
        out = object.__new__(cls)
        counts = np.asarray(counts, np.float64)
        total = float(counts.sum())
        out.global_mean = float(np.sum(sums)) / total if total else 0.0
        out.keys, inverse = np.unique(keys, return_inverse=True)
        out.sums = np.bincount(inverse, weights=sums, minlength=len(out.keys))
        out.counts = np.bincount(inverse, weights=counts, minlength=len(out.keys))
        out.damping = damping
        return out

    def with_damping(self, damping: float) -> "FeatureMean":
        other = object.__new__(FeatureMean)
        other.__dict__.update(self.__dict__, damping=damping)
        return other

    def __call__(self, values: np.ndarray) -> np.ndarray:
        at, known = sorted_lookup(self.keys, values)
        sums, counts = np.where(known, self.sums[at] if len(self.keys) else 0.0, 0.0), \
            np.where(known, self.counts[at] if len(self.keys) else 0.0, 0.0)
        denominator = counts + self.damping
        return np.where(denominator > 0,
                        (sums + self.damping * self.global_mean) / np.maximum(denominator, 1e-12),
                        self.global_mean)


def mean_offset(mean: FeatureMean, task: FoldInTask, damping: float | None) -> np.ndarray:
    """``[T, Q]`` the query rows' damped feature means plus, unless ``damping`` is None,
    each task's mean residual on its support rows damped by ``damping``."""
    predicted = mean(task.query)
    if damping is None:
        return predicted
    residual = (np.asarray(task.labels, np.float64) - mean(task.support)) * task.mask
    return predicted + (residual.sum(axis=1) / (task.mask.sum(axis=1) + damping))[:, None]


def mean_offset_grid(mean: FeatureMean, fit: Callable[[np.ndarray], FeatureMean],
                     tasks: list[FoldInTask], labels: np.ndarray,
                     held_out: list[tuple[np.ndarray, FoldInTask, np.ndarray]],
                     kind: str = "rating") -> dict[tuple[float, float | None], float]:
    """The loss (``loss_of`` of ``kind``) of each (feature damping, task damping) of
    ``DAMPINGS`` (task damping None: the feature mean alone) on the query rows of the
    validation ``tasks`` (labels ``labels``) under ``mean`` (every training row), pooled with
    each held-out fold's (``HeldOutProtocol.folds_of``) under ``fit(keep)``, the mean of the
    rows the fold leaves. The feature mean reference chooses the first key of least loss
    with task damping None, the feature mean + task offset the first of the others."""
    sums: dict[tuple[float, float | None], float] = {}
    rows = 0
    for fitted, parts, part_labels in [(mean, tasks, labels)] + [
            (fit(keep), [task], task_labels) for keep, task, task_labels in held_out]:
        n = len(part_labels)
        for d in DAMPINGS:
            damped = fitted.with_damping(d)
            for d_task in (None, *DAMPINGS):
                loss = loss_of(kind, part_labels, _clip(kind, np.concatenate(
                    [mean_offset(damped, t, d_task)[t.real] for t in parts]))) if n else 0.0
                sums[(d, d_task)] = sums.get((d, d_task), 0.0) + loss * n
        rows += n
    return {key: float(v / rows) if rows else 0.0 for key, v in sums.items()}


def first_column(values) -> np.ndarray:
    """A multi-slot feature's first slot (a single-slot one as it is)."""
    values = np.asarray(values)
    return values.reshape(len(values), -1)[:, 0] if values.ndim > 1 else values


def _mean_predict(mean: FeatureMean, data: ReferenceData) -> "Predict":
    """The feature mean reference's predict function."""
    return _task_predict(lambda rows: _clip(data.kind, mean(first_column(rows[data.feature]))))


def _mean_offset_predict(mean: FeatureMean, damping: float, data: ReferenceData) -> "Predict":
    """The feature mean + task offset reference's predict function (task batches)."""
    def predict(batch: Mapping) -> np.ndarray:
        return _clip(data.kind, mean_offset(mean, _fold_in_task(batch, data), damping))
    return predict


def _clip(kind: str, p: np.ndarray) -> np.ndarray:
    return np.clip(p, _EPS, 1.0 - _EPS) if kind == "binary" else p


def vocabulary_of(data: ReferenceData, rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rows' ids of each sparse feature of the linear model, sorted (as
    ``LinearModel.vocabulary``, the training rows', outside which an id weighs nothing)."""
    out = {}
    for name in data.sparse:
        x = np.asarray(rows[name]).astype(np.int64).reshape(-1)
        out[name] = np.unique(x[x >= 0])
    return out


class LinearModel:
    """Logistic regression on hashed one-hot sparse ids and dense inputs (NumPy, Adagrad).

    An id the training rows never had weighs nothing (``vocabulary``), as in the
    model's own linear term (an unknown id reads the table's default row, 0), instead of
    the weight of whichever training id shares its hashed column: so a plain model started
    from this one (``linear_start``) scores every row as it does."""

    def __init__(self, data: ReferenceData, buckets: int = 1 << 20, learning_rate: float = 0.1,
                 l2: float = 1e-5, seed: int = 0):
        self.data, self.buckets, self.lr, self.l2 = data, buckets, learning_rate, l2
        self.vocabulary: dict[str, np.ndarray] | None = None  # sorted training ids
        self.w = np.zeros(buckets)
        self.w_acc = np.full(buckets, 1e-8)
        self.v: np.ndarray | None = None   # dense weights, sized at the first batch
        self.b, self.b_acc = 0.0, 1e-8
        self.rng = np.random.default_rng(seed)

    def _features(self, rows: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
        """(hashed ids [n, F], their weights [n, F], dense inputs [n, D]): 1 for a present
        id (a multi-hot feature's 1 / its present ids, the mean the tower pools), 0 for
        padding and for an id outside the vocabulary (still counted in that mean, as the
        tower's unknown id is a row of zeros)."""
        ids, weights = [], []
        for i, name in enumerate(self.data.sparse):
            x = np.asarray(rows[name]).astype(np.int64)
            x = x.reshape(len(x), -1)
            w = (x >= 0).astype(np.float64)
            if x.shape[1] > 1:  # multi-hot: mean of the present ids, as the tower pools
                w = w / np.maximum(w.sum(axis=1, keepdims=True), 1.0)
            if self.vocabulary is not None:
                known = self.vocabulary[name]
                at = np.minimum(np.searchsorted(known, x), max(len(known) - 1, 0))
                w = w * (known[at] == x if len(known) else np.zeros_like(w, bool))
            ids.append(self._buckets(i, x))
            weights.append(w)
        dense = [np.asarray(rows[n], np.float64).reshape(len(ids[0]) if ids else
                                                         len(rows[n]), -1)
                 for n in self.data.dense]
        n = len(ids[0]) if ids else len(dense[0])
        dense = np.concatenate(dense, axis=1) if dense else np.zeros((n, 0))
        if self.data.dense_log:  # in float32, as the tower takes it
            dense = np.where(np.asarray(self.data.dense_log) > 0,
                             signed_log(dense.astype(np.float32)), dense)
        if self.data.dense_shift:
            dense = ((dense - np.asarray(self.data.dense_shift))
                     * np.asarray(self.data.dense_scale))
        return (np.concatenate(ids, axis=1).astype(np.int64) if ids else np.zeros((n, 0), np.int64),
                np.concatenate(weights, axis=1) if weights else np.zeros((n, 0)),
                dense)

    def _buckets(self, feature_index: int, ids: np.ndarray) -> np.ndarray:
        """The hashed one-hot columns of a feature's (the ``feature_index``-th of
        ``data.sparse``) int64 ids."""
        with np.errstate(over="ignore"):
            key = (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                   + np.uint64(feature_index + 1) * np.uint64(0xBF58476D1CE4E5B9))
        return (key >> np.uint64(20)) % np.uint64(self.buckets)

    def id_weights(self, feature: str, ids: np.ndarray) -> np.ndarray:
        """The weights of a sparse feature's ids (one-hot columns)."""
        index = self.data.sparse.index(feature)
        return self.w[self._buckets(index, np.asarray(ids, np.int64)).astype(np.int64)]

    @property
    def dense_weights(self) -> np.ndarray:
        """The weights of the dense inputs, in ``data.dense`` order (after a fit)."""
        return np.zeros(0) if self.v is None else self.v

    @property
    def bias(self) -> float:
        return float(self.b)

    def _logit(self, ids, weights, dense) -> np.ndarray:
        if self.v is None:
            self.v = np.zeros(dense.shape[1])
            self.v_acc = np.full(dense.shape[1], 1e-8)
        return (self.w[ids] * weights).sum(axis=1) + dense @ self.v + self.b

    def predict_rows(self, rows: Mapping[str, np.ndarray]) -> np.ndarray:
        z = self._logit(*self._features(rows))
        if self.data.kind == "binary":
            return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))
        return z

    @staticmethod
    def _column_gradient(ids: np.ndarray, terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The hashed columns a batch touches (sorted) and each one's summed gradient, from
        the batch's ids ``[n, F]`` and their gradient terms ``[n, F]``: summed over those
        columns alone, not all ``buckets`` of them (2^20 a batch to allocate and scan)."""
        touched, where = np.unique(ids.ravel(), return_inverse=True)
        return touched, np.bincount(where, weights=terms.ravel(), minlength=len(touched))

    def epoch(self, features, labels: np.ndarray, batch: int = 256) -> None:
        ids, weights, dense = features
        order = self.rng.permutation(len(labels))
        for lo in range(0, len(order), batch):
            at = order[lo:lo + batch]
            z = self._logit(ids[at], weights[at], dense[at])
            p = 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30))) if self.data.kind == "binary" else z
            err = (p - labels[at]) / len(at)                              # dLoss/dz
            touched, grad_w = self._column_gradient(ids[at], err[:, None] * weights[at])
            g = grad_w + self.l2 * self.w[touched]
            self.w_acc[touched] += g * g
            self.w[touched] -= self.lr * g / np.sqrt(self.w_acc[touched])
            if dense.shape[1]:
                gv = dense[at].T @ err + self.l2 * self.v
                self.v_acc += gv * gv
                self.v -= self.lr * gv / np.sqrt(self.v_acc)
            gb = float(err.sum())
            self.b_acc += gb * gb
            self.b -= self.lr * gb / np.sqrt(self.b_acc)


def fit_linear(data: ReferenceData, train: Mapping[str, np.ndarray],
               valid: Mapping[str, np.ndarray], max_epochs: int = 10,
               seed: int = 0) -> tuple[LinearModel, dict]:
    """The linear model with the L2 penalty and epoch count of best validation loss."""
    labels = np.asarray(train[data.label], np.float64)
    valid_labels = np.asarray(valid[data.label], np.float64)
    best: tuple[float, LinearModel | None, dict] = (np.inf, None, {})
    vocabulary = vocabulary_of(data, train)  # the same for every penalty
    for l2 in L2_PENALTIES:
        model = LinearModel(data, l2=l2, seed=seed)
        model.vocabulary = vocabulary
        features, valid_features = model._features(train), model._features(valid)
        best_here, stale = np.inf, 0
        for epoch in range(1, max_epochs + 1):
            model.epoch(features, labels)
            z = model._logit(*valid_features)
            p = 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30))) if data.kind == "binary" else z
            loss = loss_of(data.kind, valid_labels, p)
            if loss < best[0]:
                snapshot = object.__new__(LinearModel)
                snapshot.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v)
                                          for k, v in model.__dict__.items()})
                best = (loss, snapshot, {"l2": l2, "epochs": epoch, "valid_loss": loss})
            if loss < best_here:
                best_here, stale = loss, 0
            else:
                stale += 1
                if stale >= 2:
                    break
    return best[1], best[2]


Predict = Callable[[Mapping], np.ndarray]


class _Groups(NamedTuple):
    """Rows grouped by a key (a task or an item, every key of ``0..count-1``), laid out for
    ``_ridge_per_group`` once, as every sweep of alternating least squares reads them.

    Groups of about the same size form one batch: each is padded with zero rows to the
    next power of two, so the padding is at most the rows themselves, and a batch holds at
    most ``_BATCH_ROWS`` padded rows, so memory stays bounded however many rows there are.
    ``batches`` holds, per batch, its groups ``[B]``, which of their slots are real rows
    ``[B, W]`` and the row in each slot ``[B, W]`` (row 0 where padded)."""

    count: int
    batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]]

    @classmethod
    def of(cls, key_of_row: np.ndarray, count: int = 0) -> "_Groups":
        """``key_of_row``'s groups; ``count`` at least (keys without rows: empty groups)."""
        order = np.argsort(key_of_row, kind="stable")
        sizes = np.bincount(key_of_row, minlength=count)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        width_of = np.ceil(np.log2(np.maximum(sizes, 1))).astype(np.int64)
        batches = []
        for power in np.unique(width_of):
            of_width = np.flatnonzero(width_of == power)
            slot = np.arange(1 << int(power))
            for members in np.array_split(of_width, min(
                    len(of_width), -(-len(of_width) * len(slot) // _BATCH_ROWS))):
                real = slot < sizes[members, None]
                batches.append((members, real,
                                order[np.where(real, starts[members, None] + slot, 0)]))
        return cls(len(sizes), batches)


def _ridge_per_group(groups: _Groups, factors: np.ndarray, targets: np.ndarray,
                     penalty: np.ndarray, bias: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """One side's half-step of alternating least squares: for every group of rows, the
    ridge fit of ``targets`` on ``[factors, 1]`` (the other side's factors of each row;
    on ``factors`` alone without ``bias``, the biases then 0): ``(factors [G, f], biases
    [G])``. The groups of a batch are solved together, their padding zero rows (a zero
    row adds nothing to ``x^T x`` or ``x^T y``)."""
    x = np.hstack([factors, np.ones((len(factors), 1))]) if bias else factors
    out = np.zeros((groups.count, penalty.shape[0]))
    for members, real, rows in groups.batches:
        xs_t = (x[rows] * real[..., None]).transpose(0, 2, 1)
        gram = xs_t @ xs_t.transpose(0, 2, 1) + penalty
        out[members] = np.linalg.solve(gram, xs_t @ (targets[rows] * real)[..., None])[..., 0]
    return (out[:, :-1], out[:, -1]) if bias else (out, np.zeros(groups.count))


class FactorModel:
    """A biased matrix factorisation of ratings, fitted by alternating least squares:
    ``mean + b_item + b_task + p_task . q_item`` with L2 ``reg`` on every factor and bias
    (or each item's bias held at its damped mean residual: ``item_bias``).
    The items' part is kept, and of the tasks only the mean and covariance of their
    fitted biases and factors (``with_fold_in_prior``): a new task is folded in from its
    own rows.

    Args:
        tasks, items, labels: The training rows.
        factors: Factor width.
        reg: L2 strength.
        sweeps: Alternations (tasks' then items' least squares).
        seed: Seeds the initial factors.
        item_bias: ``fitted``: every item's bias is fitted with the factors (L2
            ``reg``). A count ``d``: each item's bias is held at its damped mean residual,
            ``sum(label - mean) / (rows + d)`` (Koren's baseline predictor), and only the
            factors and the tasks' biases are fitted around it: an item of few rows keeps
            its own mean's share instead of one the factors compete for.
    """

    def __init__(self, tasks: np.ndarray, items: np.ndarray, labels: np.ndarray,
                 factors: int = MF_FACTORS, reg: float = 10.0, sweeps: int = MF_SWEEPS,
                 seed: int = 0, item_bias: float | str = "fitted"):
        self.keys, item_of = np.unique(items, return_inverse=True)
        _, task_of = np.unique(tasks, return_inverse=True)
        labels = np.asarray(labels, np.float64)
        self.mean = float(labels.mean())
        rng = np.random.default_rng(seed)
        q = rng.normal(0.0, 0.1, (len(self.keys), factors))
        by_task = _Groups.of(task_of)
        by_item = _Groups.of(item_of, len(self.keys))
        eye = reg * np.eye(factors + 1)
        targets = labels - self.mean
        held = item_bias != "fitted"
        if held:  # the items' half-step fits the factors alone, on what the held bias leaves
            b_item = (np.bincount(item_of, targets, len(self.keys))
                      / (np.bincount(item_of, minlength=len(self.keys)) + float(item_bias)))
            held_targets = targets - b_item[item_of]
        else:
            b_item = np.zeros(len(self.keys))
        for _ in range(sweeps):
            p, b_task = _ridge_per_group(by_task, q[item_of], targets - b_item[item_of], eye)
            if held:
                q, _ = _ridge_per_group(by_item, p[task_of], held_targets - b_task[task_of],
                                        eye[1:, 1:], bias=False)
            else:
                q, b_item = _ridge_per_group(by_item, p[task_of], targets - b_task[task_of],
                                             eye)
        self.factors, self.biases = q, b_item
        # the tasks' half-step against the final items: the training tasks as fitted
        p, b_task = _ridge_per_group(by_task, q[item_of], targets - b_item[item_of], eye)
        self._task_moments = (p.mean(axis=0), np.cov(p, rowvar=False).reshape(factors, factors),
                              float(b_task.mean()), float(b_task.var())) if len(p) > 1 else None
        self.fold_in_prior = "isotropic"
        self.unknown_bias = 0.0  # an item not in training: no factors, this bias

    def with_fold_in_prior(self, prior: str) -> "FactorModel":
        """This factorisation with a new task folded in under ``prior``:

        - ``isotropic``: itself. The fold-in's ridge shrinks the task's bias and every
          factor coordinate toward 0 at one strength.
        - ``empirical``: the empirical-Bayes fold-in. The training tasks' fitted biases
          and factors have mean ``(m_b, m_p)``, bias variance ``v`` and factor covariance
          ``C``; the items are re-expressed so that the same isotropic ridge is the prior
          ``b ~ N(m_b, v s')``, ``p ~ N(m_p, C s')`` (``s'`` set by the fold-in strength):
          factors ``q L`` with ``L L^T = C / v``, biases ``b_item + q . m_p + m_b`` (an
          unknown item's ``m_b``). A new task then starts at the typical task and moves
          along the directions in which tasks differ. Its predictions differ from the
          isotropic fold-in's; the training tasks' fit is the same.

        Raises:
            ValueError: ``prior`` is not one of ``FOLD_IN_PRIORS``.
        """
        if prior not in FOLD_IN_PRIORS:
            raise ValueError(f"FactorModel.with_fold_in_prior: prior={prior!r}, expected one "
                             f"of {FOLD_IN_PRIORS}")
        moments = self._task_moments
        if prior == "isotropic" or moments is None or not moments[3] > 0.0:
            return self  # fewer than two tasks, or none that differ: nothing to estimate
        mean_p, cov_p, mean_b, var_b = moments
        scaled = cov_p / var_b
        jitter = 1e-6 * max(float(np.trace(scaled)) / len(scaled), 1e-12)
        chol = np.linalg.cholesky(scaled + jitter * np.eye(len(scaled)))
        out = copy.copy(self)
        out.factors = self.factors @ chol
        out.biases = self.biases + self.factors @ mean_p + mean_b
        out.unknown_bias, out.fold_in_prior = mean_b, prior
        return out

    def item(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Factors and biases of ``items`` (an item not in training: zero factors and
        ``unknown_bias``)."""
        pos, known = sorted_lookup(self.keys, items)
        return (np.where(known[..., None], self.factors[pos], 0.0),
                np.where(known, self.biases[pos], self.unknown_bias))

    def fold_in(self, items: np.ndarray, labels: np.ndarray, mask: np.ndarray,
                query: np.ndarray, strength: float) -> np.ndarray:
        """``[T, Q]`` query predictions of T new tasks from their support rows ``[T, S]``."""
        q, b = self.item(items)
        x = np.concatenate([q, np.ones(q.shape[:-1] + (1,))], axis=-1) * mask[..., None]
        residual = (np.asarray(labels, np.float64) - self.mean - b) * mask
        gram = np.einsum("tsi,tsj->tij", x, x) + strength * np.eye(x.shape[-1])
        w = np.linalg.solve(gram, np.einsum("tsi,ts->ti", x, residual)[..., None])[..., 0]
        qq, bq = self.item(query)
        return self.mean + bq + np.einsum("tqi,ti->tq", qq, w[:, :-1]) + w[:, -1:]


def in_parallel(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(item) for item in items]``, on a thread per core, numpy's BLAS held to one
    thread of its own meanwhile (``threadpoolctl``). The factorisation's least squares are
    many small matrices, where BLAS's threads cost more than they give and fight threads of
    ours: one fit alone took 10.0 s with BLAS's 2 threads and 8.6 s with 1; two fits at once
    on 2 cores 42.6 s with BLAS's threads and 5.1 s without (400,000 rows, 32 factors).
    Every item's arithmetic is the same on any thread, so the results are the loop's."""
    items = list(items)
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    workers = min(len(items), cores)
    if workers <= 1:
        return [fn(item) for item in items]
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


class factorisations:  # noqa: N801 (used as a function of ``fit``)
    """``fit`` of a setting -> a function of ``(*setting, prior)`` giving that fit under
    each fold-in prior, fitting each setting once (the prior changes no fit), whichever
    thread asks first (``fit_all`` fits many on threads)."""

    def __init__(self, fit: Callable[[Hashable], FactorModel]) -> None:
        self._fit = fit
        self._fitted: dict[Hashable, FactorModel] = {}
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()

    @staticmethod
    def setting_of(key: tuple) -> Hashable:
        """The fit's setting of a key ``(*setting, prior)``."""
        setting = key[:-1]
        return setting[0] if len(setting) == 1 else tuple(setting)

    def fitted(self, setting: Hashable) -> FactorModel:
        """The fit of ``setting``, fitted on the first call."""
        with self._guard:
            lock = self._locks.setdefault(setting, threading.Lock())
        with lock:
            if setting not in self._fitted:
                self._fitted[setting] = self._fit(setting)
            return self._fitted[setting]

    def __call__(self, key: tuple) -> FactorModel:
        return self.fitted(self.setting_of(key)).with_fold_in_prior(key[-1])


def fit_all(families: Iterable[factorisations], keys: Iterable[tuple]) -> None:
    """Fits every setting of ``keys`` in every one of ``families`` (``in_parallel``), so
    that the grid's scoring finds them fitted."""
    settings = list(dict.fromkeys(factorisations.setting_of(k) for k in keys))
    in_parallel(lambda job: job[0].fitted(job[1]),
                [(family, setting) for family in families for setting in settings])


class FoldInTask(NamedTuple):
    """A task batch as ``FactorModel.fold_in`` reads it, prepared once for every pair."""

    support: np.ndarray  # [T, S] the support rows' ids
    query: np.ndarray    # [T, Q] the query rows' ids
    labels: np.ndarray   # [T, S] the support rows' labels
    mask: np.ndarray     # [T, S] the support mask, float64
    real: np.ndarray     # [T, Q] bool: the real query rows

    @classmethod
    def of(cls, batch: Mapping, feature: str, label: str) -> "FoldInTask":
        """A NumPy task batch's rows, the ids of ``feature`` shaped as each role's mask (a
        multi-slot feature's slot chosen beforehand, as ``_first_slot`` does)."""
        support, query = batch["support"], batch["query"]
        support_ids, query_ids = (np.asarray(r[feature]).reshape(np.shape(r["mask"]))
                                  for r in (support, query))
        return cls(support_ids, query_ids, support[label],
                   np.asarray(support["mask"], np.float64), np.asarray(query["mask"]) > 0)

    def predict(self, model: FactorModel, strength: float) -> np.ndarray:
        """``[T, Q]`` the query predictions of ``model``'s fold-in at ``strength``."""
        return model.fold_in(self.support, self.labels, self.mask, self.query, strength)


def fold_in_grid(fit: Callable[[Hashable], FactorModel], regs: Iterable[Hashable],
                 strengths: Iterable[float], tasks: list[FoldInTask], labels: np.ndarray,
                 total: Callable[[np.ndarray], np.ndarray] | None = None,
                 kind: str = "rating"
                 ) -> tuple[dict[tuple[Hashable, float], float], dict[Hashable, FactorModel],
                            int]:
    """Each (fit, fold-in strength) pair's loss (``loss_of`` of ``kind``) on the real query
    rows of ``tasks`` (labels ``labels``, in ``query_rows`` order) of their fold-in at the
    strength into the factorisation ``fit(setting)``, a setting being an L2 or any key
    ``fit`` reads (the reference passes (width, L2, item bias, fold-in prior), the factor
    prior (L2, item bias, fold-in prior)): ``(losses keyed
    (setting, strength), the setting outer; the factorisations by setting; rows)``. The
    first pair of lowest loss is the choice. ``total`` (None: one process) sums ``[loss *
    rows of each pair..., rows]`` over ranks, for the loss over every rank's rows. Without
    rows every loss is 0."""
    n = len(labels)
    regs, strengths = list(regs), list(strengths)

    def scored(reg: Hashable) -> tuple[FactorModel, list[float]]:
        model = fit(reg)
        return model, [loss_of(kind, labels, np.concatenate(
            [t.predict(model, strength)[t.real] for t in tasks])) if n else 0.0
            for strength in strengths]

    keys, losses, models = [], [], {}
    for reg, (model, reg_losses) in zip(regs, in_parallel(scored, regs)):
        models[reg] = model
        keys += [(reg, strength) for strength in strengths]
        losses += reg_losses
    if total is not None:
        *sums, rows = total(np.array([loss * n for loss in losses] + [n], np.float64))
        losses, n = [s / rows if rows else 0.0 for s in sums], int(rows)
    return {k: float(loss) for k, loss in zip(keys, losses)}, models, n


@dataclasses.dataclass(frozen=True)
class HeldOutProtocol:
    """How training tasks are held out to score the factorisation's settings beside the
    validation split: each task of ``min_rows`` to ``max_rows`` rows falls in one of
    ``folds`` folds (by a hash of its id and ``seed``); with a fold held out, the
    factorisation is fitted on the other tasks' rows, and each held-out task is folded in
    from ``support`` of its rows at most and scored on ``query`` others, as a validation
    task is. The query rows are, with ``last``, a task's last ``query`` rows as read (a
    converted dataset stores each task's rows in time order when its split's
    ``query_selection`` is "last", the protocol's query rows being its latest), else
    the first by a hash of the item (so the same rows are chosen in whatever order they
    were read, as the protocol's "random" query rows are drawn without regard to order).
    A validation split holds a tenth of the warm tasks, a few dozen on a small log: too
    few to tell the factorisation's settings apart; the held-out folds add every other
    training task of the protocol's size. ``folds`` < 2: none."""

    query: int
    support: int
    min_rows: int
    max_rows: int | None = None
    folds: int = MF_HELD_OUT_FOLDS
    seed: int = 0
    last: bool = False

    def folds_beside(self, valid_rows: int, tasks: np.ndarray, items: np.ndarray,
                     labels: np.ndarray) -> list[tuple[np.ndarray, FoldInTask, np.ndarray]]:
        """``folds_of``, if a validation split of ``valid_rows`` query rows (over every
        rank) is too small to choose alone (fewer than ``MF_HELD_OUT_BELOW_ROWS``), else
        none: the one place that decides whether the held-out folds are scored."""
        if valid_rows >= MF_HELD_OUT_BELOW_ROWS:
            return []
        return self.folds_of(tasks, items, labels)

    def folds_of(self, tasks: np.ndarray, items: np.ndarray, labels: np.ndarray
                 ) -> list[tuple[np.ndarray, FoldInTask, np.ndarray]]:
        """Per fold: the training rows to fit on (a mask), its held-out tasks as one
        ``FoldInTask`` and their query rows' labels (in ``FoldInTask.real`` order)."""
        if self.folds < 2 or self.query < 1 or not len(tasks):
            return []
        tasks = np.asarray(tasks).astype(np.int64)
        items = np.asarray(items).astype(np.int64)
        labels = np.asarray(labels, np.float64)
        key = mix64(np.array([self.seed], np.int64).view(np.uint64))[0]
        if self.last:  # latest first: rank < query are a task's last rows as read
            order = np.lexsort((-np.arange(len(tasks)), tasks))
        else:
            order = np.lexsort((labels, mix64(items.view(np.uint64) ^ mix64(tasks.view(
                np.uint64) ^ key)), tasks))
        sorted_tasks = tasks[order]
        starts = np.flatnonzero(np.r_[True, sorted_tasks[1:] != sorted_tasks[:-1]])
        sizes = np.diff(np.r_[starts, len(order)])
        rank = np.arange(len(order)) - np.repeat(starts, sizes)
        task_keys = sorted_tasks[starts]
        eligible = (sizes >= max(self.min_rows, self.query + 1)) & (
            sizes <= (self.max_rows if self.max_rows is not None else np.inf))
        fold_of_task = np.where(
            eligible, (mix64(task_keys.view(np.uint64) ^ mix64(key)) % np.uint64(self.folds))
            .astype(np.int64), -1)
        fold_of_row = np.repeat(fold_of_task, sizes)
        out = []
        for fold in range(self.folds):
            members = np.flatnonzero(fold_of_task == fold)
            if not len(members):
                continue
            slot = np.full(len(task_keys), -1)
            slot[members] = np.arange(len(members))
            row_slot = np.repeat(slot, sizes)
            query = (fold_of_row == fold) & (rank < self.query)
            support = (fold_of_row == fold) & (rank >= self.query) & (
                rank < self.query + self.support)
            width = int(min(self.support, sizes[members].max() - self.query))
            t = len(members)
            support_ids = np.zeros((t, width), np.int64)
            support_labels, mask = np.zeros((t, width)), np.zeros((t, width))
            query_ids, real = np.zeros((t, self.query), np.int64), np.zeros((t, self.query), bool)
            rows_s, rows_q = order[support], order[query]
            at_s = (row_slot[support], rank[support] - self.query)
            at_q = (row_slot[query], rank[query])
            support_ids[at_s], support_labels[at_s], mask[at_s] = items[rows_s], labels[rows_s], 1.0
            query_ids[at_q], real[at_q] = items[rows_q], True
            query_labels = np.zeros((t, self.query))
            query_labels[at_q] = labels[rows_q]
            keep = np.ones(len(tasks), bool)
            keep[order[fold_of_row == fold]] = False
            out.append((keep, FoldInTask(support_ids, query_ids, support_labels, mask, real),
                        query_labels[real]))
        return out


def held_out_grid(fit: Callable[[np.ndarray | None, Hashable], FactorModel],
                  settings: Iterable[Hashable], strengths: Iterable[float],
                  tasks: list[FoldInTask], labels: np.ndarray,
                  held_out: list[tuple[np.ndarray, FoldInTask, np.ndarray]],
                  total: Callable[[np.ndarray], np.ndarray] | None = None,
                  kind: str = "rating"
                  ) -> tuple[dict[tuple[Hashable, float], float], dict[Hashable, FactorModel],
                             int]:
    """``fold_in_grid`` of ``fit(None, setting)`` (the factorisation of every training row)
    on the validation ``tasks``, pooled with each held-out fold's (``HeldOutProtocol
    .folds_of``: the fold's tasks folded into ``fit(rows, setting)``, fitted without
    them): each pair's loss over the validation and held-out query rows together, and the
    factorisations of every row. The held-out folds are the same on every rank (every rank
    holds every training row), so only the validation losses are summed by ``total``.
    Without ``held_out`` (``HeldOutProtocol.folds_beside`` gives none for a large
    validation split) the validation split is scored alone."""
    settings, strengths = list(settings), list(strengths)
    every_row = factorisations(lambda s: fit(None, s))
    folds = [factorisations(lambda s, keep=keep: fit(keep, s)) for keep, _, _ in held_out]
    fit_all([every_row, *folds], settings)  # on threads, every fit of the grid at once
    losses, models, rows = fold_in_grid(every_row, settings, strengths, tasks, labels,
                                        total=total, kind=kind)
    sums = {key: loss * rows for key, loss in losses.items()}
    for fold_fits, (_, fold_task, fold_labels) in zip(folds, held_out):
        fold_losses, _, n = fold_in_grid(fold_fits, settings, strengths, [fold_task],
                                         fold_labels, kind=kind)
        for key, loss in fold_losses.items():
            sums[key] += loss * n
        rows += n
    return ({key: float(v / rows) if rows else 0.0 for key, v in sums.items()}, models,
            rows)


def _fold_in_task(batch: Mapping, data: ReferenceData) -> FoldInTask:
    """A task batch (NumPy or tensors) as the fold-in reads it, a multi-slot reference
    feature reduced to its first slot."""
    return FoldInTask.of(_first_slot(_numpy(batch), data), data.feature, data.label)


def _fit_factor_model(data: ReferenceData, train: Mapping[str, np.ndarray],
                      labels: np.ndarray, valid_tasks: list[FoldInTask],
                      valid_labels: np.ndarray, items: np.ndarray, seed: int,
                      held_out: list[tuple[np.ndarray, FoldInTask, np.ndarray]]):
    """The factorisation fold-in reference, its width, ``reg``, item bias, fold-in prior and
    ``fold_in`` chosen on validation and the training tasks ``held_out`` in turn
    (``held_out_grid``): ``(predict, settings)``. ``items``: the training rows' reference
    ids."""
    task_ids = np.asarray(train[TASK_COLUMN])
    widths = MF_FACTORS_CLICKS if data.kind == "binary" else (MF_FACTORS,)
    regs = MF_REGS_CLICKS if data.kind == "binary" else MF_REGS

    def fit(rows: np.ndarray | None, setting: tuple) -> FactorModel:
        rows = slice(None) if rows is None else rows
        return FactorModel(task_ids[rows], items[rows], labels[rows], factors=setting[0],
                           reg=setting[1], seed=seed, item_bias=setting[2])

    losses, models, _ = held_out_grid(
        fit, [(w, r, b, p) for w in widths for r in regs for b in MF_ITEM_BIASES
              for p in FOLD_IN_PRIORS], MF_FOLD_IN,
        valid_tasks, valid_labels, held_out, kind=data.kind)
    fit, strength = min(losses, key=losses.get)
    model = models[fit]

    def predict(batch: Mapping) -> np.ndarray:
        return _clip(data.kind, _fold_in_task(batch, data).predict(model, strength))
    return predict, {"factors": fit[0], "reg": fit[1], "item_bias": fit[2],
                     "fold_in": strength, "fold_in_prior": fit[3]}


@dataclasses.dataclass
class References:
    """The fitted reference predictors (name -> predict function) and the settings each
    chose on validation."""

    predictors: dict[str, Predict]
    chosen: dict[str, dict]


def _task_predict(fn: Callable[[Mapping], np.ndarray]) -> Predict:
    """A per-row function of query features -> a predict function of task or row batches."""
    def predict(batch: Mapping) -> np.ndarray:
        if "query" in batch:
            query = {k: np.asarray(v) for k, v in batch["query"].items()}
            t, q = query["mask"].shape
            flat = {k: v.reshape(t * q, *v.shape[2:]) for k, v in query.items()}
            return fn(flat).reshape(t, q)
        return fn({k: np.asarray(v) for k, v in batch.items()})
    return predict


def fit_references(data: ReferenceData, train_batches: Iterable[Mapping],
                   valid_batches: list[Mapping], tasks: bool, seed: int = 0,
                   members: int = 1, held_out: HeldOutProtocol | None = None) -> References:
    """Fits every reference on the training rows, choosing its settings on validation.

    Args:
        data: Label kind, reference feature and linear-model features.
        train_batches: Batches (row or task layout) of the training split.
        valid_batches: Batches of the validation split: task batches (``tasks``: scored on
            their query rows, offsets from their support rows) or row batches.
        tasks: Whether the evaluated data are tasks with support rows.
        seed: Seeds the linear model's batch order.
        members: The linear model is the mean of this many fits, seeded ``seed``,
            ``seed + 1000``, ...: as many as the model's ensemble has members
            (``model.members``), so that the reference is averaged as the model is.
        held_out: How the factorisation holds out training tasks to choose its settings
            on beside the validation split (None: on the validation split alone).
    """
    names = {data.label, *data.candidates, *data.sparse, *data.dense}
    batches = iter(train_batches)
    head = next(batches, None)  # the first batch says whether rows carry their task
    factorise = (tasks and head is not None and TASK_COLUMN in head
                 and "support" not in head)
    train = rows_of(itertools.chain([] if head is None else [head], batches),
                    names | ({TASK_COLUMN} if factorise else set()))
    labels = np.asarray(train[data.label], np.float64)
    if not len(labels):
        raise ValueError("fit_references: the training split has no rows")
    valid_rows = query_rows(valid_batches, names) if tasks else rows_of(valid_batches, names)
    valid_labels = np.asarray(valid_rows[data.label], np.float64)
    global_mean = float(labels.mean())
    predictors: dict[str, Predict] = {
        "global mean": _task_predict(lambda rows: np.full(len(rows[data.label]), global_mean))}
    chosen: dict[str, dict] = {"global mean": {}}

    losses = {}
    for feature in data.candidates:
        base = FeatureMean(first_column(train[feature]), labels)
        for d in DAMPINGS:
            predicted = _clip(data.kind, base.with_damping(d)(first_column(valid_rows[feature])))
            losses[(feature, d)] = (loss_of(data.kind, valid_labels, predicted), base)
    feature, damping = min(losses, key=lambda key: losses[key][0])
    data = dataclasses.replace(data, feature=feature)
    base = losses[(feature, damping)][1]
    if not tasks:
        item = base.with_damping(damping)
        predictors[f"{data.feature} mean"] = _mean_predict(item, data)
        chosen[f"{data.feature} mean"] = {"damping": item.damping}
    else:
        # the feature is chosen on validation; the dampings on validation pooled with the
        # training tasks held out in turn, as the factorisation's settings are
        items = first_column(train[data.feature])
        valid_tasks = [_fold_in_task(b, data) for b in valid_batches]
        folds = (held_out.folds_beside(len(valid_labels), np.asarray(train[TASK_COLUMN]),
                                       items, labels)
                 if factorise and held_out is not None else [])
        pooled = mean_offset_grid(
            base, lambda keep: FeatureMean(items[keep], labels[keep]), valid_tasks,
            valid_labels, folds, data.kind)
        d_item = min((key for key in pooled if key[1] is None), key=pooled.get)[0]
        predictors[f"{data.feature} mean"] = _mean_predict(base.with_damping(d_item), data)
        chosen[f"{data.feature} mean"] = {"damping": d_item}
        d_item, d_task = min((key for key in pooled if key[1] is not None), key=pooled.get)
        predictors[f"{data.feature} mean + task offset"] = _mean_offset_predict(
            base.with_damping(d_item), d_task, data)
        chosen[f"{data.feature} mean + task offset"] = {"damping": d_item,
                                                         "task_damping": d_task}
        if factorise:
            name = "matrix factorisation fold-in"
            predictors[name], chosen[name] = _fit_factor_model(
                data, train, labels, valid_tasks, valid_labels, items, seed, folds)
    if data.kind == "binary":
        fits = [fit_linear(data, train, valid_rows, seed=seed + MEMBER_SEED_STRIDE * m)
                for m in range(members)]
        models = [model for model, _ in fits]
        predictors["logistic regression"] = _task_predict(
            lambda rows: np.mean([m.predict_rows(rows) for m in models], axis=0))
        chosen["logistic regression"] = (fits[0][1] if members == 1 else
                                         {"fits": [settings for _, settings in fits]})
    log.info("references fitted on %d training rows; chosen on %d validation rows: %s",
             len(labels), len(valid_labels), chosen)
    return References(predictors, chosen)


def _numpy(batch: Mapping) -> dict:
    return {k: ({kk: np.asarray(vv) for kk, vv in v.items()} if isinstance(v, Mapping)
                else np.asarray(v)) for k, v in batch.items()}


def _first_slot(batch: dict, data: ReferenceData) -> dict:
    """The support and query rows with the reference feature reduced to its first slot."""
    out = dict(batch)
    for role in ("support", "query"):
        rows = dict(batch[role])
        if rows[data.feature].ndim == 3:
            rows[data.feature] = rows[data.feature][..., 0]
        out[role] = rows
    return out


def query_rows(batches: Iterable[Mapping], names: Iterable[str]) -> dict[str, np.ndarray]:
    """The real query rows of task batches."""
    names = list(names)
    out: dict[str, list] = {n: [] for n in names}
    for batch in batches:
        real = np.asarray(batch["query"]["mask"]) > 0
        for n in names:
            out[n].append(np.asarray(batch["query"][n])[real])
    return {n: np.concatenate(v) if v else np.zeros(0) for n, v in out.items()}
