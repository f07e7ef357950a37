"""``gmeta eval``'s table by support size: the bands split the tasks by how many support
rows each was adapted on, and each band's figures are those of its tasks' rows alone."""

from __future__ import annotations

import numpy as np

from gmeta_tf.meta.evaluation import report_from_rows
from gmeta_tf.training.evaluation import (ComparedRow, ScoredRows, by_support_size,
                                          format_by_support_size, support_size_bands)


def test_bands_split_the_tasks_in_thirds_as_ties_allow():
    assert support_size_bands(np.arange(1, 10)) == [(1, 3), (4, 6), (7, 9)]
    assert support_size_bands(np.array([9, 1, 5, 3, 7, 2, 8, 4, 6])) == [(1, 3), (4, 6), (7, 9)]
    # a size shared by most tasks stays in one band: fewer, uneven bands
    assert support_size_bands(np.array([1, 1, 1, 1, 2, 3])) == [(1, 1), (2, 3)]
    assert support_size_bands(np.full(10, 5)) == [(5, 5)]
    assert support_size_bands(np.array([], np.int64)) == []


def _scored(rng, tasks, support, predictions):
    rows_per_task = 4
    task_id = np.repeat(np.arange(tasks), rows_per_task)
    label = rng.integers(1, 6, len(task_id)).astype(np.float64)
    return ScoredRows(task_id, predictions(label), label, (label >= 4).astype(np.float64),
                      label, np.repeat(support, rows_per_task))


def test_each_band_scores_its_own_tasks_rows():
    rng = np.random.default_rng(0)
    support = rng.integers(3, 60, 30)
    first = _scored(rng, 30, support, lambda y: y + rng.normal(0, 1.0, len(y)))
    noisy = np.random.default_rng(1).normal(0, 2.0, len(first.label))
    second = ScoredRows(first.task_id, first.label + noisy, first.label, first.binary,
                        first.relevance, first.support)
    rows = [ComparedRow(name, report_from_rows(s.task_id, s.prediction, s.label, s.binary,
                                               s.relevance, "rating").overall, s)
            for name, s in (("meta", first), ("baseline", second))]
    bands = by_support_size(rows, "rating", 3)
    assert sum(b["tasks"] for b in bands) == 30
    assert all(b["rows"][0]["name"] == "meta" and b["rows"][1]["name"] == "baseline"
               for b in bands)
    for band in bands:
        low, high = map(int, band["support"].split("-"))
        keep = (first.support >= low) & (first.support <= high)
        assert band["tasks"] == len(np.unique(first.task_id[keep]))
        for row, scored in zip(band["rows"], (first, second)):
            expected = report_from_rows(scored.task_id[keep], scored.prediction[keep],
                                        scored.label[keep], scored.binary[keep],
                                        scored.relevance[keep], "rating").overall
            for metric in ("auc", "mae", "ndcg@3"):
                np.testing.assert_allclose(row[metric], expected[metric])
    text = format_by_support_size(bands, ["name", "auc", "mae", "tasks"])
    lines = text.splitlines()[3:]  # after the title and the table's two header lines
    assert [line.split()[:2] for line in lines] == [[b["support"], r["name"]]
                                                    for b in bands for r in b["rows"]]


def test_row_data_has_no_bands():
    rng = np.random.default_rng(0)
    scored = _scored(rng, 5, np.zeros(5, np.int64), lambda y: y)
    row = ComparedRow("ctr model", None, scored)
    assert by_support_size([row], "rating", 3) == [] and format_by_support_size([], []) == ""
