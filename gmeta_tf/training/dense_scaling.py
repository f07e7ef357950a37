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
from gmeta_tf.training.evaluation import split_rows
from gmeta_tf.training.model_builder import Models

log = logging.getLogger(__name__)

#: Under ``auto``, an input whose training values reach beyond this (either sign) is
#: scaled.
DENSE_AUTO_LIMIT = 100.0


def dense_scaling(values: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The shift and scale ``[width]`` of dense values ``[rows, width]`` under ``mode``
    (``ModelConfig.dense_scaling``): each column scaled is shifted by its mean and scaled
    by one over its standard deviation (a constant column: shifted only); the others are
    left (shift 0, scale 1)."""
    values = np.asarray(values, np.float64)
    width = values.shape[1]
    if mode == "none" or not len(values):
        return np.zeros(width), np.ones(width)
    scaled = (np.ones(width, bool) if mode == "standard"
              else np.abs(values).max(axis=0) > DENSE_AUTO_LIMIT)
    mean, std = values.mean(axis=0), values.std(axis=0)
    shift = np.where(scaled, mean, 0.0)
    scale = np.where(scaled & (std > 0), 1.0 / np.where(std > 0, std, 1.0), 1.0)
    return shift, scale


def fit_dense_scaling(models: Models, config: PipelineConfig) -> None:
    """Fits the dense inputs' scaling on the training split and sets it in every tower of
    ``models`` (a fresh run; a resumed one restores it with the checkpoint)."""
    dense = dict(config.model.dense_features)
    if not dense or config.model.dense_scaling == "none":
        return
    rows = split_rows(config, "warm", list(dense))
    n = len(next(iter(rows.values())))
    values = np.concatenate([np.asarray(rows[name], np.float64).reshape(n, width)
                             for name, width in dense.items()], axis=1)
    if not np.isfinite(values).all():
        column, at = _first_not_finite(values, dense)
        raise DataError(f"{config.data.path}: dense feature {column!r} holds {at} on the "
                        f"training split, expected finite numbers (a converted dataset "
                        f"holds 0.0 for a missing value)")
    shift, scale = dense_scaling(values, config.model.dense_scaling)
    towers = [models.model.tower] + ([models.baseline.tower] if models.baseline else [])
    for tower in towers:
        tower.set_dense_scaling(shift, scale)
    names = [f"{name}[{i}]" if width > 1 else name
             for name, width in dense.items() for i in range(width)]
    described = [f"{name} (mean {m:.6g}, std {1 / k:.6g})" for name, m, k, on in
                 zip(names, shift, scale, (shift != 0) | (scale != 1)) if on]
    if described:
        log.info("dense inputs scaled to unit size (model.dense_scaling: %s) over %d "
                 "training rows: %s", config.model.dense_scaling, n, ", ".join(described))
    else:
        log.info("dense inputs read as stored (model.dense_scaling: auto): none reaches "
                 "beyond +-%g on the %d training rows", DENSE_AUTO_LIMIT, n)


def _first_not_finite(values: np.ndarray, dense: dict) -> tuple[str, str]:
    """The name of the first dense feature holding a value that is not finite, and it."""
    column = int(np.flatnonzero(~np.isfinite(values).all(axis=0))[0])
    for name, width in dense.items():
        if column < width:
            value = values[~np.isfinite(values[:, column]), column][0]
            return name, repr(float(value))
        column -= width
    raise AssertionError("unreachable")
