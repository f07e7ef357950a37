"""Ranking and regression metrics in NumPy: AUC, log loss, MAE, nDCG@k."""

from __future__ import annotations

import numpy as np


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, ties sharing their average rank."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(sorted_x)) + 1])
    ends = np.append(starts[1:], len(x))
    ranks = np.empty(len(x), np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with ties); NaN without both classes."""
    labels = np.asarray(labels, np.float64).ravel() > 0.5
    scores = np.asarray(scores, np.float64).ravel()
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    ranks = _average_ranks(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def auc_difference_se(labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray) -> float:
    """Standard error of ``auc(labels, a) - auc(labels, b)`` over the same rows (DeLong,
    DeLong and Clarke-Pearson 1988, by midranks as Sun and Xu 2014 compute it); NaN
    without two rows of each class."""
    labels = np.asarray(labels, np.float64).ravel() > 0.5
    m, n = int(labels.sum()), int((~labels).sum())
    if m < 2 or n < 2:
        return float("nan")
    pos_parts, neg_parts = [], []
    for scores in (scores_a, scores_b):
        scores = np.asarray(scores, np.float64).ravel()
        x, y = scores[labels], scores[~labels]
        ranks = _average_ranks(np.concatenate([x, y]))
        pos_parts.append((ranks[:m] - _average_ranks(x)) / n)        # each positive's AUC
        neg_parts.append(1.0 - (ranks[m:] - _average_ranks(y)) / m)  # each negative's
    contrast = np.array([1.0, -1.0])
    variance = (contrast @ np.cov(np.stack(pos_parts)) @ contrast / m
                + contrast @ np.cov(np.stack(neg_parts)) @ contrast / n)
    return float(np.sqrt(max(variance, 0.0)))


def row_log_losses(labels: np.ndarray, probabilities: np.ndarray,
                   eps: float = 1e-7) -> np.ndarray:
    """Each row's binary cross-entropy (probabilities clipped to [eps, 1 - eps]), flat."""
    y = np.asarray(labels, np.float64).ravel()
    p = np.clip(np.asarray(probabilities, np.float64).ravel(), eps, 1.0 - eps)
    return -(y * np.log(p) + (1.0 - y) * np.log(1.0 - p))


def log_loss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities (clipped to [eps, 1 - eps])."""
    return float(np.mean(row_log_losses(labels, probabilities, eps)))


def row_absolute_errors(targets: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """Each row's absolute error, flat."""
    return np.abs(np.asarray(targets, np.float64).ravel()
                  - np.asarray(predictions, np.float64).ravel())


def mae(targets: np.ndarray, predictions: np.ndarray) -> float:
    """Mean absolute error."""
    return float(np.mean(row_absolute_errors(targets, predictions)))


def ndcg_at_k(relevance: np.ndarray, scores: np.ndarray, k: int) -> float:
    """nDCG@k of one list: items ranked by score, gain = relevance, discount log2(rank + 1).

    Ties in score keep the input order. A list whose ideal DCG is 0 scores NaN.

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"ndcg_at_k: k={k}, expected >= 1")
    rel = np.asarray(relevance, np.float64).ravel()
    order = np.argsort(-np.asarray(scores, np.float64).ravel(), kind="mergesort")[:k]
    discounts = 1.0 / np.log2(np.arange(2, len(order) + 2))
    ideal = np.sort(rel)[::-1][:k]
    ideal_dcg = float(np.sum(ideal * discounts[: len(ideal)]))
    if ideal_dcg == 0.0:
        return float("nan")
    return float(np.sum(rel[order] * discounts) / ideal_dcg)
