"""Metrics against brute-force definitions; per-task and overall evaluation."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.meta import evaluate_tasks
from gmeta_tf.meta import metrics
from gmeta_tf.models import BinaryHead, RatingHead


def _pairwise_auc(labels, scores):
    pos = [s for y, s in zip(labels, scores) if y]
    neg = [s for y, s in zip(labels, scores) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_equals_the_pairwise_definition_with_ties():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 60)
    scores = rng.integers(0, 5, 60).astype(float)  # many ties
    assert metrics.auc(labels, scores) == pytest.approx(_pairwise_auc(labels, scores))
    assert np.isnan(metrics.auc([1, 1], [0.2, 0.3]))


def test_ndcg_log_loss_mae():
    # Ranking by score: items with relevance 3, 1, 2 -> DCG@2 = 3 + 1/log2(3); ideal 3 + 2/log2(3).
    assert metrics.ndcg_at_k([3, 2, 1], [0.9, 0.1, 0.5], 2) == pytest.approx(
        (3 + 1 / np.log2(3)) / (3 + 2 / np.log2(3)))
    assert metrics.ndcg_at_k([1, 2], [0.0, 1.0], 3) == pytest.approx(1.0)
    assert metrics.log_loss([1, 0], [0.8, 0.4]) == pytest.approx(
        -(np.log(0.8) + np.log(0.6)) / 2)
    assert metrics.mae([1, 2], [2, 4]) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="k=0"):
        metrics.ndcg_at_k([1], [1], 0)


def test_evaluate_tasks_per_task_and_overall_ignores_padding():
    query = {"rating": np.array([[5, 1, 4, 0], [2, 3, 0, 0]], np.float32),
             "label": np.array([[1, 0, 1, 0], [0, 0, 0, 0]], np.float32),
             "mask": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)}
    batch = {"task_id": np.array([7, 9]), "query": query}
    preds = np.array([[4.0, 2.0, 3.0, 99.0], [2.5, 2.5, 99.0, 99.0]], np.float32)
    report = evaluate_tasks(lambda b: tf.constant(preds), [batch], RatingHead("rating"),
                            k=3, binary_label="label")
    assert report.per_task["task_id"].tolist() == [7, 9]
    assert report.per_task["auc"][0] == 1.0 and np.isnan(report.per_task["auc"][1])
    assert report.overall["mae"] == pytest.approx((1 + 1 + 1 + 0.5 + 0.5) / 5)
    assert report.overall["rows"] == 5 and report.overall["tasks"] == 2
    assert report.per_task["ndcg@3"][0] == pytest.approx(1.0)
    binary = evaluate_tasks(lambda b: tf.constant(np.clip(preds / 5, 0, 1)), [batch],
                            BinaryHead("label"))
    assert "logloss" in binary.overall and "mae" not in binary.overall


def test_the_auc_differences_standard_error_is_delongs_and_matches_the_bootstrap():
    rng = np.random.default_rng(0)
    labels = rng.random(600) < 0.25
    a = rng.normal(size=600) + 0.8 * labels
    b = a + rng.normal(scale=0.4, size=600)  # correlated with a, as two checkpoints are
    se = metrics.auc_difference_se(labels, a, b)
    draws = [rng.integers(0, 600, 600) for _ in range(1500)]
    boot = np.std([metrics.auc(labels[i], a[i]) - metrics.auc(labels[i], b[i])
                   for i in draws])
    assert se == pytest.approx(boot, rel=0.1)
    # the unpaired one is larger: pairing removes what the two share
    unpaired = np.hypot(*(np.std([metrics.auc(labels[i], s[i]) for i in draws])
                          for s in (a, b)))
    assert se < 0.6 * unpaired
    assert metrics.auc_difference_se(labels, a, a) == 0.0
    assert np.isnan(metrics.auc_difference_se([1, 0, 0], [0.2, 0.1, 0.3], [0.1, 0.2, 0.3]))
