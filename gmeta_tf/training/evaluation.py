"""Cold-start evaluation of trained models: periodic (during training, on every rank) and
final (``gmeta eval``: every cold task, the meta model against the baseline).

Tasks of the evaluation split (``eval.split``, "cold" by default) were never trained on;
each is adapted on its support rows and scored on its query rows (see
``gmeta_tf.meta.evaluate_tasks``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

import numpy as np
import tensorflow as tf

from gmeta_tf import data as meta_io
from gmeta_tf import distributed
from gmeta_tf.config import PipelineConfig
from gmeta_tf.meta import EvaluationReport, MetaModel, evaluate_tasks, fine_tuned_predictions
from gmeta_tf.meta import metrics
from gmeta_tf.training.model_builder import Models

PredictFn = Callable[[Mapping], tf.Tensor]


def eval_batches(config: PipelineConfig, equal_steps: bool) -> tf.data.Dataset:
    """Task batches of the evaluation split, every support and query row of each task.

    With ``equal_steps`` (every rank runs the same number of batches) a split too small
    for one batch of ``eval.tasks_per_batch`` tasks on every rank is read in batches of
    as many tasks as the rank with the fewest has, so a small split is still scored.
    """
    dataset = meta_io.TaskDataset(config.data.path, config.eval.split,
                                  reader=config.data.reader, verify="size")
    per_batch = config.eval.tasks_per_batch
    if equal_steps:
        per_batch = max(1, min(per_batch, dataset.fewest_tasks_per_rank))
    return dataset.tasks(per_batch, None, None, equal_steps=equal_steps)


def adapted_predict(model: tf.keras.Model, steps: int | None,
                    fine_tune_lr: float) -> PredictFn:
    """Predictions after adapting on each task's support set.

    A ``MetaModel`` adapts with its own inner loop (``steps`` overrides k, 0 = none); a
    ``CTRModel`` is fine-tuned with ``steps`` SGD steps at ``fine_tune_lr`` (0 = none).
    """
    if isinstance(model, MetaModel):
        return tf.function(lambda batch: model.adapted_predictions(batch, steps),
                           reduce_retracing=True)
    return fine_tuned_predictions(model, steps or 0, fine_tune_lr)


def _main_predict(models: Models, config: PipelineConfig) -> PredictFn:
    return adapted_predict(models.model, config.eval.adapt_steps, config.eval.baseline_lr)


# ---- periodic evaluation, on every rank --------------------------------------------------

def _query_rows(batch: Mapping, predictions: np.ndarray, label: str) -> tuple[np.ndarray, ...]:
    real = np.asarray(batch["query"]["mask"]) > 0
    return predictions[real], np.asarray(batch["query"][label])[real]


def periodic_metrics(models: Models, config: PipelineConfig) -> dict[str, float]:
    """Pooled metrics of the main model on ``train.eval_batches`` evaluation batches.

    Every rank scores its share of the tasks (all ranks run the same number of batches, as
    the embedding's all-to-alls need); the rows are then gathered so every rank returns
    the same figures: ``auc`` (of the binary label), ``logloss`` or ``mae`` (of the head's
    label) and ``rows``.
    """
    predict = _main_predict(models, config)
    head = models.model.head
    binary = config.eval.binary_label or head.label
    preds, labels, binaries = [], [], []
    for batch in eval_batches(config, equal_steps=True).take(config.train.eval_batches):
        p = np.asarray(predict(batch))
        pred, label = _query_rows(batch, p, head.label)
        preds.append(pred)
        labels.append(label)
        binaries.append(_query_rows(batch, p, binary)[1])
    pred, label, binary_label = (
        distributed.allgather(np.concatenate(x).astype(np.float64) if x else np.zeros(0))
        for x in (preds, labels, binaries))
    if not len(pred):
        return {}
    out = {"auc": metrics.auc(binary_label, pred), "rows": float(len(pred))}
    if head.kind == "binary":
        out["logloss"] = metrics.log_loss(label, pred)
    else:
        out["mae"] = metrics.mae(label, pred)
    return out


# ---- final evaluation --------------------------------------------------------------------

@dataclasses.dataclass
class ComparedRow:
    """One line of the cold-start comparison."""

    name: str
    report: EvaluationReport


def cold_start_comparison(models: Models, config: PipelineConfig) -> list[ComparedRow]:
    """Every task of the evaluation split, scored by the main model and its baselines.

    Rows: the main model adapted on each task's support set and without adaptation; with
    a baseline (a meta model trained beside a plain CTR model), the baseline fine-tuned on
    the support set (``eval.baseline_steps`` SGD steps at ``eval.baseline_lr``) and as is.
    """
    e = config.eval

    def report(predict: PredictFn) -> EvaluationReport:
        return evaluate_tasks(predict, eval_batches(config, equal_steps=False),
                              models.model.head, e.ndcg_k, e.binary_label, e.relevance_label)

    rows = []
    if models.is_meta:
        k = config.meta.inner_steps if e.adapt_steps is None else e.adapt_steps
        rows.append(ComparedRow(f"meta ({config.meta.algorithm}, adapted k={k})",
                                report(_main_predict(models, config))))
        rows.append(ComparedRow("meta, no adaptation",
                                report(adapted_predict(models.model, 0, e.baseline_lr))))
    else:
        rows.append(ComparedRow("ctr model", report(adapted_predict(models.model, 0, 1.0))))
    if models.baseline is not None:
        rows.append(ComparedRow(f"baseline fine-tuned ({e.baseline_steps} steps)",
                                report(adapted_predict(models.baseline, e.baseline_steps,
                                                       e.baseline_lr))))
        rows.append(ComparedRow("baseline, no fine-tuning",
                                report(adapted_predict(models.baseline, 0, e.baseline_lr))))
    return rows


def comparison_dict(rows: list[ComparedRow]) -> list[dict]:
    """The comparison as JSON-ready dicts (``eval.json``)."""
    return [{"name": r.name, **{k: _json_number(v) for k, v in r.report.overall.items()}}
            for r in rows]


def _json_number(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain-text table: one line per dict, the given columns (missing -> '-')."""
    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4f}"
        return str(value)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)

