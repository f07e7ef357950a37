"""Fixtures of the product tests: a tiny generated dataset and tiny pipeline overrides."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
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
        *TINY_BASELINE,
    ]


#: The tiny pipeline's baseline: at the model's rates, without an embedding penalty,
#: fine-tuned at 0.1 (the settings gmeta tune chose for the full-size default would
#: override what a test of tuned settings reads, and are not this data's).
TINY_BASELINE = ["train.baseline_learning_rate=null", "train.baseline_table_learning_rate=null",
                 "train.baseline_embedding_l2=null", "eval.baseline_lr=0.1"]


def set_args(overrides: list[str]) -> list[str]:
    """The ``--set`` arguments of the gmeta command for config overrides."""
    return [a for o in overrides for a in ("--set", o)]


def run_on_two_ranks(overrides: list[str], export: bool = True, timeout: float = 600):
    """The default pipeline with ``overrides`` as a user runs it: `gmeta train` on 2 ranks
    under horovodrun, then `gmeta eval --validation` (and `gmeta export`) in this process;
    returns the config."""
    from gmeta_tf.cli import main
    from gmeta_tf.config import load_config
    from tests.multiprocess import run_ranks

    sets = set_args(overrides)
    run_ranks("gmeta_tf.cli", "train", "--config", "default", *sets, np_=2, timeout=timeout)
    assert main(["eval", "--validation", *sets]) == 0
    if export:
        assert main(["export", *sets]) == 0
    return load_config("default", overrides)


def served(export_dir: Path, inputs: dict[str, np.ndarray], tmp_path: Path,
           timeout: float = 300) -> dict[str, np.ndarray]:
    """Scores ``inputs`` (``serve/<name>`` and ``adapt/<name>`` arrays) with the SavedModel
    at ``export_dir`` in a fresh process that never imports gmeta_tf (``serving_check.py``,
    as TF Serving would), checks that neither gmeta_tf nor its op library got loaded, and
    returns the scores of each signature given (``serve``, ``adapt``)."""
    import subprocess
    import sys

    np.savez(tmp_path / "in.npz", **inputs)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, str(Path(__file__).with_name("serving_check.py")),
                    str(export_dir), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                   check=True, cwd=tmp_path, env=env, capture_output=True, timeout=timeout)
    with np.load(tmp_path / "out.npz") as out:
        assert not out["gmeta_imported"] and not out["op_library_loaded"]
        return {k: out[k] for k in out.files if k in ("serve", "adapt")}


def served_and_expected(model, batch: dict, export_dir: Path, tmp_path: Path,
                        timeout: float = 300) -> tuple[dict, np.ndarray, np.ndarray]:
    """Task 0 of a task batch through the SavedModel at ``export_dir`` in a fresh process
    (``served``: its query rows by ``serve``, and adapted on its support rows by ``adapt``),
    and what the trained meta ``model`` predicts for them: ``(served outputs, expected
    unadapted, expected adapted)``."""
    support, query = task_rows(batch, "support", 0), task_rows(batch, "query", 0)
    features = model.tower.feature_names
    expected = model.adapted_predictions(batch, steps=0).numpy()[0][
        np.asarray(batch["query"]["mask"][0]) > 0]
    expected_adapted = model.serve(support, {k: query[k] for k in features}).numpy()
    inputs = {**{f"serve/{k}": query[k] for k in features},
              **{f"adapt/support_{k}": support[k] for k in (*features, model.head.label)},
              **{f"adapt/query_{k}": query[k] for k in features}}
    return served(export_dir, inputs, tmp_path, timeout), expected, expected_adapted


def pooled_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Mann-Whitney AUC (ties count one half), written out independently of gmeta_tf."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def task_rows(batch: dict, role: str, t: int) -> dict[str, np.ndarray]:
    """Task ``t``'s real rows of a task batch's ``role`` ("support" or "query"), per feature
    (the label too; padding and the mask dropped)."""
    real = np.asarray(batch[role]["mask"][t]) > 0
    return {k: np.asarray(v[t])[real] for k, v in batch[role].items() if k != "mask"}


def cold_query_rows(model, data_dir: Path, label: str, tasks_per_batch: int = 8,
                    split: str = "cold"):
    """Every cold task's (or ``split``'s) query rows scored by the model with no adaptation
    (a baseline CTR model: fine-tuned 0 steps), as ``gmeta eval`` scores task models.
    Returns ``(scores, labels, tasks)``."""
    from gmeta_tf import data as meta_io
    from gmeta_tf.meta import MetaModel, fine_tuned_predictions

    if isinstance(model, MetaModel):
        predict = lambda batch: model.adapted_predictions(batch, steps=0)  # noqa: E731
    else:
        predict = fine_tuned_predictions(model, 0, 0.1)
    scores, labels, tasks = [], [], 0
    for batch in meta_io.read_tasks(str(data_dir), tasks_per_batch, None, None, split=split):
        real = np.asarray(batch["query"]["mask"]) > 0
        scores.append(np.asarray(predict(batch))[real])
        labels.append(np.asarray(batch["query"][label])[real])
        tasks += int(batch["task_id"].shape[0])
    return np.concatenate(scores), np.concatenate(labels), tasks


def cold_rows(model, data_dir: Path, label: str, batch_size: int = 256):
    """Every cold row scored by a plain CTR model, as ``gmeta eval`` scores one. Returns
    ``(scores, labels, first_batch)``."""
    from gmeta_tf import data as meta_io

    names = [*model.tower.sparse_features, *model.tower.dense_features]
    scores, labels, first = [], [], None
    for rows in meta_io.read_rows(str(data_dir), batch_size, split="cold"):
        first = rows if first is None else first
        scores.append(np.asarray(model({n: rows[n] for n in names}, training=False)))
        labels.append(np.asarray(rows[label]))
    return np.concatenate(scores), np.concatenate(labels), first


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A generated task dataset (240 users), made once for the session."""
    from gmeta_tf.config import load_config
    from gmeta_tf.training import prepare_dataset

    root = tmp_path_factory.mktemp("product")
    data_dir = root / "data"
    prepare_dataset(load_config("default", tiny_overrides(root / "unused", data_dir)))
    return data_dir
