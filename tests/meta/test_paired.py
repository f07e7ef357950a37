"""Paired bootstrap of a gap between two predictors (gmeta_tf.meta.paired)."""

from __future__ import annotations

import numpy as np
import pytest

from gmeta_tf.meta import metrics
from gmeta_tf.meta.evaluation import report_from_rows
from gmeta_tf.meta.paired import _PooledAUC, paired_gaps


def _ratings(tasks: int, seed: int = 0, user_noise: float = 0.0):
    """Rows of ``tasks`` tasks (5-14 rows each, task ids not 0..T-1, rows of a task not
    adjacent): ratings 1-5, the 0/1 label rating >= 4, and two noisy predictors, the first
    less noisy. ``user_noise`` adds an error shared by all rows of a task, to both."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(5, 15, tasks)
    task_ids = rng.permutation(np.repeat(np.arange(tasks) * 7 + 3, sizes))
    n = len(task_ids)
    rating = rng.integers(1, 6, n).astype(np.float64)
    shared = rng.normal(0.0, user_noise, tasks * 7 + 3)[task_ids]
    first = rating + shared + rng.normal(0.0, 1.0, n)
    second = rating + shared + rng.normal(0.0, 1.4, n)
    second[:40] = np.round(second[:40])  # ties
    return task_ids, (rating >= 4).astype(np.float64), rating, first, second


def test_the_gap_is_the_difference_of_the_two_reports():
    task_ids, binary, rating, first, second = _ratings(60)
    a = report_from_rows(task_ids, first, rating, binary, rating, "rating", 3).overall
    b = report_from_rows(task_ids, second, rating, binary, rating, "rating", 3).overall
    gaps = paired_gaps(task_ids, binary, rating, rating, first, [second], "rating", 3)[0]
    assert (gaps["unit"], gaps["units"]) == ("task", 60)
    for metric in ("auc", "mae", "ndcg@3"):
        g = gaps["metrics"][metric]
        np.testing.assert_allclose(g["gap"], a[metric] - b[metric], atol=1e-12)
        assert g["low"] <= g["gap"] <= g["high"]
    probability = 1.0 / (1.0 + np.exp(3.0 - np.stack([first, second])))
    rows = paired_gaps(np.arange(len(binary)), binary, binary, binary, probability[0],
                       [probability[1]], "binary", per_task=False)[0]
    assert (rows["unit"], rows["units"], set(rows["metrics"])) == (
        "row", len(binary), {"auc", "logloss"})
    np.testing.assert_allclose(rows["metrics"]["logloss"]["gap"],
                               metrics.log_loss(binary, probability[0])
                               - metrics.log_loss(binary, probability[1]), atol=1e-12)


def test_weighted_auc_is_the_auc_of_the_rows_repeated():
    rng = np.random.default_rng(1)
    binary = rng.integers(0, 2, 300).astype(np.float64)
    scores = np.round(rng.normal(size=300) + binary, 1)  # many ties
    weights = rng.integers(0, 4, (5, 300)).astype(np.float64)
    got = _PooledAUC(binary, scores)(weights)
    for w, value in zip(weights, got):
        repeat = w.astype(int)
        assert value == pytest.approx(metrics.auc(np.repeat(binary, repeat),
                                                  np.repeat(scores, repeat)), abs=1e-12)


def test_a_better_predictor_on_many_tasks_is_told_apart_an_equal_one_is_not():
    task_ids, binary, rating, first, second = _ratings(400)
    clear = paired_gaps(task_ids, binary, rating, rating, first, [second], "rating", 3)[0]
    assert clear["metrics"]["auc"]["low"] > 0 and clear["metrics"]["mae"]["high"] < 0
    assert clear["metrics"]["auc"]["first_better"] > 0.99
    assert clear["metrics"]["mae"]["first_better"] > 0.99  # lower MAE counts as better
    same = paired_gaps(task_ids, binary, rating, rating, first, [first], "rating", 3)[0]
    for g in same["metrics"].values():  # a tie: half the resamples to each side
        assert (g["gap"], g["low"], g["high"], g["first_better"]) == (0.0, 0.0, 0.0, 0.5)
    # the same predictions through float32 (as a model and its reference may score them):
    # gaps of rounding alone are ties too, not a side's share of the resamples
    rounded = first.astype(np.float32).astype(np.float64) + 1e-9
    near = paired_gaps(task_ids, binary, rating, rating, first, [rounded], "rating", 3)[0]
    for g in near["metrics"].values():
        assert abs(g["gap"]) < 1e-6 and g["first_better"] == 0.5
    rng = np.random.default_rng(5)  # two predictors of the same quality, 30 tasks
    task_ids, binary, rating, first, _ = _ratings(30, seed=5)
    other = rating + rng.normal(0.0, 1.0, len(rating))
    even = paired_gaps(task_ids, binary, rating, rating, first, [other], "rating", 3)[0]
    assert all(g["low"] < 0 < g["high"] for g in even["metrics"].values())


def test_tasks_are_resampled_whole():
    """With an error shared by all rows of a task the rows are not independent: the
    interval over tasks is wider than one over rows would be."""
    task_ids, binary, rating, first, second = _ratings(80, seed=2, user_noise=1.5)
    second = second + np.random.default_rng(3).normal(0.0, 1.0, 80 * 7 + 3)[task_ids]
    by_task = paired_gaps(task_ids, binary, rating, rating, first, [second], "rating", 3)[0]
    by_row = paired_gaps(task_ids, binary, rating, rating, first, [second], "rating", 3,
                         per_task=False)[0]
    width = {name: g["metrics"]["mae"]["high"] - g["metrics"]["mae"]["low"]
             for name, g in (("task", by_task), ("row", by_row))}
    assert width["task"] > 1.5 * width["row"], width
    again = paired_gaps(task_ids, binary, rating, rating, first, [second], "rating", 3)[0]
    assert again == by_task  # the same seed, the same interval


def test_rows_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="same number"):
        paired_gaps(np.arange(3), np.ones(3), np.ones(3), np.ones(3), np.ones(3), [np.ones(2)],
                    "rating")
