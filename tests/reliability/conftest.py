"""Fixtures of the reliability tests: a tiny pipeline config and its generated dataset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.reliability.launch import PROJECT_ROOT, environment

TINY_PIPELINE = {
    "name": "tiny",
    "data": {"source": "synthetic", "synthetic": {"tasks": 40, "rows_per_task": 12},
             "rows_per_block": 24, "tasks_per_batch": 4, "support": 6, "query": 4},
    "model": {"tower": "dlrm", "embedding_dim": 4,
              "tables": {"user": {"features": ["user_id", "age"], "learning_rate": 0.2},
                         "item": {"features": ["item_id", "category", "genres"],
                                  "learning_rate": 0.2}},
              # the generated price through the tower, its logarithm scaled from the
              # training split (fitted at a fresh start, restored with every commit and
              # checkpoint)
              "dense_features": {"price": 1}, "dense_scaling": "log",
              "bottom_units": [8], "top_units": [8]},
    "meta": {"enabled": True, "algorithm": "maml", "inner_steps": 1, "inner_lr": 0.5,
             "fast_weights": ["top"]},
    "train": {"steps": 60, "log_every": 20, "checkpoint_every": 10, "keep_checkpoints": 3,
              "baseline": False},
}


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory) -> Path:
    """A tiny pipeline config file whose dataset is already generated (once per session)."""
    root = tmp_path_factory.mktemp("tiny")
    config = dict(TINY_PIPELINE, run_dir=str(root / "run"),
                  data=dict(TINY_PIPELINE["data"], path=str(root / "data")))
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    subprocess.run([sys.executable, "-m", "gmeta_tf.cli", "data", "prepare", "--config",
                    str(path)], cwd=PROJECT_ROOT, env=environment(), check=True,
                   capture_output=True, timeout=300)
    return path
