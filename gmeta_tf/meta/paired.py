"""Paired bootstrap of the gap between two predictors scored on the same rows.

A table of cold-start metrics says which model scored higher on *these* users; whether the
gap would hold on other users of the same kind is a different question. ``paired_gaps``
answers it the standard way for paired data: it resamples the evaluation units (tasks,
e.g. users, with all their rows; or single rows for row data) with replacement, scores
both predictors on every resample with the same weights, and reports the gap's percentile
interval and how often each side was ahead. The unit is the task because rows of one user
are not independent: resampling rows would understate the spread.

Every metric is computed as ``gmeta_tf.meta.evaluation.report_from_rows`` computes it
(AUC over the pooled rows with ties counted half, MAE / log loss over the pooled rows,
nDCG@k as the mean over tasks of each task's value), with each row weighted by how many
times its unit was drawn, so the gap at weight 1 everywhere is exactly the difference of
the two reports.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gmeta_tf.meta import metrics

#: Metrics where lower is better; the others are higher-is-better.
LOWER_IS_BETTER = ("mae", "logloss")
#: A resample's gap at most this large is a tie (counted half to each side): below the four
#: decimals reported, as two predictors that differ by float rounding alone differ.
TIE = 1e-6
#: At most this many weights are held at once (resamples x units), bounding memory.
_CHUNK_ELEMENTS = 4_000_000


class _PooledAUC:
    """Weighted pooled AUC of one predictor, its rows sorted once."""

    def __init__(self, binary: np.ndarray, scores: np.ndarray):
        self.order = np.argsort(scores, kind="mergesort")
        ranked = scores[self.order]
        self.starts = np.concatenate([[0], np.flatnonzero(np.diff(ranked)) + 1])
        self.positive = (binary[self.order] > 0.5).astype(np.float64)

    def __call__(self, row_weights: np.ndarray) -> np.ndarray:
        """``[B]`` AUCs for ``[B, n]`` row weights (NaN where a class has no weight)."""
        w = row_weights[:, self.order]
        pos = np.add.reduceat(w * self.positive, self.starts, axis=1)
        neg = np.add.reduceat(w * (1.0 - self.positive), self.starts, axis=1)
        below = np.cumsum(neg, axis=1) - neg
        pairs = pos.sum(axis=1) * neg.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(pairs > 0, (pos * (below + 0.5 * neg)).sum(axis=1) / pairs, np.nan)


def _row_losses(kind: str, labels: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """Each row's loss, whose mean is the report's: log loss for a binary head, absolute
    error for a rating head."""
    if kind == "binary":
        return metrics.row_log_losses(labels, predictions)
    return metrics.row_absolute_errors(labels, predictions)


def _task_values(units: np.ndarray, n_units: int, relevance: np.ndarray,
                 predictions: np.ndarray, k: int) -> np.ndarray:
    """Each unit's nDCG@k (NaN where undefined)."""
    rows_of = np.split(np.argsort(units, kind="stable"), np.cumsum(np.bincount(
        units, minlength=n_units))[:-1])
    return np.array([metrics.ndcg_at_k(relevance[r], predictions[r], k) if len(r) else np.nan
                     for r in rows_of])


def paired_gaps(task_ids: np.ndarray, binary: np.ndarray, relevance: np.ndarray,
                labels: np.ndarray, first: np.ndarray, others: Sequence[np.ndarray], kind: str,
                k: int = 3, per_task: bool = True, resamples: int = 1000, level: float = 0.95,
                seed: int = 0) -> list[dict]:
    """The gap ``first - other`` on each metric for each of ``others``, with its bootstrap
    interval. Every comparison is scored on the same resamples.

    Args:
        task_ids: ``[n]`` each row's task.
        binary, relevance, labels: ``[n]`` the 0/1 label of AUC, the relevance of nDCG and
            the head's label (MAE or log loss), as ``report_from_rows`` takes them.
        first: ``[n]`` the predictions of the predictor compared with every other.
        others: The other predictors' predictions of the same rows, ``[n]`` each.
        kind: The head's kind, "binary" or "rating".
        k: The k of nDCG@k.
        per_task: Resample tasks (and report nDCG@k); False: rows are the units (row data).
        resamples: Bootstrap resamples (fewer for very many units: at least 100).
        level: The interval's coverage.
        seed: The resampling seed (the same seed gives the same interval).

    Returns:
        Per other predictor, ``{"unit": "task" | "row", "units", "resamples", "level",
        "metrics": {name: {"gap", "low", "high", "first_better"}}}``: ``gap`` is the
        difference of the two predictors' metric on the rows as scored, ``low``/``high``
        the interval's ends, ``first_better`` the fraction of resamples where ``first`` was
        the better one (higher, or lower for MAE and log loss; a gap within ``TIE`` counts
        half).

    Raises:
        ValueError: No rows, or arrays of different lengths.
    """
    arrays = [np.asarray(a, np.float64) for a in (binary, relevance, labels, first, *others)]
    n = len(task_ids)
    if not n or any(len(a) != n for a in arrays):
        raise ValueError(f"paired_gaps: expected the same number (> 0) of rows in every array, "
                         f"got task_ids {n} and {[len(a) for a in arrays]}")
    binary, relevance, labels, *predictors = arrays
    if per_task:
        _, units = np.unique(np.asarray(task_ids, np.int64), return_inverse=True)
        units = units.ravel()
    else:
        units = np.arange(n)
    n_units = int(units.max()) + 1
    resamples = int(max(100, min(resamples, 2e9 // max(n, 1) // 100)))

    loss_name = "logloss" if kind == "binary" else "mae"
    contenders = [(_PooledAUC(binary, p), _row_losses(kind, labels, p),
                   _task_values(units, n_units, relevance, p, k) if per_task else None)
                  for p in predictors]

    def gaps_of(unit_weights: np.ndarray) -> list[dict[str, np.ndarray]]:
        """Per other predictor, first's metric minus its, per metric: ``[B]`` each."""
        row_weights = unit_weights[:, units]
        scored = []
        for auc, losses, ndcg in contenders:
            values = {"auc": auc(row_weights),
                      loss_name: (row_weights @ losses) / row_weights.sum(axis=1)}
            if ndcg is not None:
                finite = np.isfinite(ndcg)
                w = unit_weights[:, finite]
                with np.errstate(invalid="ignore", divide="ignore"):
                    values[f"ndcg@{k}"] = (w @ ndcg[finite]) / w.sum(axis=1)
            scored.append(values)
        return [{name: scored[0][name] - v for name, v in other.items()}
                for other in scored[1:]]

    points = gaps_of(np.ones((1, n_units)))
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // max(n, n_units))
    drawn: list[dict[str, list[np.ndarray]]] = [{} for _ in points]
    done = 0
    while done < resamples:
        size = min(chunk, resamples - done)
        draws = rng.integers(0, n_units, size=(size, n_units))
        counts = np.bincount((np.arange(size)[:, None] * n_units + draws).ravel(),
                             minlength=size * n_units).reshape(size, n_units).astype(np.float64)
        for parts, gaps in zip(drawn, gaps_of(counts)):
            for name, v in gaps.items():
                parts.setdefault(name, []).append(v)
        done += size
    tail = (1.0 - level) / 2.0 * 100.0
    results = []
    for point, parts in zip(points, drawn):
        result = {}
        for name, chunks in parts.items():
            v = np.concatenate(chunks)
            v = v[np.isfinite(v)]
            tied = np.abs(v) <= TIE
            better = ((v < 0) if name in LOWER_IS_BETTER else (v > 0)) & ~tied
            result[name] = {"gap": float(point[name][0]),
                            "low": float(np.percentile(v, tail)) if len(v) else float("nan"),
                            "high": (float(np.percentile(v, 100.0 - tail)) if len(v)
                                     else float("nan")),
                            "first_better": (float(better.mean() + tied.mean() / 2)
                                             if len(v) else float("nan"))}
        results.append({"unit": "task" if per_task else "row", "units": n_units,
                        "resamples": resamples, "level": level, "metrics": result})
    return results
