"""Puts a tower's dense inputs on a unit scale (``model.dense_scaling``).

A dense input read as stored can be any size: a raw count, a price, an hour written as
14102100. A network's first layer, initialised for inputs of about unit size, saturates
or diverges on such values, and so does the logistic regression reference, which trains
by the same kind of step. When a run starts, each dense input's mean and standard
deviation over every row of the training split are fitted (each rank reads its shard, and
the moments are merged over the ranks: the same values on every rank) and set in every
tower of the pipeline (``Tower.set_dense_scaling``): the
tower reads ``(x - mean) / std``. An input with a long tail (a count, a price: its largest
value many standard deviations out) is read as its signed logarithm ``sign(x) log(1 +
|x|)`` first, with the mean and deviation of that: standardised as they are, most of its
values would sit in a sliver near the mean, a few far out. They are tower weights that
are neither trained nor adapted, so checkpoints, ``gmeta eval`` and the SavedModel keep
them, and a server scales a request as training did. ``gmeta eval``'s logistic
regression reads the inputs scaled the same way (``evaluation.reference_data``).

``auto`` scales only an input whose training values reach beyond +-``DENSE_AUTO_LIMIT``,
leaving inputs already on a small scale (a logarithm of a count, as the Criteo source
writes them; an age) as they are, and takes the logarithm of those among them whose
farthest value lies more than ``DENSE_TAIL_LIMIT`` standard deviations from their mean
and, in their logarithm, less than half as far;
``standard`` standardises every input as it is, ``log`` every input's logarithm,
``none`` reads them as stored.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.config import PipelineConfig
from gmeta_tf.data import DataError
from gmeta_tf.training.evaluation import ROWS_PER_READ, split_dataset
from gmeta_tf.training.model_builder import Models
from gmeta_tf.training.references import signed_log
from gmeta_tf.training.rank_agreement import on_all_ranks

log = logging.getLogger(__name__)

#: Under ``auto``, an input whose training values reach beyond this (either sign) is
#: scaled.
DENSE_AUTO_LIMIT = 100.0
#: Under ``auto``, a scaled input whose farthest value lies more than this many standard
#: deviations from its mean (and less than half as far in its logarithm) is read as its
#: logarithm: a long tail. Standardised normal values stay within about 6 over a billion
#: rows, uniform ones within 1.8; the Criteo sample's raw counts beyond 100 reach 20-72
#: (3-7 in their logarithms).
DENSE_TAIL_LIMIT = 10.0


def dense_scaling(values: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shift, scale and log flags ``[width]`` of dense values ``[rows, width]`` under
    ``mode`` (``ModelConfig.dense_scaling``; see ``scaling_of``)."""
    moments = _Moments(np.asarray(values).shape[1])
    moments.add(values)
    return scaling_of(moments, mode)


def scaling_of(moments: "_Moments", mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shift, scale and log flags (1: read as its signed logarithm first) of inputs
    with these moments under ``mode``: each input scaled is shifted by its mean and scaled
    by one over its standard deviation (a constant input: shifted only), both of its
    logarithm where flagged; the others are left (shift 0, scale 1, flag 0)."""
    width = len(moments.raw.mean)
    if mode == "none" or not moments.count:
        return np.zeros(width), np.ones(width), np.zeros(width)
    if mode in ("standard", "log"):
        scaled = np.ones(width, bool)
        logged = np.full(width, mode == "log")
    else:
        scaled = moments.largest > DENSE_AUTO_LIMIT
        # a long tail the logarithm draws in: not a few far values of another kind, such
        # as a missing hour stored as 0 among stamps of 14102100 (as far out either way,
        # and the logarithm of the stamps would lose their differences in float32)
        logged = scaled & (moments.tail > DENSE_TAIL_LIMIT) & (
            moments.logged_tail * 2 < moments.tail)
    mean = np.where(logged, moments.logged.mean, moments.raw.mean)
    std = np.where(logged, moments.logged.std, moments.raw.std)
    # constant by its least and largest values: a mean merged batch by batch is off in its
    # last bits, which leaves a constant's deviation at ~1e-14, not 0
    varies = moments.varies & (std > 0)
    shift = np.where(scaled, mean, 0.0)
    scale = np.where(scaled & varies, 1.0 / np.where(varies, std, 1.0), 1.0)
    return shift, scale, logged.astype(np.float64)


class _Spread:
    """Count, mean and spread ``[width]``, merged batch by batch (Chan, Golub and
    LeVeque's pairwise update)."""

    def __init__(self, width: int) -> None:
        self.count = 0
        self.mean, self.m2 = np.zeros(width), np.zeros(width)

    def add(self, x: np.ndarray) -> None:
        mean = x.mean(axis=0)
        self.merge(len(x), mean, ((x - mean) ** 2).sum(axis=0))

    def merge(self, n: int, mean: np.ndarray, m2: np.ndarray) -> None:
        """Adds ``n`` values of this mean and spread (sum of squared deviations)."""
        if not n:
            return
        delta, total = mean - self.mean, self.count + n
        self.m2 += m2 + delta ** 2 * self.count * n / total
        self.mean += delta * n / total
        self.count = total

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / max(self.count, 1))


class _Moments:
    """What the scaling of dense inputs ``[width]`` is chosen from, merged batch by batch:
    the mean and spread of the values and of their signed logarithms, and their least and
    largest values. Memory per input, not per row; merged over ranks in rank order
    (``merged_over_ranks``), so every rank holds the same."""

    def __init__(self, width: int) -> None:
        self.raw, self.logged = _Spread(width), _Spread(width)
        self.low, self.high = np.full(width, np.inf), np.full(width, -np.inf)

    def add(self, values: np.ndarray) -> None:
        x = np.asarray(values, np.float64)
        if not len(x):
            return
        self.raw.add(x)
        self.logged.add(signed_log(x))
        self.low, self.high = np.minimum(self.low, x.min(axis=0)), np.maximum(self.high,
                                                                              x.max(axis=0))

    @property
    def count(self) -> int:
        return self.raw.count

    def packed(self) -> np.ndarray:
        """The moments as one array, for ``merged_over_ranks``."""
        return np.concatenate([[self.count], self.raw.mean, self.raw.m2, self.logged.mean,
                               self.logged.m2, self.low, self.high])

    def merged_over_ranks(self) -> "_Moments":
        """Every rank's moments merged in rank order: the same on every rank (a collective:
        every rank calls it)."""
        return _Moments.from_packed(distributed.allgather(self.packed()), len(self.low))

    @staticmethod
    def from_packed(packed: np.ndarray, width: int) -> "_Moments":
        """Moments ``packed`` one after another, merged in order."""
        out = _Moments(width)
        for row in np.asarray(packed).reshape(-1, 1 + 6 * width):
            n, parts = int(row[0]), np.split(row[1:], 6)
            if n:
                out.raw.merge(n, parts[0], parts[1])
                out.logged.merge(n, parts[2], parts[3])
                out.low, out.high = np.minimum(out.low, parts[4]), np.maximum(out.high, parts[5])
        return out

    @property
    def largest(self) -> np.ndarray:
        """The largest absolute value of each input."""
        if not self.count:
            return np.zeros_like(self.low)
        return np.maximum(np.abs(self.low), np.abs(self.high))

    @property
    def varies(self) -> np.ndarray:
        """Whether each input takes more than one value."""
        return self.high > self.low

    @property
    def tail(self) -> np.ndarray:
        """How many standard deviations each input's farthest value lies from its mean
        (0 for a constant input)."""
        return _farthest(self.low, self.high, self.raw)

    @property
    def logged_tail(self) -> np.ndarray:
        """``tail`` of the inputs' signed logarithms."""
        return _farthest(signed_log(self.low), signed_log(self.high), self.logged)


def _farthest(low: np.ndarray, high: np.ndarray, spread: _Spread) -> np.ndarray:
    far = np.maximum(high - spread.mean, spread.mean - low)
    std = spread.std
    varies = (high > low) & (std > 0)
    return np.where(varies, far / np.where(varies, std, 1.0), 0.0)


def fit_dense_scaling(models: Models, config: PipelineConfig) -> None:
    """Fits the dense inputs' scaling on the training split and sets it in every tower of
    ``models`` (a fresh run; a resumed one restores it with the checkpoint)."""
    dense = dict(config.model.dense_features)
    mode = config.model.dense_scaling
    if not dense or mode == "none":
        return
    names, width = list(dense), sum(dense.values())

    def read_shard() -> _Moments:  # this rank's shard of the training split
        moments = _Moments(width)
        try:
            for batch in split_dataset(config, "warm", features=names).rows(ROWS_PER_READ):
                n = len(np.asarray(batch[names[0]]))
                values = np.concatenate([np.asarray(batch[name], np.float64).reshape(n, w)
                                         for name, w in dense.items()], axis=1)
                if not np.isfinite(values).all():
                    column = int(np.flatnonzero(~np.isfinite(values).all(axis=0))[0])
                    value = values[~np.isfinite(values[:, column]), column][0]
                    raise DataError(f"{config.data.path}: dense feature "
                                    f"{_feature_of(column, dense)!r} holds {float(value)!r} "
                                    f"on the training split, expected finite numbers (a "
                                    f"converted dataset holds 0.0 for a missing value)")
                moments.add(values)
        except tf.errors.OpError as e:  # a reader's failure, refused on every rank alike
            raise DataError(f"{config.data.path}: reading the training split's dense inputs "
                            f"failed: {e.message}") from e
        return moments

    # a rank that cannot read its shard stops every rank, not only itself; the moments are
    # then merged over the ranks
    moments = on_all_ranks(read_shard, "reading the training split's dense inputs")
    moments = moments.merged_over_ranks()
    shift, scale, logged = scaling_of(moments, mode)
    towers = [models.model.tower] + ([models.baseline.tower] if models.baseline else [])
    for tower in towers:
        tower.set_dense_scaling(shift, scale, logged)
    labels = [f"{name}[{i}]" if w > 1 else name for name, w in dense.items() for i in range(w)]
    spreads = [(moments.logged if lg else moments.raw) for lg in logged]
    described = [f"{label} (" + ("signed log: " if lg else "") + f"mean {sp.mean[i]:.6g}, "
                 + (f"std {sp.std[i]:.6g})" if moments.varies[i] else "constant)")
                 for i, (label, lg, sp, on) in enumerate(zip(
                     labels, logged, spreads, (shift != 0) | (scale != 1) | (logged > 0)))
                 if on]
    if described:
        log.info("dense inputs scaled to unit size (model.dense_scaling: %s) over %d "
                 "training rows: %s", mode, moments.count, ", ".join(described))
    else:
        log.info("dense inputs read as stored (model.dense_scaling: %s): none reaches "
                 "beyond +-%g on the %d training rows", mode, DENSE_AUTO_LIMIT, moments.count)


def _feature_of(column: int, dense: dict) -> str:
    """The name of the dense feature the ``column``-th input belongs to."""
    for name, width in dense.items():
        if column < width:
            return name
        column -= width
    raise AssertionError("unreachable")
