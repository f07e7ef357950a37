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


def restore_models(config: PipelineConfig, path: str | None = None) -> tuple[Models, dict]:
    """The run's models as of a checkpoint, in this one process.

    Without ``path`` the newest good checkpoint of the run is used: damaged or unfinished
    newer ones are skipped with a warning naming them and why.

    Returns:
        ``(models, manifest)``; the baseline is restored when the checkpoint has it. The
        manifest carries the restored directory under ``"directory"``.
    """
    if distributed.size() != 1:
        raise ConfigError("gmeta eval/export run as one process (not under horovodrun): they "
                          "restore every rank's table shards into this process")
    models = build_models(config)
    if path:
        directory = Path(path)
        manifest = checkpoint.restore(directory, models.state, models.optimizers)
    else:
        restored = checkpoint.restore_latest_good(config.checkpoint_dir, models.state,
                                                  models.optimizers, agree=False)
        if restored is None:
            raise ConfigError(f"config key 'run_dir' = {config.run_dir!r}: no checkpoint under "
                              f"{config.checkpoint_dir}; run 'gmeta train' first")
        directory = restored.directory
        manifest = {"step": restored.step, "world_size": restored.world_size}
    log.info("restored %s (step %d, saved by %d ranks)", directory, manifest["step"],
             manifest["world_size"])
    return models, {**manifest, "directory": str(directory)}


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
    result = {"step": manifest["step"], "checkpoint": manifest["directory"],
              "split": config.eval.split, "rows": rows}
    os.makedirs(config.run_dir, exist_ok=True)
    Path(config.run_dir, EVAL_FILE).write_text(json.dumps(result, indent=1))
    result["table"] = format_table(rows, columns)
    return result
