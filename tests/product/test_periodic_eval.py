"""Periodic evaluation on a split smaller than one batch of ``eval.tasks_per_batch`` tasks."""

from __future__ import annotations

from gmeta_tf import data as meta_io
from gmeta_tf.config import load_config
from gmeta_tf.training.evaluation import eval_batches
from tests.product.conftest import tiny_overrides


def test_a_split_smaller_than_one_batch_is_still_scored(tiny_data, tmp_path):
    overrides = tiny_overrides(tmp_path, tiny_data) + ["eval.tasks_per_batch=100000"]
    config = load_config("default", overrides)
    cold = meta_io.TaskDataset(str(tiny_data), "cold", verify="size")
    assert 0 < cold.fewest_tasks_per_rank == cold.num_tasks < 100000
    batches = list(eval_batches(config, equal_steps=True))
    assert [len(b["task_id"]) for b in batches] == [cold.num_tasks]
    # Without equal steps (final evaluation) the configured size is kept: one short batch.
    assert [len(b["task_id"]) for b in eval_batches(config, equal_steps=False)] == [cold.num_tasks]
