"""Fits a pipeline's label prior (``model.prior``) on its training split before step 0.

Each rank reads its own shard of the training split (the prior's feature, the label and
the task id only) and sums the label and counts the rows of each value, per fold of
tasks, it holds; the ranks' sums and counts are gathered (one allgather each, of the
distinct (fold, value) pairs a rank holds, not of its rows) and every rank merges them
into the same prior: the whole split's, and each fold's out-of-fold one (the sums of the
other folds). The damping, unless configured, is the one of ``references.DAMPINGS`` whose
whole prior alone (the global mean plus it) has the lowest loss on the validation split's
query rows (its rows, for a plain CTR model): the choice the item-mean reference makes,
from each rank's loss on its own shard, summed.

A prior with factors (``model.prior.factors``) is a matrix factorisation instead, fitted
by alternating least squares on the training rows of every rank (each rank's rows of the
feature, label and task are gathered; the rows, not the table, cross the network, so it
suits ratings of a few million rows). Its L2 strength, the fold-in strength and the
fold-in prior and how an item's bias is fitted, unless configured, are the ones of
``references.MF_REGS`` x ``references.MF_ITEM_BIASES`` x ``references.FOLD_IN_PRIORS`` x
``references.MF_FOLD_IN`` whose fold-in (each validation task's bias and factor the ridge
fit of its support rows at the fold-in strength, on the items' factors at the L2, their
biases fitted with the factors or held at damped item means, under the isotropic or the
empirical-Bayes prior) has the lowest
loss on the validation tasks' query rows, each rank scoring its own, pooled with the query
rows of the training tasks held out in turn where the validation split is small
(``references.HeldOutProtocol.folds_beside``: five folds, the factorisation fitted
without each, its tasks folded in as validation tasks are; the same on every rank): the
factorisation reference's search (``references.held_out_grid``), the validation losses
summed over the ranks. The
prior's factors and biases are the items' under the chosen prior
(``FactorModel.with_fold_in_prior``), so the tower's fold-in and its ridge solve shrink a
new task as the reference does.
Every rank fits the same rows in the same order; rank 0's result is then broadcast so the
ranks' priors are equal to the bit.
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

import numpy as np

from gmeta_tf import data as meta_io
from gmeta_tf import distributed
from gmeta_tf.config import ConfigError, PipelineConfig
from gmeta_tf.data.schema import TASK_COLUMN
from gmeta_tf.models.label_prior import MAX_FACTOR_NORM, LabelPrior
from gmeta_tf.training.references import (DAMPINGS, FOLD_IN_PRIORS, MF_FOLD_IN,
                                          MF_ITEM_BIASES, MF_REGS, FactorModel, FeatureMean,
                                          FoldInTask, HeldOutProtocol, held_out_grid,
                                          loss_of, query_rows, rows_of)

log = logging.getLogger(__name__)
_ROWS_PER_READ = 4096
T = TypeVar("T")


def _dataset(config: PipelineConfig, split: str, names: list[str]) -> meta_io.TaskDataset:
    """This rank's shard of a split, its ``names`` columns read."""
    d = config.data
    return meta_io.TaskDataset(d.path, split, reader=d.reader, features=names, verify="size")


def _shard_tasks(config: PipelineConfig, split: str, names: list[str]):
    """This rank's shard of a split's task batches (each task's fixed support and query
    rows, as validation scores them). Every task of the shard, none dropped to equal the
    ranks' batch counts."""
    return _dataset(config, split, names).tasks(config.eval.tasks_per_batch, None, None,
                                                equal_steps=False)


def _shard_rows(config: PipelineConfig, split: str, names: list[str],
                query_only: bool) -> dict[str, np.ndarray]:
    """This rank's shard of a split: its rows, or with ``query_only`` its tasks' fixed
    query rows (``_shard_tasks``)."""
    if query_only:
        return query_rows(_shard_tasks(config, split, names), names)
    return rows_of(_dataset(config, split, names).rows(_ROWS_PER_READ), names + [TASK_COLUMN])


def held_out_protocol(config: PipelineConfig) -> HeldOutProtocol:
    """The validation tasks' protocol, for the training tasks the factorisation holds out
    to choose its settings on (``references.HeldOutProtocol``): the dataset's split (its
    query rows a task, the fewest and most rows of a scored task, its seed). A validation
    or cold task is scored on every one of its stored query rows and adapted on every one
    of its support rows (``evaluation.task_batches``: scored batches have neither cap;
    ``data.query`` and ``data.support`` bound training batches only), so a held-out task
    is scored on the split's ``query_size`` rows (``data.query`` for a dataset that does
    not record it) and folded in from all the others."""
    recorded = meta_io.Manifest.load(config.data.path).split or {}
    stored = recorded.get("query_size")
    query = int(stored if stored is not None else config.data.query or 0)
    return HeldOutProtocol(query=query, support=1 << 30,
                           min_rows=int(recorded.get("min_rows") or query + 1),
                           max_rows=recorded.get("max_rows"), seed=int(recorded.get("seed", 0)),
                           last=recorded.get("query_selection") == "last")


def _read_validation(read: Callable[[], T], what: str, setting: str,
                     key: str = "damping") -> T:
    """``read()`` of the validation split, a missing or unreadable split refused as the
    reason ``model.prior.<key>`` None cannot choose ``what`` (``setting``: what to set
    instead, with an example)."""
    try:
        return read()
    except meta_io.DataError as err:
        raise ConfigError(f"config key 'model.prior.{key}' = None is not allowed without "
                          f"a validation split to choose {what} on ({err}): set "
                          f"{setting}") from err


def _gathered_means(values: np.ndarray, labels: np.ndarray, tasks: np.ndarray,
                    folds: int) -> tuple[FeatureMean, list[FeatureMean]]:
    """The mean label per value over every rank's rows and, with ``folds`` > 1, for each
    fold k the mean over the rows of the other folds' tasks (damped towards the same
    global mean), equal on every rank."""
    values, fold = np.asarray(values).astype(np.int64), np.mod(tasks.astype(np.int64), folds)
    parts = [(k, FeatureMean(values[fold == k], labels[fold == k])) for k in range(folds)]
    keys, sums, counts, of_fold = (
        distributed.allgather(np.concatenate(a)) for a in (
            [m.keys.astype(np.int64) for _, m in parts], [m.sums for _, m in parts],
            [m.counts for _, m in parts],
            [np.full(len(m.keys), k, np.int64) for k, m in parts]))
    whole = FeatureMean.from_sums(keys, sums, counts)
    out_of_fold = []
    for k in range(folds if folds > 1 else 0):
        rest = of_fold != k
        mean = FeatureMean.from_sums(keys[rest], sums[rest], counts[rest])
        mean.global_mean = whole.global_mean
        out_of_fold.append(mean)
    return whole, out_of_fold


def _validation_losses(kind: str, mean: FeatureMean, valid: dict[str, np.ndarray],
                       feature: str, label: str) -> tuple[dict[float, float], int]:
    """Each damping's loss on every rank's validation rows (the mean over all of them),
    and how many rows that is."""
    labels, values = valid[label], valid[feature]
    n = len(labels)
    sums = [loss_of(kind, labels, mean.with_damping(d)(values)) * n if n else 0.0
            for d in DAMPINGS]
    *sums, total = distributed.sum_over_ranks(np.array(sums + [n], np.float64))
    return ({d: float(s / total) for d, s in zip(DAMPINGS, sums)} if total else {},
            int(total))


def _factor_rows(config: PipelineConfig, train: dict
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's training rows of the factor prior, ``(tasks, items, labels)``, in the
    same order on every rank."""
    label, feature = config.model.head.label, config.model.prior.feature
    tasks, items = (distributed.allgather(np.asarray(train[k]).astype(np.int64))
                    for k in (TASK_COLUMN, feature))
    labels = distributed.allgather(np.asarray(train[label], np.float64))
    if not len(labels):
        raise ConfigError(f"config key 'model.prior.factors' = {config.model.prior.factors} "
                          f"is not allowed: the training split has no rows to factorise")
    return tasks, items, labels


def _choose_factors(config: PipelineConfig, tasks: np.ndarray, items: np.ndarray,
                    labels: np.ndarray):
    """The factor prior's L2, item bias, fold-in prior and fold-in strength, each the
    configured one or, unset, chosen (see the module docstring): ``((reg, item_bias,
    fold_in_prior, strength), the loss of each ((L2, item bias, prior), strength) tried
    (empty when nothing was left to choose), the factorisation of every row under the
    choice, and a function of (rows, L2, item bias) fitting rows under them)``."""
    section = config.model.prior
    label, feature = config.model.head.label, section.feature

    def fit(rows, reg, item_bias):
        rows = slice(None) if rows is None else rows
        return FactorModel(tasks[rows], items[rows], labels[rows], factors=section.factors,
                           reg=reg, item_bias=item_bias)

    reg, strength, losses = section.damping, section.fold_in, {}
    fold_in_prior, item_bias = section.fold_in_prior, section.item_bias
    split = config.train.validation_split
    if reg is None or strength is None or fold_in_prior is None or item_bias is None:
        names = [feature, label]
        unset = ("damping" if reg is None else "fold_in" if strength is None
                 else "fold_in_prior" if fold_in_prior is None else "item_bias")
        what = "the factorisation's L2, item bias, fold-in strength and fold-in prior"
        setting = ("model.prior.damping, model.prior.item_bias, model.prior.fold_in and "
                   "model.prior.fold_in_prior, e.g. 10, fitted, 3 and empirical")
        valid = _read_validation(
            lambda: [{role: {k: np.asarray(v) for k, v in batch[role].items()}
                      for role in ("support", "query")}
                     for batch in _shard_tasks(config, split, names)],
            what, setting, key=unset)
        valid_labels = query_rows(valid, [label])[label]
        valid_rows = int(distributed.sum_over_ranks([len(valid_labels)])[0])
        losses, models, rows = held_out_grid(
            lambda rows, setting: fit(rows, *setting),
            [(r, b, p) for r in (MF_REGS if reg is None else (reg,))
             for b in (MF_ITEM_BIASES if item_bias is None else (item_bias,))
             for p in (FOLD_IN_PRIORS if fold_in_prior is None else (fold_in_prior,))],
            MF_FOLD_IN if strength is None else (strength,),
            [FoldInTask.of(b, feature, label) for b in valid], valid_labels,
            held_out_protocol(config).folds_beside(valid_rows, tasks, items, labels),
            total=distributed.sum_over_ranks)
        if not rows:
            raise ConfigError(f"config key 'model.prior.{unset}' = None is not allowed: "
                              f"neither the validation split {split!r} nor a training task "
                              f"held out has query rows to choose {what} on; set {setting}")
        (reg, item_bias, fold_in_prior), strength = min(losses, key=losses.get)
        whole = models[(reg, item_bias, fold_in_prior)]
    else:
        whole = fit(None, reg, item_bias).with_fold_in_prior(fold_in_prior)
    return (reg, item_bias, fold_in_prior, strength), losses, whole, fit


def chosen_factor_settings(config: PipelineConfig) -> dict[str, object]:
    """The factor prior's settings its fit chooses where the config leaves them unset
    (``model.prior.damping``, ``item_bias``, ``fold_in_prior``, ``fold_in`` -> value),
    chosen once here, in one process reading the whole training split: ``gmeta tune``
    gives them to every trial and writes them with its choices, so the trials and the
    runs after them share one choice instead of each making it again. Empty without
    factors or with all four set."""
    section = config.model.prior
    keys = ("damping", "item_bias", "fold_in_prior", "fold_in")
    if section is None or not section.factors or all(
            getattr(section, k) is not None for k in keys):
        return {}
    names = [section.feature, config.model.head.label]
    train = _shard_rows(config, "warm", names, query_only=False)
    chosen, losses, _, _ = _choose_factors(config, *_factor_rows(config, train))
    log.info("the factor prior's settings, chosen once for every run: %s",
             dict(zip(keys, chosen)))
    return {f"model.prior.{k}": v for k, v in zip(keys, chosen)
            if getattr(section, k) is None}


def _fit_factors(prior: LabelPrior, config: PipelineConfig, train: dict
                 ) -> dict[tuple[float, float], float]:
    """Fits a prior with factors (see the module docstring); returns the loss of each ((L2,
    item bias, fold-in prior), fold-in strength) tried (empty when ``model.prior.damping``,
    ``fold_in``, ``fold_in_prior`` and ``item_bias`` are all set)."""
    feature = prior.feature
    tasks, items, labels = _factor_rows(config, train)
    (reg, item_bias, fold_in_prior, strength), losses, whole, fit = _choose_factors(
        config, tasks, items, labels)
    keys = whole.keys
    folds = [fit(np.mod(tasks, prior.folds) != k, reg, item_bias)
             .with_fold_in_prior(fold_in_prior)
             for k in range(prior.folds if prior.folds > 1 else 0)]

    def bias_and_factors(model):  # the prior of ``keys`` relative to the whole split's mean
        q, b = model.item(keys)
        return b + model.mean - whole.mean, q

    fold_parts = [bias_and_factors(m) for m in folds]
    prior.assign(keys, whole.biases, reg,
                 np.stack([b for b, _ in fold_parts]) if folds else None, whole.factors,
                 np.stack([q for _, q in fold_parts]) if folds else None, fold_in=strength,
                 unknown=whole.unknown_bias)
    variables = [prior.ids, prior.values, prior.fold_values, prior.factor_rows,
                 prior.fold_factor_rows, prior.damping, prior.fold_in, prior.factor_scale_value]
    distributed.broadcast_variables(variables)
    scale = float(prior.factor_scale().numpy())
    log.info("label prior of %r: a matrix factorisation with %d factors of %d values from %d "
             "training rows (mean %.4g), L2 %g, item biases %s, a new task folded in at "
             "strength %g under the %s prior%s, %s%s",
             feature, prior.factors, len(keys), len(labels), whole.mean, reg,
             "fitted with the factors" if item_bias == "fitted"
             else f"held at their means damped by {item_bias:g}", strength, fold_in_prior,
             "" if scale == 1.0 else f" (the tower reads its factors times {scale:.3g}: their "
                                     f"RMS norm capped at {MAX_FACTOR_NORM:g})",
             f"training rows read it out of {prior.folds} folds of tasks"
             if folds else "training rows read it with their own labels",
             f" (fold-in MAE on the validation and held-out training tasks per ((L2, item "
             f"bias, prior), strength): "
             f"{ {k: round(v, 5) for k, v in losses.items()} })" if losses else "")
    return losses


def fit_prior(prior: LabelPrior, config: PipelineConfig) -> dict:
    """Fits ``prior`` on the training split (on every rank at once, each reading its
    shard); returns the validation loss of each damping (or, with factors, each (L2,
    fold-in strength) pair) tried (empty when nothing was left to choose).

    Raises:
        ConfigError: No damping is configured and the validation split has no rows.
    """
    label, feature = config.model.head.label, prior.feature
    names = [feature, label]
    train = _shard_rows(config, "warm", names, query_only=False)
    if prior.factors:
        return _fit_factors(prior, config, train)
    mean, out_of_fold = _gathered_means(train[feature], np.asarray(train[label], np.float64),
                                        train[TASK_COLUMN], prior.folds)
    damping = config.model.prior.damping
    losses: dict[float, float] = {}
    if damping is None:
        split = config.train.validation_split
        valid = _read_validation(
            lambda: _shard_rows(config, split, names, query_only=config.meta.enabled),
            "it", "a damping, e.g. 10")
        losses, rows = _validation_losses(prior.kind, mean, valid, feature, label)
        if not rows:
            raise ConfigError(f"config key 'model.prior.damping' = None is not allowed: the "
                              f"validation split {split!r} has no rows to choose it on; set "
                              f"a damping, e.g. 10")
        damping = min(losses, key=losses.get)
    chosen = mean.with_damping(damping)
    keys = chosen.keys
    fold_means = (np.stack([m.with_damping(damping)(keys) for m in out_of_fold])
                  if out_of_fold else None)
    prior.set_means(keys, chosen(keys), chosen.global_mean, damping, fold_means)
    log.info("label prior of %r: %d values from %d training rows (global mean %.4g, "
             "output %s), damping %g, %s%s", feature, len(keys), int(mean.counts.sum()),
             chosen.global_mean, "logit" if prior.kind == "binary" else "rating", damping,
             f"training rows read it out of {prior.folds} folds of tasks"
             if out_of_fold else "training rows read it with their own labels",
             f" (validation loss per damping: {losses})" if losses else "")
    return losses
