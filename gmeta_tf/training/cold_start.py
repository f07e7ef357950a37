"""``gmeta eval``: restore a run's checkpoint and compare models on cold-start tasks.

Runs as one process: restoring reads every rank's table shards (``gmeta_tf.checkpoint``
reshards on load), so the whole model is in this process.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from gmeta_tf import checkpoint, distributed
from gmeta_tf.config import ConfigError, PipelineConfig
from gmeta_tf.training.evaluation import cold_start_comparison, comparison_dict, format_table
from gmeta_tf.training.model_builder import Models, build_models

log = logging.getLogger(__name__)
EVAL_FILE = "eval.json"
TABLE_COLUMNS = ["name", "auc", "task_auc", "ndcg@3", "logloss", "mae", "tasks", "rows"]


def find_checkpoint(config: PipelineConfig, path: str | None = None) -> Path:
    """The given checkpoint directory, or the latest complete one of the run."""
    if path:
        return Path(path)
    latest = checkpoint.latest(config.checkpoint_dir)
    if latest is None:
        raise ConfigError(f"config key 'run_dir' = {config.run_dir!r}: no complete checkpoint "
                          f"under {config.checkpoint_dir}; run 'gmeta train' first")
    return latest


def restore_models(config: PipelineConfig, path: str | None = None) -> tuple[Models, dict]:
    """The run's models as of a checkpoint, in this one process.

    Returns:
        ``(models, manifest)``; the baseline is restored when the checkpoint has it.
    """
    if distributed.size() != 1:
        raise ConfigError("gmeta eval/export run as one process (not under horovodrun): they "
                          "restore every rank's table shards into this process")
    directory = find_checkpoint(config, path)
    models = build_models(config)
    manifest = checkpoint.restore(directory, models.state, models.optimizers)
    log.info("restored %s (step %d, saved by %d ranks)", directory, manifest["step"],
             manifest["world_size"])
    return models, manifest


def evaluate_pipeline(config: PipelineConfig, path: str | None = None) -> dict:
    """Evaluates a run on its cold-start tasks and writes ``<run_dir>/eval.json``.

    Returns:
        ``{"step", "checkpoint", "rows": [per-model metrics], "table": printable text}``.
    """
    models, manifest = restore_models(config, path)
    rows = comparison_dict(cold_start_comparison(models, config))
    k_column = f"ndcg@{config.eval.ndcg_k}"
    columns = [c if c != "ndcg@3" else k_column for c in TABLE_COLUMNS]
    columns = [c for c in columns if any(r.get(c) is not None for r in rows)]
    result = {"step": manifest["step"], "checkpoint": str(find_checkpoint(config, path)),
              "split": config.eval.split, "rows": rows}
    os.makedirs(config.run_dir, exist_ok=True)
    Path(config.run_dir, EVAL_FILE).write_text(json.dumps(result, indent=1))
    result["table"] = format_table(rows, columns)
    return result
