"""``gmeta eval``: restore a run's chosen checkpoints and compare models on held-out data.

Runs as one process: restoring reads every rank's table shards (``gmeta_tf.checkpoint``
reshards on load), so the whole model is in this process. By default each model is
restored from its best checkpoint on the validation split (``BEST.json``, written by
``gmeta train``), the meta model and the baseline each from its own; without a
``BEST.json`` (no validation during training) from the newest good checkpoint.

What is scored: the evaluation split (``eval.split``, the cold tasks) and every dataset or
raw file of ``eval.data`` (or ``gmeta eval --data PATH``); each result goes to its own file
``<run_dir>/eval/<name>.json`` (name: the split, or the file's stem), never overwriting
another's.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from gmeta_tf import checkpoint, distributed
from gmeta_tf import data as meta_io
from gmeta_tf.atomic_file import write_text_atomically
from gmeta_tf.config import ConfigError, PipelineConfig
from gmeta_tf.data.split import SPLITS
from gmeta_tf.machine import machine
from gmeta_tf.run_dir_lock import writable_dir
from gmeta_tf.training.config_check import check_against_dataset, check_data_files
from gmeta_tf.training.evaluation import (by_support_size, comparison, comparison_dict,
                                         format_by_support_size, format_gaps, format_table,
                                         format_undone,
                                         paired_against_first)
from gmeta_tf.training.model_builder import Models, build_models, set_configured_blend
from gmeta_tf.training.selection import BEST_FILE, best_checkpoints

log = logging.getLogger(__name__)
TABLE_COLUMNS = ["name", "auc", "task_auc", "ndcg@3", "logloss", "mae", "tasks", "rows"]


def _query_rows_in_support(dataset: str, split: str | None, name: str) -> int | None:
    """How many query rows of the scored set repeat a support row of their task in every
    stored column, as the conversion counted them (warned of: the adapted models and item
    mean + offset are given those answers); None for a dataset converted before it was
    counted."""
    record = meta_io.Manifest.load(dataset).split
    keys = [f"{s}_query_rows_in_support" for s in ([split] if split else SPLITS)]
    if not any(k in record for k in keys):
        return None
    copied = sum(int(record.get(k, 0)) for k in keys)
    reason = record.get("repeats_are_events")  # a source whose repeats are events
    if copied and reason:
        log.info("%s: %d query rows repeat a support row of their task in every column: %s",
                 name, copied, reason)
    elif copied:
        log.warning("%s: %d query rows repeat a support row of their task in every column "
                    "(the same item and label): the adapted models and item mean + offset "
                    "are scored on answers they were shown (the manifest of %s counts them)",
                    name, copied, dataset)
    return copied


def _restore(config: PipelineConfig, directory: Path) -> tuple[Models, dict]:
    models = build_models(config)
    manifest = checkpoint.restore(directory, models.state, models.optimizers)
    return models, manifest


def restore_models(config: PipelineConfig, path: str | None = None) -> tuple[Models, dict]:
    """The run's models as of their chosen checkpoints, in this one process.

    Args:
        config: The pipeline config.
        path: A checkpoint directory to restore every model from; default each model's
            best checkpoint on validation, else the newest good checkpoint (damaged or
            unfinished newer ones are skipped with a warning naming them and why).

    Returns:
        ``(models, info)``; ``info`` has ``step``, ``world_size``, ``directory`` and, when
        chosen on validation, ``chosen``: per model its step and validation metric.
    """
    if distributed.size() != 1:
        raise ConfigError("gmeta eval/export run as one process (not under horovodrun): they "
                          "restore every rank's table shards into this process")
    try:
        if path:
            models, manifest = _restore(config, Path(path))
            info = {**manifest, "directory": str(path)}
        else:
            models, info = _restore_chosen(config)
    except checkpoint.CheckpointError as err:
        otherwise = trained_otherwise(config)
        if not otherwise:
            raise
        raise checkpoint.CheckpointError(f"{err}; {otherwise}") from err
    otherwise = trained_otherwise(config)
    if otherwise:
        log.warning("%s", otherwise[0].upper() + otherwise[1:])
    set_configured_blend(models, config)  # over the checkpoint's
    log.info("restored %s (step %d, saved by %d ranks)", info["directory"], info["step"],
             info["world_size"])
    return models, info


#: The sections of a config whose keys shape a model's weights.
MODEL_SECTIONS = ("model", "meta")


def trained_otherwise(config: PipelineConfig, shown: int = 4) -> str:
    """The keys of ``MODEL_SECTIONS`` whose value differs from the run's training config
    (``<run_dir>/config.yaml``, which ``gmeta train`` writes), said as a hint, or ''."""
    import yaml

    from gmeta_tf.config import ABSENT, dotted_keys, dotted_value

    written = Path(config.run_dir, "config.yaml")
    try:
        trained = yaml.safe_load(written.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return ""
    now = config.to_dict()
    differ = []
    for section in MODEL_SECTIONS:
        for key in dotted_keys({section: now.get(section) or {}}, leaves=True):
            before = dotted_value(trained, key)
            if before is not ABSENT and before != dotted_value(now, key):
                differ.append(f"{key} = {dotted_value(now, key)!r} (trained with {before!r})")
    if not differ:
        return ""
    more = f" and {len(differ) - shown} more" if len(differ) > shown else ""
    return (f"the run was trained under other settings ({written}): {'; '.join(differ[:shown])}"
            f"{more}; a tuned.yaml written since the training? gmeta train --fresh trains "
            f"under the settings now in force, or set these keys back")


def _restore_chosen(config: PipelineConfig) -> tuple[Models, dict]:
    root = Path(config.checkpoint_dir)
    best = best_checkpoints(root)
    complete = {d.name for d in checkpoint.complete_checkpoints(root)}
    chosen = {name: b for name, b in best.items()
              if name != "metric" and f"ckpt-{b['step']}" in complete}
    for name, b in best.items():
        if name != "metric" and name not in chosen:
            log.warning("%s names step %d as the %s's best checkpoint on validation, but "
                        "%s is missing or incomplete: the %s is restored otherwise (below)",
                        root / BEST_FILE, b["step"], name, root / f"ckpt-{b['step']}", name)
    if "model" in chosen:
        step = chosen["model"]["step"]
        models, manifest = _restore(config, root / f"ckpt-{step}")
        log.info("the model's best checkpoint on validation: step %d (%s %.4f)", step,
                 best["metric"], chosen["model"]["value"])
        info = {**manifest, "directory": str(root / f"ckpt-{step}")}
    else:
        models = build_models(config)
        restored = checkpoint.restore_latest_good(root, models.state, models.optimizers,
                                                  agree=False)
        if restored is None:
            aside = sorted(root.parent.glob(f"{root.name}.replaced-*"))
            if aside:  # a --fresh run stopped before its first checkpoint
                raise ConfigError(
                    f"config key 'run_dir' = {config.run_dir!r}: no checkpoint under "
                    f"{root}, but the earlier run's are kept in {aside[-1]}: a 'gmeta "
                    f"train --fresh' set them aside and stopped before its first "
                    f"checkpoint. 'gmeta train --resume' puts them back and goes on from "
                    f"them; 'gmeta train --fresh' trains anew")
            raise ConfigError(f"config key 'run_dir' = {config.run_dir!r}: no checkpoint "
                              f"under {root}; run 'gmeta train' first")
        info = {"step": restored.step, "world_size": restored.world_size,
                "directory": str(restored.directory)}
        if chosen:
            # The model was never validated (its loss was not finite before its first
            # validation) while the baseline trained on: the baseline still gets its best.
            log.warning("the model has no checkpoint chosen on validation: it is restored "
                        "from the newest one, step %d", restored.step)
    other = chosen.get("baseline")
    if models.baseline is not None and other and other["step"] != info["step"]:
        log.info("the baseline's best checkpoint on validation: step %d (%s %.4f)",
                 other["step"], best["metric"], other["value"])
        models.baseline = _restore(config, root / f"ckpt-{other['step']}")[0].baseline
    if chosen:
        info["chosen"] = {n: {"step": b["step"], best["metric"]: b["value"]}
                          for n, b in chosen.items()}
    return models, info


def _check_unique_names(splits: list[str], items: list[str]) -> None:
    """Each target of one ``gmeta eval`` writes ``eval/<name>.json`` (and an item converted
    from a file, ``eval/data/<name>``): two of one name would overwrite each other."""
    from gmeta_tf.training.dataset_prep import eval_name

    seen = {s: f"the {s!r} split" for s in splits}
    for item in items:
        name = eval_name(item)
        if name in seen:
            raise ConfigError(f"eval data {item!r} would be scored as {name!r}, as "
                              f"{seen[name]} is: their results (eval/{name}.json) would "
                              f"overwrite each other; expected eval data of distinct names "
                              f"(rename or copy one)")
        seen[name] = f"eval data {item!r}"


def _warn_if_replacing_another(file: Path, source: str) -> None:
    """Warns when ``file`` holds the scores of another source of the same name (a file of
    that name in another folder): they are replaced."""
    try:
        before = json.loads(file.read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return
    if before is not None and before != source:
        log.warning("%s held the scores of %s; it is replaced by those of %s (another "
                    "name keeps both: copy or rename the file)", file, before, source)


def evaluate_pipeline(config: PipelineConfig, path: str | None = None,
                      data: list[str] | None = None, validation: bool = False,
                      validation_only: bool = False) -> list[dict]:
    """Scores the run on its evaluation split and data files; writes one JSON each.

    Args:
        config: The pipeline config.
        path: A checkpoint directory (default: each model's chosen one).
        data: Datasets or raw files to score (default ``eval.data``); the evaluation split
            is scored too when ``eval.split`` is set.
        validation: Score the validation split (``train.validation_split``) first, the
            same way: which model to ship, chosen before the cold split is looked at. Its
            figures are optimistic for every contender (checkpoints, tuned settings and
            the references' settings were chosen on it).
        validation_only: Score the validation split alone (neither the evaluation split
            nor any data): what a choice made while experimenting may look at.

    Returns:
        Per scored set: ``{"name", "step", "checkpoint", "rows": [per-model metrics],
        "table": printable text, "file": where it was written}``.
    """
    from gmeta_tf.training.dataset_prep import eval_dataset
    from gmeta_tf.training.evaluation import fit_reference_predictors

    if validation_only and data:
        raise ConfigError(f"--data {data} is not allowed with --validation-only: expected "
                          f"the validation split alone to be scored")
    validation = validation or validation_only
    out_dir = writable_dir(config.eval_dir, "config key 'run_dir'",
                           "gmeta eval writes its results there", "--set run_dir=...")
    # Every key naming a split or a label is checked against every set to score before
    # the models are restored and anything is scored.
    check_against_dataset(config, meta_io.Manifest.load(config.data.path), training=False,
                          eval_split=bool(config.eval.split) and not validation_only,
                          validation=validation)
    # (name, split, dataset, role) of every set to score
    targets: list[tuple[str, str | None, str | None, str]] = []
    if validation:
        split = config.train.validation_split
        targets.append((split, split, None, "validation"))
    if config.eval.split and not validation_only:
        targets.append((config.eval.split, config.eval.split, None, "evaluation"))
    items = [] if validation_only else data if data is not None else config.eval.data
    _check_unique_names([t[0] for t in targets], items)
    sources = {name: f"split {split} of {config.data.path}" for name, split, _, _ in targets}
    for item in items:
        name, dataset = eval_dataset(config, item)
        sources[name] = os.path.abspath(item)
        check_against_dataset(config, meta_io.Manifest.load(dataset), training=False,
                              eval_split=False)
        targets.append((name, None, dataset, "data"))
    if not targets:
        raise ConfigError("config key 'eval.split' = None is not allowed with no eval.data: "
                          "expected something to score (a split, or data files)")
    # the files read: the training split (the references) and every set to score
    check_data_files(config, config.data.path,
                     ["warm", config.train.validation_split,
                      *(split for _, split, dataset, _ in targets if dataset is None)])
    for _, _, dataset, _ in targets:
        if dataset is not None:
            check_data_files(config, dataset, [None])
    models, info = restore_models(config, path)
    out_dir.mkdir(parents=True, exist_ok=True)
    references = fit_reference_predictors(models, config)
    results, host = [], machine()  # one record for every target of this process
    for name, split, dataset, role in targets:
        compared = comparison(models, config, split=split, path=dataset,
                              references=references)
        rows = comparison_dict(compared)
        kind, k = models.model.head.kind, config.eval.ndcg_k
        paired = paired_against_first(compared, kind, k, per_task=models.is_meta)
        bands = by_support_size(compared, kind, k) if models.is_meta else []
        k_column = f"ndcg@{k}"
        columns = [c if c != "ndcg@3" else k_column for c in TABLE_COLUMNS]
        columns = [c for c in columns if any(r.get(c) is not None for r in rows)]
        copied = _query_rows_in_support(dataset or config.data.path, split, name)
        result = {"name": name, "role": role, "step": info["step"],
                  "checkpoint": info["directory"], "chosen": info.get("chosen"),
                  "split": split, "data": dataset, "source": sources[name], "rows": rows,
                  "references": references.chosen, "paired": paired,
                  "by_support_size": bands, "query_rows_in_support": copied,
                  "machine": host}
        file = out_dir / f"{name}.json"
        _warn_if_replacing_another(file, sources[name])
        write_text_atomically(file, json.dumps(result, indent=1))
        result["table"] = "\n\n".join(t for t in (
            format_table(rows, columns), format_undone(rows),
            format_gaps(compared[0].name, paired, columns),
            format_by_support_size(bands, columns)) if t)
        result["file"] = str(file)
        results.append(result)
    return results
