"""Fits a pipeline's label prior (``model.prior``) on its training split before step 0.

Every rank reads the whole training split (the prior's feature and the label only) and
fits the same prior, so no collective is needed and every rank's copy is equal. The
damping, unless configured, is the one of ``references.DAMPINGS`` whose prior alone (the
global mean plus it) has the lowest loss on the validation split's query rows (its rows,
for a plain CTR model): the choice the item-mean reference makes.
"""

from __future__ import annotations

import logging

import numpy as np

from gmeta_tf import data as meta_io
from gmeta_tf.config import ConfigError, PipelineConfig
from gmeta_tf.models.label_prior import LabelPrior
from gmeta_tf.training.references import DAMPINGS, FeatureMean, loss_of, query_rows, rows_of

log = logging.getLogger(__name__)
_ROWS_PER_READ = 4096


def _split_rows(config: PipelineConfig, split: str, names: list[str],
                query_only: bool) -> dict[str, np.ndarray]:
    d = config.data
    dataset = meta_io.TaskDataset(d.path, split, rank=0, size=1, reader=d.reader,
                                  features=names, verify="size")
    if query_only:  # the protocol's fixed query rows, as validation scores them
        return query_rows(dataset.tasks(config.eval.tasks_per_batch, None, None), names)
    return rows_of(dataset.rows(_ROWS_PER_READ), names)


def fit_prior(prior: LabelPrior, config: PipelineConfig) -> dict[float, float]:
    """Fits ``prior`` on the training split; returns the validation loss of each damping
    tried (empty when ``model.prior.damping`` is set).

    Raises:
        ConfigError: No damping is configured and the validation split has no rows.
    """
    label, feature = config.model.head.label, prior.feature
    names = [feature, label]
    train = _split_rows(config, "warm", names, query_only=False)
    values, labels = train[feature], np.asarray(train[label], np.float64)
    mean = FeatureMean(values, labels)  # each value's sums and counts, once
    damping = config.model.prior.damping
    losses: dict[float, float] = {}
    if damping is None:
        split = config.train.validation_split
        try:
            valid = _split_rows(config, split, names, query_only=config.meta.enabled)
        except meta_io.DataError as err:
            raise ConfigError(f"config key 'model.prior.damping' = None is not allowed without "
                              f"a validation split to choose it on ({err}): set a damping, "
                              f"e.g. 10") from err
        if not len(valid[label]):
            raise ConfigError(f"config key 'model.prior.damping' = None is not allowed: the "
                              f"validation split {split!r} has no rows to choose it on; set "
                              f"a damping, e.g. 10")
        for d in DAMPINGS:
            losses[d] = loss_of(prior.kind, valid[label], mean.with_damping(d)(valid[feature]))
        damping = min(losses, key=losses.get)
    chosen = mean.with_damping(damping)
    prior.set_means(chosen.keys, chosen(chosen.keys), chosen.global_mean, damping)
    log.info("label prior of %r: %d values from %d training rows (global mean %.4g, "
             "output %s), damping %g%s", feature, len(chosen.keys), len(labels),
             chosen.global_mean, "logit" if prior.kind == "binary" else "rating", damping,
             f" (validation loss per damping: {losses})" if losses else "")
    return losses
