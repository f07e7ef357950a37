"""Makes a pipeline's dataset when it does not exist yet, or no longer fits its config
(``gmeta data prepare``; ``gmeta train`` does it too).

Generated (``data.source: synthetic``, the embedded default) or converted from raw files
(``movielens``, ``criteo``, ``csv`` with a column mapping) with ``gmeta_tf.data``. Such a
dataset is a cache of the config: it is made again, with a log line saying why, when its
source (inputs, their sizes and times, the mapping), split or block size differ from the
config, or when a split has fewer blocks than the ranks that will read it. A dataset
converted beforehand (``data.source: dataset``) is never rewritten: a config that asks for
something it does not have is refused, naming the key.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from gmeta_tf import data as meta_io
from gmeta_tf.config import ConfigError, PipelineConfig, override_value
from gmeta_tf.data import synthetic
from gmeta_tf.data.converters.csv_mapping import recorded_mapping
from gmeta_tf.data.converters.csv_mapping import source_record as csv_source_record
from gmeta_tf.data.converters.pipeline import DEFAULT_MIN_BLOCKS
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import MANIFEST_NAME, verify_file

log = logging.getLogger(__name__)


def dataset_exists(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST_NAME))


def _split(config: PipelineConfig) -> meta_io.SplitConfig:
    """The config's split (for ``source: dataset`` without one: the source's default)."""
    d = config.data
    return d.split or dataclasses.replace(meta_io.source_split(d.source), seed=d.seed)


def csv_mapping(config: PipelineConfig) -> meta_io.CsvMapping:
    """The checked ``data.mapping`` of a ``csv`` pipeline. A mapping without a ``task``
    (every row its own task) serves only a plain CTR model, with one-row tasks kept."""
    mapping = config.data.mapping
    try:
        if isinstance(mapping, str):
            mapping = meta_io.CsvMapping.from_yaml(mapping)
        else:
            mapping = meta_io.CsvMapping.from_dict(dict(mapping))
    except DataError as err:
        raise ConfigError(f"config key 'data.mapping' is not allowed: {err}") from err
    if mapping.task is None:
        if config.meta.enabled:
            raise ConfigError("config key 'data.mapping.task' is missing: a meta model adapts "
                              "to each task on its support rows, so the mapping needs the "
                              "column whose value is the task (a user, an ad, a site); only a "
                              "plain CTR model (meta.enabled: false) reads rows without one")
        split = _split(config)
        if split.query_size or split.min_rows > 1:
            raise ConfigError(f"config key 'data.split' is not allowed: query_size "
                              f"{split.query_size} and min_rows {split.min_rows} with no "
                              f"data.mapping.task; expected query_size: 0 and min_rows: 1, as "
                              f"every row is its own task of one row (a plain CTR model's "
                              f"rows)")
    return mapping


def _mismatch(config: PipelineConfig, manifest: meta_io.Manifest, world_size: int) -> str | None:
    """Why the dataset at ``data.path`` does not fit the config (None when it does)."""
    d = config.data
    recorded = manifest.split
    if d.source == "synthetic":
        expected = synthetic.source_record(d.synthetic.tasks, d.synthetic.rows_per_task, d.seed)
        if recorded.get("source") != expected:
            return f"was generated with other parameters ({recorded.get('source')})"
    source = recorded.get("source") or {}
    if d.source == "csv":
        expected = csv_source_record([d.raw], csv_mapping(config))
        source = {**source, "mapping": recorded_mapping(source.get("mapping"))}
        for key in ("paths", "mapping", "inputs"):
            if source.get(key) != expected[key]:
                return f"was converted from other {key} ({source.get(key)})"
    if d.source == "criteo" and source.get("task_column", "C2") != d.task_column:
        return f"was converted with task column {source.get('task_column', 'C2')!r}"
    differences = _layout_differences(config, manifest)
    if differences:  # every one at once: a user fixes them in one round trip
        return "; and it ".join(_difference_text(*difference) for difference in differences)
    if (d.source != "dataset" and recorded.get("train_long_tasks")
            and recorded.get("max_rows") is not None
            and "long_tasks_moved_to_warm" not in recorded):
        return ("was split before long warm tasks drawn for validation were trained on "
                "(they were dropped)")
    few = _too_few_blocks(manifest, world_size)
    if few and d.rows_per_block is not None:  # made again, it would have as few
        raise ConfigError(f"config key 'data.rows_per_block' = {d.rows_per_block} is not "
                          f"allowed: the dataset {few}; expected fewer rows per block, or "
                          f"no data.rows_per_block (chosen from the rows and the ranks)")
    return few


def _layout_differences(config: PipelineConfig, manifest: meta_io.Manifest) -> list[tuple]:
    """(key, the dataset's value, the config's) for every split key and the block size the
    config asks for and the dataset was not made with. A config without ``data.split`` (a
    ``dataset`` source read as it was converted) asks for no split key."""
    d = config.data
    recorded = manifest.split
    wanted = dataclasses.asdict(d.split) if d.split is not None else {}
    differences = [(k, recorded.get(k), v) for k, v in wanted.items() if recorded.get(k) != v]
    option = recorded.get("output", {}).get("rows_per_block_option", d.rows_per_block)
    if d.rows_per_block is not None and option != d.rows_per_block:
        differences.append(("rows_per_block", option, d.rows_per_block))
    return differences


def _config_key(key: str) -> str:
    return "data.rows_per_block" if key == "rows_per_block" else f"data.split.{key}"


def _difference_text(key: str, have, want) -> str:
    if key == "rows_per_block":
        return (f"was written with rows_per_block {have or 'auto'}, the config asks for "
                f"data.rows_per_block = {want}")
    return f"was split with {key} = {have!r}, the config asks for data.split.{key} = {want!r}"


def _conversion_flags(differences: list[tuple]) -> str:
    """The ``gmeta data csv`` flags that would make a dataset with the config's values."""
    flags = []
    for key, _, want in differences:
        flag = "--" + key.replace("_", "-")
        if isinstance(want, bool):
            flags.append(flag if want else f"--no-{key.replace('_', '-')}")
        elif want is not None:
            flags.append(f"{flag} {want}")
    return " ".join(flags)


def _too_few_blocks(manifest: meta_io.Manifest, world_size: int) -> str | None:
    blocks = {split: c["blocks"] for split, c in manifest.per_split().items()}
    for split, n in sorted(blocks.items()):
        if n < world_size:
            return f"has {n} blocks in split {split!r}, fewer than the {world_size} ranks"
    return None


def prepare_dataset(config: PipelineConfig, overwrite: bool = False,
                    world_size: int = 1) -> meta_io.Manifest:
    """The config's dataset: loaded when present and fitting, otherwise made.

    Args:
        config: The pipeline config (its ``data`` section).
        overwrite: Make it again even when it exists and fits.
        world_size: Ranks that will read it: each split gets at least that many blocks.

    Returns:
        The dataset's manifest.

    Raises:
        ConfigError: ``data.source: dataset`` and no dataset at ``data.path``, or one that
            does not fit the config (naming the key).
        DataError: The raw input is bad (nothing is written then).
    """
    d = config.data
    if dataset_exists(d.path) and not overwrite:
        manifest = meta_io.Manifest.load(d.path)
        reason = _mismatch(config, manifest, world_size)
        if reason is None:
            # a missing or resized file (the cheap checks every read makes; gmeta data info
            # reads every byte) is said, with how to make it again, not remade unasked
            for entry in manifest.files:
                verify_file(d.path, entry, checksum=False)
            log.info("dataset %s exists: using it", d.path)
            return manifest
        if d.source == "dataset":
            differences = _layout_differences(config, manifest)
            flags = _conversion_flags(differences)
            keys = ", ".join(f"{_config_key(k)}: "
                             f"{'null' if k == 'rows_per_block' else override_value(h)}"
                             for k, h, _ in differences)
            remedy = (f"; either convert it again with what the config asks (gmeta data csv "
                      f"... --overwrite {flags}), or give the config what the dataset has "
                      f"({keys}; or leave out data.split and data.rows_per_block: a "
                      f"'dataset' source is then read as it was converted)"
                      if differences else
                      "; convert it again (gmeta data csv ... --overwrite) with what the "
                      "config asks, or change the config")
            raise ConfigError(f"config key 'data.path' = {d.path!r} is not allowed: the dataset "
                              f"there {reason}{remedy} (data.source 'dataset' is never "
                              f"rewritten)")
        log.warning("dataset %s %s: making it again from %s", d.path, reason, d.source)
    if d.source == "dataset":
        raise ConfigError(f"config key 'data.path' = {d.path!r} is not allowed: expected a "
                          f"dataset directory with {MANIFEST_NAME} (data.source is 'dataset'); "
                          f"make one with gmeta data csv, or set data.source: csv with "
                          f"data.raw and data.mapping")
    manifest = _make(config, world_size)
    few = _too_few_blocks(manifest, world_size)
    if few:  # blocks hold whole tasks: a split with fewer tasks than ranks cannot be shared
        raise ConfigError(f"config key 'data.split' is not allowed: the dataset made at "
                          f"{d.path} {few} (a block holds whole tasks, "
                          f"{_tasks_per_split(manifest)} tasks per split); expected splits "
                          f"with a task per rank at least: a larger valid_fraction or "
                          f"1 - warm_fraction, or fewer ranks")
    if not config.meta.enabled:
        _warn_lopsided_validation(manifest, _split(config))
    return manifest


def _warn_lopsided_validation(manifest: meta_io.Manifest, split: meta_io.SplitConfig) -> None:
    """For a plain CTR model, which validates on every row of its validation split: warns
    when that split's share of the rows trained on or validated is more than twice, or
    under half, ``valid_fraction``. The split draws tasks, and tasks of very unequal sizes
    (a site with half the impressions) make a split that neither trains nor validates like
    the data it was meant to. (A meta model's share is meant to differ: its scored tasks
    are cut at ``max_rows`` while long warm tasks train whole.)"""
    counts = manifest.per_split()
    held = counts.get("valid", {}).get("rows", 0)
    trained = counts.get("warm", {}).get("rows", 0)
    if not split.valid_fraction or held + trained == 0:
        return
    share = held / (held + trained)
    if split.valid_fraction / 2 <= share <= 2 * split.valid_fraction:
        return
    log.warning("the validation split holds %.0f%% of the warm rows (%d of %d) for "
                "data.split.valid_fraction %g of the tasks: the tasks are of very unequal "
                "sizes. A plain CTR model's rows need no task: leave data.mapping.task out "
                "(every row is then its own task) so that validation is a fraction of the "
                "rows", 100 * share, held, held + trained, split.valid_fraction)


def _tasks_per_split(manifest: meta_io.Manifest) -> dict[str, int]:
    return {split: c["tasks"] for split, c in manifest.per_split().items()}


def _make(config: PipelineConfig, world_size: int) -> meta_io.Manifest:
    d = config.data
    output = meta_io.OutputConfig(rows_per_block=d.rows_per_block, overwrite=True,
                                  bad_rows=d.bad_rows,
                                  min_blocks=max(DEFAULT_MIN_BLOCKS, world_size))
    split = _split(config)
    log.info("making dataset %s from %s", d.path, d.source)
    if d.source == "synthetic":
        return synthetic.generate(d.path, d.synthetic.tasks, d.synthetic.rows_per_task, d.seed,
                                  split=split, output=output)
    if d.source == "movielens":
        return meta_io.convert_movielens(d.raw, d.path, split=split, output=output)
    if d.source == "criteo":
        return meta_io.convert_criteo(d.raw, d.path, task_column=d.task_column, split=split,
                                      output=output)
    return meta_io.convert_csv(d.raw, d.path, csv_mapping(config), split=split, output=output)


def eval_name(item: str) -> str:
    """The name ``gmeta eval`` scores an eval data item under (its results file
    ``<run_dir>/eval/<name>.json``, its converted dataset ``<run_dir>/eval/data/<name>``):
    a dataset directory's name, a file's name without its extension."""
    if dataset_exists(item):
        return os.path.basename(os.path.normpath(item))
    return os.path.splitext(os.path.basename(item))[0]


def eval_dataset(config: PipelineConfig, item: str) -> tuple[str, str]:
    """A dataset to score with ``gmeta eval``: ``(name, dataset directory)``.

    ``item`` is a dataset directory (used as is) or a raw file of the pipeline's source
    format (``criteo``, ``movielens``, or a CSV read with the pipeline's mapping), converted
    once into ``<run_dir>/eval/data/<stem>``: every row kept (no validation or cold split),
    tasks split into support and query rows as the pipeline's protocol says for a meta
    model, all rows scored for a plain CTR model.
    """
    if dataset_exists(item):
        return eval_name(item), item
    if not os.path.isfile(item):
        raise ConfigError(f"eval data {item!r} is neither a dataset directory (with "
                          f"{MANIFEST_NAME}) nor a file")
    stem = eval_name(item)
    out = os.path.join(config.eval_dir, "data", stem)
    protocol = _split(config)
    if config.meta.enabled:
        # every task scored, so bounded by max_rows as the protocol's scored tasks are
        split = dataclasses.replace(protocol, warm_fraction=1.0, valid_fraction=0.0,
                                    train_long_tasks=False)
    else:
        split = meta_io.SplitConfig(seed=protocol.seed, warm_fraction=1.0, valid_fraction=0.0,
                                    query_size=0, min_rows=1)
    if dataset_exists(out):
        recorded = meta_io.Manifest.load(out).split
        paths = (recorded.get("source") or {}).get("paths")
        if (all(recorded.get(k) == v for k, v in dataclasses.asdict(split).items())
                and paths in ([item], [os.path.abspath(item)])
                and (config.data.source != "csv" or recorded["source"].get("inputs") ==
                     csv_source_record([item], csv_mapping(config))["inputs"])):
            return stem, out
    output = meta_io.OutputConfig(rows_per_block=config.data.rows_per_block, overwrite=True,
                                  bad_rows=config.data.bad_rows)
    source = config.data.source
    log.info("converting eval data %s -> %s", item, out)
    if source == "criteo":
        meta_io.convert_criteo(item, out, task_column=config.data.task_column, split=split,
                               output=output)
    elif source == "movielens":
        meta_io.convert_movielens(item, out, split=split, output=output)
    elif source == "csv":
        meta_io.convert_csv(item, out, csv_mapping(config), split=split, output=output)
    else:
        raise ConfigError(f"eval data {item!r}: a raw file needs data.source 'criteo', "
                          f"'movielens' or 'csv' to be converted (data.source is {source!r}); "
                          f"give a dataset directory instead")
    return stem, out


def prepare_on_chief(config: PipelineConfig) -> meta_io.Manifest:
    """Rank 0 makes (or checks) the dataset while the others wait; a failure there is
    raised on every rank, so no rank waits forever for a dataset that will not come."""
    from gmeta_tf import distributed
    from gmeta_tf.training.rank_agreement import on_all_ranks

    distributed.init()
    world = distributed.size()
    on_all_ranks(lambda: prepare_dataset(config, world_size=world) if distributed.is_chief()
                 else None, f"preparing the dataset {config.data.path}")
    return meta_io.Manifest.load(config.data.path)
