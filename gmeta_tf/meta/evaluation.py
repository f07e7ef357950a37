"""Cold-start evaluation: adapt on each new task's support set, score its query set.

Metrics per task and overall: AUC (per task, and over all query rows pooled), log loss
(binary head), MAE (rating head), nDCG@k (per task, averaged).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Mapping

import numpy as np
import tensorflow as tf

from gmeta_tf import interrupts
from gmeta_tf.graph_function import graph_function
from gmeta_tf.meta import metrics
from gmeta_tf.meta.task_adapter import (AdaptedQuery, TaskAdapter, adapted_query, fold_in_outputs,
                                        initial_ridge, resolve_fast_weights)
from gmeta_tf.meta.task_batch import ROLES, RoleBatch
from gmeta_tf.models.ctr_model import CTRModel
from gmeta_tf.models.heads import Head
from gmeta_tf.models.tower import Tower

PredictFn = Callable[[Mapping], tf.Tensor]


def _any_shape(spec: tf.TypeSpec) -> tf.TypeSpec:
    """The spec with every dimension unknown (its rank and dtype kept)."""
    if isinstance(spec, tf.RaggedTensorSpec):
        return tf.RaggedTensorSpec([None] * spec.shape.rank, spec.dtype, spec.ragged_rank,
                                   spec.row_splits_dtype)
    if isinstance(spec, tf.TensorSpec):
        return tf.TensorSpec([None] * spec.shape.rank, spec.dtype)
    return spec


def traced_once(fn: Callable[[Mapping], tf.Tensor]) -> PredictFn:
    """``fn`` as a ``tf.function`` traced once, at its first batch, for batches of any size.

    Evaluation batches differ in their number of tasks and in their support and query
    widths (each is padded to its own longest task), so a function traced for each shape
    it meets would trace again and again; this one's input signature is the first batch's
    structure and dtypes with every dimension unknown.
    """
    traced = []

    def call(batch: Mapping) -> tf.Tensor:
        if not traced:
            signature = tf.nest.map_structure(
                lambda v: _any_shape(tf.type_spec_from_value(v)), batch)
            traced.append(graph_function(fn, input_signature=[signature]))
        return traced[0](batch)

    return call


@dataclasses.dataclass
class EvaluationReport:
    """Metrics of a set of tasks.

    Attributes:
        overall: Metric name -> value: ``auc`` (pooled query rows), ``task_auc`` (mean of
            per-task AUCs, tasks with one class left out), ``logloss`` / ``mae`` (pooled,
            by head kind), ``ndcg@k`` (mean over tasks), ``tasks``, ``rows``.
        per_task: Metric name -> ``[num_tasks]`` array (NaN where undefined), plus
            ``task_id``.
    """

    overall: dict
    per_task: dict


@dataclasses.dataclass
class _Collected:
    task_ids: list
    predictions: list
    labels: list
    binary: list
    relevance: list


def _collect(predict: PredictFn, batches: Iterable[Mapping], head: Head, binary_label: str | None,
             relevance_label: str | None) -> _Collected:
    out = _Collected([], [], [], [], [])
    with interrupts.deferred():  # Ctrl-C and SIGTERM stop it between batches
        for batch in interrupts.checked(batches):
            pred = np.asarray(predict(batch))
            query = {k: np.asarray(v) for k, v in batch["query"].items()}
            ids = np.asarray(batch["task_id"]) if "task_id" in batch else np.arange(len(pred))
            for t in range(len(pred)):
                real = query["mask"][t] > 0
                out.task_ids.append(int(ids[t]))
                out.predictions.append(pred[t][real])
                out.labels.append(query[head.label][t][real])
                out.binary.append(query[binary_label or head.label][t][real])
                out.relevance.append(query[relevance_label or head.label][t][real])
    return out


def evaluate_tasks(predict: PredictFn, batches: Iterable[Mapping], head: Head, k: int = 3,
                   binary_label: str | None = None,
                   relevance_label: str | None = None) -> EvaluationReport:
    """Scores every task's query rows with ``predict`` and computes the metrics.

    Args:
        predict: Task batch -> predictions ``[T, Q]`` (e.g. ``MetaModel.adapted_predictions``).
        batches: Task batches (Meta-IO layout) of the tasks to evaluate.
        head: The model's head (its label and kind).
        k: The k of nDCG@k.
        binary_label: The 0/1 label for AUC (default the head's label; for a rating head
            give e.g. "label" = rating >= 4).
        relevance_label: The graded relevance for nDCG (default the head's label).

    Returns:
        The report.
    """
    c = _collect(predict, batches, head, binary_label, relevance_label)
    if not c.task_ids:
        raise ValueError("evaluate_tasks: the batches hold no task")
    sizes = [len(p) for p in c.predictions]
    return report_from_rows(np.repeat(np.array(c.task_ids, np.int64), sizes),
                            np.concatenate(c.predictions), np.concatenate(c.labels),
                            np.concatenate(c.binary), np.concatenate(c.relevance), head.kind, k)


def report_from_rows(task_ids: np.ndarray, predictions: np.ndarray, labels: np.ndarray,
                     binary: np.ndarray, relevance: np.ndarray, kind: str,
                     k: int = 3, per_task: bool = True) -> EvaluationReport:
    """The metrics of scored rows, each row tagged with its task (rows of a task need not
    be adjacent; tasks are reported in order of first appearance).

    Args:
        task_ids, predictions, labels, binary, relevance: ``[n]`` per scored row: its task,
            the prediction, the head's label, the 0/1 label of AUC, the relevance of nDCG.
        kind: The head's kind, "binary" (log loss) or "rating" (MAE).
        k: The k of nDCG@k.
        per_task: Also the per-task metrics (task_auc, nDCG@k); off for row data, whose
            "tasks" are single rows.
    """
    task_ids = np.asarray(task_ids, np.int64)
    if not len(task_ids):
        raise ValueError("report_from_rows: no scored row")
    _, first, inverse = np.unique(task_ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")            # tasks in order of appearance
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    group = position[inverse.ravel()]
    rows_of = np.split(np.argsort(group, kind="stable"), np.cumsum(np.bincount(group))[:-1])
    pred = np.asarray(predictions, np.float64)
    if not per_task:
        overall = {"auc": metrics.auc(binary, pred), "rows": int(len(pred))}
        if kind == "binary":
            overall["logloss"] = metrics.log_loss(labels, pred)
        else:
            overall["mae"] = metrics.mae(labels, pred)
        return EvaluationReport(overall, {})
    per_task = {
        "task_id": task_ids[first[order]],
        "auc": np.array([metrics.auc(binary[r], pred[r]) for r in rows_of]),
        f"ndcg@{k}": np.array([metrics.ndcg_at_k(relevance[r], pred[r], k) for r in rows_of]),
    }
    overall = {
        "auc": metrics.auc(binary, pred),
        "task_auc": float(np.nanmean(per_task["auc"])) if np.isfinite(per_task["auc"]).any()
        else float("nan"),
        f"ndcg@{k}": float(np.nanmean(per_task[f"ndcg@{k}"]))
        if np.isfinite(per_task[f"ndcg@{k}"]).any() else float("nan"),
        "tasks": len(rows_of), "rows": int(len(pred)),
    }
    if kind == "binary":
        per_task["logloss"] = np.array([metrics.log_loss(labels[r], pred[r]) for r in rows_of])
        overall["logloss"] = metrics.log_loss(labels, pred)
    else:
        per_task["mae"] = np.array([metrics.mae(labels[r], pred[r]) for r in rows_of])
        overall["mae"] = metrics.mae(labels, pred)
    return EvaluationReport(overall, per_task)


def query_predictions(head: Head, query: AdaptedQuery) -> dict[str, tf.Tensor]:
    """An ``AdaptedQuery`` as predictions ``[T, Q]``: ``blended``, ``unblended``, and
    ``kept``, 1 on every query row of a task whose adaptation was kept, 0 where it was
    undone."""
    kept = tf.broadcast_to(tf.cast(query.kept, tf.float32)[:, None], tf.shape(query.blended))
    return {"blended": head.predict(query.blended), "unblended": head.predict(query.unblended),
            "kept": kept}


def fine_tuned_adaptation(model: CTRModel, steps: int, learning_rate: float,
                          fast_weights: tuple[str, ...] = (),
                          adapted_embeddings: tuple[str, ...] = (),
                          ridge: float = 0.0, backtrack: bool = False
                          ) -> Callable[[Mapping], dict[str, tf.Tensor]]:
    """The non-meta baseline fine-tuned on each task's support set, as every figure of it
    one pass gives (``query_predictions``: blended with the label prior's fold-in and not,
    and which tasks' fine-tuning was kept).

    ``steps`` SGD steps at ``learning_rate`` on the support rows of each task (all tasks
    batched, as the meta model's inner loop) adapt the tower weights ``fast_weights``
    (default all) and the task's own embedding rows of ``adapted_embeddings`` (as
    ``MetaConfig.adapt_embeddings``), then, with ``ridge`` > 0, the output layer is solved
    in closed form at that strength (``TaskAdapter.solve_output_layer``; the weights on a
    label prior's factors and the bias at its fold-in strength, ``initial_ridge``); the
    query rows are scored, blended with the label prior's fold-in at the tower's
    ``prior_blend`` as the meta model's are. ``steps=0`` scores without fine-tuning. The
    model itself is not changed; a task whose fine-tuning diverged is undone
    (``task_adapter.adapted_query``). ``backtrack``: a step that raises a task's support
    loss is taken back and its later steps halved (``TaskAdapter``).
    """
    strengths = initial_ridge(model.tower, ridge) if ridge else None
    adapter = TaskAdapter(model.tower, model.head,
                          resolve_fast_weights(model.tower, fast_weights), adapted_embeddings,
                          steps, strengths, backtrack)
    rates = {n: tf.constant(float(learning_rate)) for n in adapter.fast_names}

    def predict(batch):
        return query_predictions(model.head, adapted_query(model.embedding, adapter, batch,
                                                           rates))

    return traced_once(predict)


def fine_tuned_predictions(model: CTRModel, steps: int, learning_rate: float,
                           fast_weights: tuple[str, ...] = (),
                           adapted_embeddings: tuple[str, ...] = (),
                           ridge: float = 0.0, blended: bool = True) -> PredictFn:
    """The non-meta baseline's predict function (``fine_tuned_adaptation``): predictions
    ``[T, Q]`` blended with the label prior's fold-in (``blended``) or not."""
    return prediction_of(fine_tuned_adaptation(model, steps, learning_rate, fast_weights,
                                               adapted_embeddings, ridge), blended)


def prediction_of(adaptation: Callable[[Mapping], Mapping[str, tf.Tensor]],
                  blended: bool) -> PredictFn:
    """One output of an adaptation's (``query_predictions``): its predictions blended with
    the label prior's fold-in, or (``blended=False``) not."""
    name = "blended" if blended else "unblended"
    return lambda batch: adaptation(batch)[name]


def fold_in_predictions(tower: Tower, head: Head) -> PredictFn:
    """The label prior's factorisation alone, each task folded in on its support rows
    (``task_adapter.fold_in_outputs``): what an adapted tower's predictions are blended
    with. Reads the batch's prior feature and labels only (no embedding)."""
    def predict(batch):
        support, query = (RoleBatch(tower.raw_inputs(batch[r]),
                                    tf.cast(batch[r][head.label], tf.float32),
                                    tf.cast(batch[r]["mask"], tf.float32), {}) for r in ROLES)
        return head.predict(fold_in_outputs(tower, head, support, query))

    return traced_once(predict)
