"""Fixtures of the product tests: a tiny generated dataset and tiny pipeline overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def tiny_overrides(run_dir: Path, data_dir: Path, steps: int = 8) -> list[str]:
    """``--set`` overrides shrinking the default pipeline to seconds of work."""
    return [
        f"run_dir={run_dir}", f"data.path={data_dir}", f"export.dir={run_dir}/export",
        "data.synthetic.tasks=240", "data.synthetic.rows_per_task=16", "data.rows_per_block=256",
        "data.tasks_per_batch=8", "data.support=10", "data.query=5",
        "model.embedding_dim=4", "model.bottom_units=[8]", "model.top_units=[8]",
        "meta.inner_steps=1",
        f"train.steps={steps}", "train.log_every=4", "train.eval_every=4",
        "train.eval_batches=1", "train.checkpoint_every=4", "eval.tasks_per_batch=8",
    ]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A generated task dataset (240 users), made once for the session."""
    from gmeta_tf.config import load_config
    from gmeta_tf.training import prepare_dataset

    root = tmp_path_factory.mktemp("product")
    data_dir = root / "data"
    prepare_dataset(load_config("default", tiny_overrides(root / "unused", data_dir)))
    return data_dir
