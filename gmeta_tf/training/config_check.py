"""Checks of a pipeline config against its dataset, before any work: every key that names
a split, a column or a label must name one the dataset has."""

from __future__ import annotations

import logging

from gmeta_tf import data as meta_io
from gmeta_tf.config import ConfigError, PipelineConfig

log = logging.getLogger(__name__)


def check_against_dataset(config: PipelineConfig, manifest: meta_io.Manifest, *,
                          training: bool, eval_split: bool, validation: bool = False) -> None:
    """Raises ConfigError naming the first key whose split, column or label is missing.

    Checked: with ``training``, the training split ``warm`` and ``train.validation_split``
    (when ``train.eval_every`` validates); with ``validation`` (``gmeta eval
    --validation``), ``train.validation_split``; with ``eval_split``, ``eval.split``; always
    ``eval.binary_label`` and ``eval.relevance_label`` (labels of the dataset). Tables'
    features, dense features and ``model.head.label`` are checked where the models are
    built.
    """
    splits = sorted({f.split for f in manifest.files})
    where = f"the dataset at {config.data.path}" if training else "the dataset scored"
    if training and "warm" not in splits:
        raise ConfigError(f"config key 'data.path' = {config.data.path!r} is not allowed: the "
                          f"dataset has no 'warm' split to train on (its splits: {splits})")
    split = config.train.validation_split
    validating = training and config.train.eval_every
    if (validating or validation) and split not in splits:
        hint = (" (or train.eval_every: 0 to train without validation)" if validating
                else " to score with gmeta eval --validation")
        raise ConfigError(f"config key 'train.validation_split' = {split!r} is not "
                          f"allowed: expected a split of {where}, one of {splits}{hint}")
    if eval_split and config.eval.split not in splits:
        raise ConfigError(f"config key 'eval.split' = {config.eval.split!r} is not allowed: "
                          f"expected a split of {where}, one of {splits}")
    if training:
        warn_unread_features(config, manifest)
    labels = [f.name for f in manifest.schema.labels]
    for key in ("binary_label", "relevance_label"):
        value = getattr(config.eval, key)
        if value is not None and value not in labels:
            raise ConfigError(f"config key 'eval.{key}' = {value!r} is not allowed: expected a "
                              f"label of {where}, one of {labels}")


def check_data_files(config: PipelineConfig, path: str, splits: list[str | None]
                     ) -> dict[str | None, meta_io.TaskDataset]:
    """Checks this rank's share of each split's files (None: every file of the dataset at
    ``path``) against the manifest before any work: size and schema, and with
    ``data.verify: checksum`` (the default) SHA-256. Raises DataError naming the file.

    Returns:
        Each split's dataset (this rank's share), as checked.
    """
    return {split: meta_io.TaskDataset(path, split, reader=config.data.reader,
                                       verify=config.data.verify)
            for split in dict.fromkeys(splits)}


def warn_unread_features(config: PipelineConfig, manifest: meta_io.Manifest) -> None:
    """Warns of each column a csv pipeline's mapping converts as a feature that no input
    of the model reads (no table lists it in ``features``, ``model.dense_features`` does
    not name it): the model trains without it, which the user who mapped it may not
    expect. The task column is not warned of (a new task's id has no trained row)."""
    if config.data.source != "csv":
        return
    from gmeta_tf.training.dataset_prep import csv_mapping

    mapping = csv_mapping(config)
    read = {f for table in config.model.tables.values() for f in table.features}
    read |= set(config.model.dense_features)
    present = {f.name for f in manifest.schema.features}
    mapped = [*((c, "sparse") for c in mapping.sparse),
              *((c, "multi_hot") for c in mapping.multi_hot),
              *((c, "dense") for c in mapping.dense)]
    for column, kind in mapped:
        if column in read or column == mapping.task or column not in present:
            continue
        where = (f"model.dense_features (name: width, e.g. {{{column}: 1}})" if kind == "dense"
                 else "the features of a table in model.tables")
        log.warning("data.mapping's %s column %r is an input of no model: the model trains "
                    "without it; to read it, add it to %s (or drop it from the mapping)",
                    kind, column, where)
