"""Checks of a pipeline config against its dataset, before any work: every key that names
a split, a column or a label must name one the dataset has."""

from __future__ import annotations

from gmeta_tf import data as meta_io
from gmeta_tf.config import ConfigError, PipelineConfig


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
    labels = [f.name for f in manifest.schema.labels]
    for key in ("binary_label", "relevance_label"):
        value = getattr(config.eval, key)
        if value is not None and value not in labels:
            raise ConfigError(f"config key 'eval.{key}' = {value!r} is not allowed: expected a "
                              f"label of {where}, one of {labels}")


def check_data_files(config: PipelineConfig, path: str, splits: list[str | None]) -> None:
    """Checks this rank's share of each split's files (None: every file of the dataset at
    ``path``) against the manifest before any work: size and schema, and with
    ``data.verify: checksum`` (the default) SHA-256. Raises DataError naming the file."""
    for split in dict.fromkeys(splits):
        meta_io.TaskDataset(path, split, reader=config.data.reader, verify=config.data.verify)
