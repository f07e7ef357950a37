"""Puts a tower's dense inputs on a unit scale (``model.dense_scaling``).

A dense input read as stored can be any size: a raw count, a price, an hour written as
14102100. A network's first layer, initialised for inputs of about unit size, saturates
or diverges on such values, and so does the logistic regression reference, which trains
by the same kind of step. When a run starts, each dense input's mean and standard
deviation over every row of the training split are fitted (on every rank alike, from the
whole split) and set in every tower of the pipeline (``Tower.set_dense_scaling``): the
tower reads ``(x - mean) / std``. They are tower weights that are neither trained nor
adapted, so checkpoints, ``gmeta eval`` and the SavedModel keep them, and a server scales
a request as training did. ``gmeta eval``'s logistic regression reads the inputs scaled
the same way (``evaluation.reference_data``).

``auto`` scales only an input whose training values reach beyond +-``DENSE_AUTO_LIMIT``,
leaving inputs already on a small scale (a logarithm of a count, as the Criteo source
writes them; an age) as they are; ``standard`` scales every input; ``none`` none.
"""

from __future__ import annotations

import logging

import numpy as np

from gmeta_tf.config import PipelineConfig
from gmeta_tf.data import DataError
from gmeta_tf.training.evaluation import split_dataset
from gmeta_tf.training.model_builder import Models

log = logging.getLogger(__name__)

#: Under ``auto``, an input whose training values reach beyond this (either sign) is
#: scaled.
DENSE_AUTO_LIMIT = 100.0
_ROWS_PER_READ = 4096


def dense_scaling(values: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The shift and scale ``[width]`` of dense values ``[rows, width]`` under ``mode``
    (``ModelConfig.dense_scaling``; see ``scaling_of``)."""
    moments = _Moments(np.asarray(values).shape[1])
    moments.add(values)
    return scaling_of(moments, mode)


def scaling_of(moments: "_Moments", mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The shift and scale of inputs with these moments under ``mode``: each input scaled
    is shifted by its mean and scaled by one over its standard deviation (a constant
    input: shifted only); the others are left (shift 0, scale 1)."""
    width = len(moments.mean)
    if mode == "none" or not moments.count:
        return np.zeros(width), np.ones(width)
    scaled = (np.ones(width, bool) if mode == "standard"
              else moments.largest > DENSE_AUTO_LIMIT)
    std = moments.std
    shift = np.where(scaled, moments.mean, 0.0)
    scale = np.where(scaled & (std > 0), 1.0 / np.where(std > 0, std, 1.0), 1.0)
    return shift, scale


class _Moments:
    """Count, mean, spread and largest absolute value of dense inputs ``[width]``, merged
    batch by batch (Chan, Golub and LeVeque's pairwise update): memory per input, not per
    row, and the same on every rank, as the batches come in file order."""

    def __init__(self, width: int) -> None:
        self.count = 0
        self.mean, self.m2, self.largest = np.zeros(width), np.zeros(width), np.zeros(width)

    def add(self, values: np.ndarray) -> None:
        x = np.asarray(values, np.float64)
        if not len(x):
            return
        n, mean = len(x), x.mean(axis=0)
        delta, total = mean - self.mean, self.count + n
        self.m2 += ((x - mean) ** 2).sum(axis=0) + delta ** 2 * self.count * n / total
        self.mean += delta * n / total
        self.count = total
        self.largest = np.maximum(self.largest, np.abs(x).max(axis=0))

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / max(self.count, 1))


def fit_dense_scaling(models: Models, config: PipelineConfig) -> None:
    """Fits the dense inputs' scaling on the training split and sets it in every tower of
    ``models`` (a fresh run; a resumed one restores it with the checkpoint)."""
    dense = dict(config.model.dense_features)
    mode = config.model.dense_scaling
    if not dense or mode == "none":
        return
    names = list(dense)
    moments = _Moments(sum(dense.values()))
    for batch in split_dataset(config, "warm", features=names, whole=True).rows(_ROWS_PER_READ):
        n = len(np.asarray(batch[names[0]]))
        values = np.concatenate([np.asarray(batch[name], np.float64).reshape(n, width)
                                 for name, width in dense.items()], axis=1)
        if not np.isfinite(values).all():
            column, value = _first_not_finite(values, dense)
            raise DataError(f"{config.data.path}: dense feature {column!r} holds {value} on "
                            f"the training split, expected finite numbers (a converted "
                            f"dataset holds 0.0 for a missing value)")
        moments.add(values)
    shift, scale = scaling_of(moments, mode)
    towers = [models.model.tower] + ([models.baseline.tower] if models.baseline else [])
    for tower in towers:
        tower.set_dense_scaling(shift, scale)
    labels = [f"{name}[{i}]" if width > 1 else name
              for name, width in dense.items() for i in range(width)]
    described = [f"{label} (mean {m:.6g}, " + (f"std {s:.6g})" if s > 0 else "constant)")
                 for label, m, s, on in zip(labels, moments.mean, moments.std,
                                            (shift != 0) | (scale != 1)) if on]
    if described:
        log.info("dense inputs scaled to unit size (model.dense_scaling: %s) over %d "
                 "training rows: %s", mode, moments.count, ", ".join(described))
    else:
        log.info("dense inputs read as stored (model.dense_scaling: %s): none reaches "
                 "beyond +-%g on the %d training rows", mode, DENSE_AUTO_LIMIT, moments.count)


def _first_not_finite(values: np.ndarray, dense: dict) -> tuple[str, str]:
    """The name of the first dense feature holding a value that is not finite, and it."""
    column = int(np.flatnonzero(~np.isfinite(values).all(axis=0))[0])
    for name, width in dense.items():
        if column < width:
            value = values[~np.isfinite(values[:, column]), column][0]
            return name, repr(float(value))
        column -= width
    raise AssertionError("unreachable")
