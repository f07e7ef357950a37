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
        if d.source == "dataset" or _made_as_configured(config, manifest):
            log.info("dataset %s exists: using it", d.path)
            return manifest
        # A generated or converted dataset is a cache of the config: made with other
        # parameters (another split, an older generator), it would be trained and evaluated
        # on silently. The raw input is still there, so it is made again.
        log.info("dataset %s was made with other parameters (split %s): making it again",
                 d.path, {k: v for k, v in manifest.split.items()
                          if k in _SPLIT_FIELDS or k == "source"})
    output = meta_io.OutputConfig(rows_per_block=d.rows_per_block, overwrite=True)
    log.info("making dataset %s from %s", d.path, d.source)
    if d.source == "synthetic":
        return synthetic.generate(d.path, d.synthetic.tasks, d.synthetic.rows_per_task, d.seed,
                                  split=_configured_split(config), output=output)
    if d.source == "movielens":
        return meta_io.convert_movielens(d.raw, d.path, split=_configured_split(config),
                                         output=output)
    if d.source == "criteo":
        return meta_io.convert_criteo(d.raw, d.path, task_column=d.task_column,
                                      split=_split(config, _CRITEO_SPLIT), output=output)
    raise ConfigError(f"config key 'data.path' = {d.path!r} is not allowed: expected a dataset "
                      f"directory with {MANIFEST_NAME} (data.source is 'dataset')")


_CRITEO_SPLIT = meta_io.SplitConfig(query_size=4, min_rows=8)
_SPLIT_FIELDS = tuple(f.name for f in dataclasses.fields(meta_io.SplitConfig))


def _configured_split(config: PipelineConfig) -> meta_io.SplitConfig:
    defaults = {"synthetic": synthetic.DEFAULT_SPLIT, "criteo": _CRITEO_SPLIT}
    return _split(config, defaults.get(config.data.source, meta_io.SplitConfig()))


def _made_as_configured(config: PipelineConfig, manifest: meta_io.Manifest) -> bool:
    """Whether a generated/converted dataset was made from this config's source and split."""
    d = config.data
    recorded = manifest.split
    wanted = dataclasses.asdict(_configured_split(config))
    if any(recorded.get(k) != v for k, v in wanted.items()):
        return False
    source = recorded.get("source") or {}
    if d.source == "synthetic":
        return source == synthetic.source_record(d.synthetic.tasks, d.synthetic.rows_per_task,
                                                 d.seed)
    if d.source == "criteo":
        return source.get("task_column", "C2") == d.task_column
    return True


def eval_dataset(config: PipelineConfig, item: str) -> tuple[str, str]:
    """A dataset to score with ``gmeta eval``: ``(name, dataset directory)``.

    ``item`` is a dataset directory (used as is) or a raw file of the pipeline's source
    format, converted once into ``<run_dir>/eval/data/<stem>``: every row kept (no
    validation or cold split), tasks split into support and query rows as the pipeline's
    protocol says for a meta model, all rows scored for a plain CTR model.
    """
    if dataset_exists(item):
        return os.path.basename(os.path.normpath(item)), item
    if not os.path.isfile(item):
        raise ConfigError(f"eval data {item!r} is neither a dataset directory (with "
                          f"{MANIFEST_NAME}) nor a file")
    stem = os.path.splitext(os.path.basename(item))[0]
    out = os.path.join(config.run_dir, "eval", "data", stem)
    protocol = _configured_split(config)
    if config.meta.enabled:
        split = dataclasses.replace(protocol, warm_fraction=1.0, valid_fraction=0.0)
    else:
        split = meta_io.SplitConfig(seed=protocol.seed, warm_fraction=1.0, valid_fraction=0.0,
                                    query_size=0, min_rows=1)
    if dataset_exists(out):
        recorded = meta_io.Manifest.load(out).split
        if (all(recorded.get(k) == v for k, v in dataclasses.asdict(split).items())
                and (recorded.get("source") or {}).get("paths") == [item]):
            return stem, out
    output = meta_io.OutputConfig(rows_per_block=config.data.rows_per_block, overwrite=True)
    source = config.data.source
    log.info("converting eval data %s -> %s", item, out)
    if source == "criteo":
        meta_io.convert_criteo(item, out, task_column=config.data.task_column, split=split,
                               output=output)
    elif source == "movielens":
        meta_io.convert_movielens(item, out, split=split, output=output)
    else:
        raise ConfigError(f"eval data {item!r}: a raw file needs data.source 'criteo' or "
                          f"'movielens' to be converted (data.source is {source!r}); give a "
                          f"dataset directory instead")
    return stem, out
