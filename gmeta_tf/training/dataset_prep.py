"""Makes a pipeline's dataset when it does not exist yet (``gmeta data prepare``).

Generated (``data.source: synthetic``, the embedded default) or converted from raw files
(``movielens``, ``criteo``) with ``gmeta_tf.data``; an existing dataset (a directory with
a manifest) is used as it is.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from gmeta_tf import data as meta_io
from gmeta_tf.config import ConfigError, PipelineConfig
from gmeta_tf.data import synthetic
from gmeta_tf.data.manifest import MANIFEST_NAME

log = logging.getLogger(__name__)


def dataset_exists(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST_NAME))


def _split(config: PipelineConfig, defaults: meta_io.SplitConfig) -> meta_io.SplitConfig:
    given = {k: v for k, v in dataclasses.asdict(config.data.split).items() if v is not None}
    return dataclasses.replace(defaults, seed=config.data.seed, **given)


def prepare_dataset(config: PipelineConfig, overwrite: bool = False) -> meta_io.Manifest:
    """The config's dataset: loaded when present, otherwise generated or converted.

    Args:
        config: The pipeline config (its ``data`` section).
        overwrite: Make it again even when it exists.

    Returns:
        The dataset's manifest.

    Raises:
        ConfigError: ``data.source: dataset`` and no dataset at ``data.path``.
    """
    d = config.data
    if dataset_exists(d.path) and not overwrite:
        manifest = meta_io.Manifest.load(d.path)
        if d.source != "synthetic" or _synthetic_matches(config, manifest):
            log.info("dataset %s exists: using it", d.path)
            return manifest
        # A generated dataset is a cache of the config: made with other parameters (or an
        # older generator), it would be trained and evaluated on silently.
        log.info("dataset %s was generated with other parameters (%s): making it again",
                 d.path, manifest.split.get("source"))
    output = meta_io.OutputConfig(rows_per_block=d.rows_per_block, overwrite=True)
    log.info("making dataset %s from %s", d.path, d.source)
    if d.source == "synthetic":
        return synthetic.generate(d.path, d.synthetic.tasks, d.synthetic.rows_per_task, d.seed,
                                  split=_split(config, synthetic.DEFAULT_SPLIT), output=output)
    if d.source == "movielens":
        return meta_io.convert_movielens(d.raw, d.path, split=_split(config, meta_io.SplitConfig()),
                                         output=output)
    if d.source == "criteo":
        defaults = meta_io.SplitConfig(query_size=4, min_rows=8)
        return meta_io.convert_criteo(d.raw, d.path, split=_split(config, defaults), output=output)
    raise ConfigError(f"config key 'data.path' = {d.path!r} is not allowed: expected a dataset "
                      f"directory with {MANIFEST_NAME} (data.source is 'dataset')")


def _synthetic_matches(config: PipelineConfig, manifest: meta_io.Manifest) -> bool:
    d = config.data
    expected = synthetic.source_record(d.synthetic.tasks, d.synthetic.rows_per_task, d.seed)
    return manifest.split.get("source") == expected
