"""``pipelines/ratings.yaml``, a ratings log alone (user, item, rating, time): its settings
are ``pipelines/movielens.yaml``'s but for the side features, and the commands its header
gives run as written on a small half-star log (data prepare, tune, train and eval on 2
ranks, export), only the run shortened and its directories moved out of the project. The
log's header names its columns ``userId,movieId,...``, so every command also carries the
``data.mapping.columns`` setting the header comment gives for such a log."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from gmeta_tf.config import load_config
from tests.multiprocess import PROJECT_ROOT
from tests.product.own_data import SHORT, gmeta

PIPELINES = PROJECT_ROOT / "pipelines"
SIDE_FEATURE_KEYS = ("tables", "item_features", "user_features", "prior")


def test_the_ratings_pipeline_keeps_the_movielens_settings_but_the_side_features():
    ratings = yaml.safe_load((PIPELINES / "ratings.yaml").read_text())
    movielens = yaml.safe_load((PIPELINES / "movielens.yaml").read_text())
    for section in ("meta", "train", "eval"):
        assert ratings[section] == movielens[section], section
    strip = lambda m: {k: v for k, v in m.items() if k not in SIDE_FEATURE_KEYS}  # noqa: E731
    assert strip(ratings["model"]) == strip(movielens["model"])
    assert ratings["model"]["prior"] == {**movielens["model"]["prior"], "feature": "item_id"}
    assert ratings["model"]["tables"] == {"item_id": movielens["model"]["tables"]["item_id"]}
    assert ratings["model"]["item_features"] == ["item_id"]
    assert "user_features" not in ratings["model"]
    for key in ("split", "tasks_per_batch", "support", "query"):
        assert ratings["data"][key] == movielens["data"][key], key
    config = load_config(PIPELINES / "ratings.yaml", tuned=False)
    assert list(config.model.tables) == ["item_id"]


def half_star_log(path: Path, users: int = 200, items: int = 150, seed: int = 0) -> int:
    """userId,movieId,rating,timestamp with half stars 0.5-5: each user's taste is a
    factor, each item's appeal another; 14-30 ratings a user. Returns the rows."""
    rng = np.random.default_rng(seed)
    item_factor, item_bias = rng.normal(0, 1, items), rng.normal(0, 0.5, items)
    rows = 0
    with open(path, "w") as f:
        f.write("userId,movieId,rating,timestamp\n")
        for u in range(1, users + 1):
            taste = rng.normal(0, 1)
            for k, item in enumerate(rng.choice(items, int(rng.integers(14, 31)), replace=False)):
                score = 3.2 + item_bias[item] + taste * item_factor[item] + rng.normal(0, 0.4)
                rating = float(np.clip(np.round(score * 2) / 2, 0.5, 5))
                f.write(f"user{u},m{item},{rating:g},{1_600_000_000 + 1000 * u + k}\n")
                rows += 1
    return rows


def header_comment() -> list[str]:
    """The pipeline's comment lines, without their leading ``#`` and spaces."""
    return [line.lstrip("# ") for line in (PIPELINES / "ratings.yaml").read_text().splitlines()
            if line.startswith("#")]


def header_commands() -> list[list[str]]:
    """The ``gmeta`` commands of the pipeline's header comment, each split into words."""
    return [line.split() for line in header_comment() if line.startswith("gmeta ")]


def header_renaming() -> list[str]:
    """The ``--set data.mapping.columns=...`` the header comment gives for a log whose header
    names its columns otherwise, as words."""
    found = re.search(r"--set '(data\.mapping\.columns=[^']*)'", " ".join(header_comment()))
    assert found, "the header comment no longer says how to read a userId,movieId header"
    return shlex.split(found.group(0))


@pytest.fixture(scope="module")
def ratings_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("ratings_pipeline")
    rows = half_star_log(work / "my_ratings.csv")
    moved = ["--set", f"run_dir={work}/run", "--set", f"data.path={work}/run/data",
             "--set", f"export.dir={work}/run/export", *header_renaming()]
    commands = header_commands()
    assert [c[1] for c in commands] == ["data", "tune", "train", "eval", "export"]
    results = []
    for words in commands:
        words = [f"data.raw={work / 'my_ratings.csv'}" if w.endswith("my_ratings.csv") else w
                 for w in words]
        extra = moved + (SHORT if words[1] != "data" else [])
        if words[1] == "tune":
            extra += ["--trials", "1", "--rechecks", "0"]
        result = subprocess.run([gmeta(), *words[1:], *extra], cwd=PROJECT_ROOT,
                                capture_output=True, text=True, timeout=900,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        assert result.returncode == 0, f"{words} exited {result.returncode}:\n" \
                                       f"{(result.stdout + result.stderr)[-5000:]}"
        results.append(result)
    return work, rows, results


def test_the_header_commands_train_on_two_ranks_and_compare_on_cold_users(ratings_run):
    work, rows, results = ratings_run
    run = work / "run"
    manifest = json.loads((run / "data" / "manifest.json").read_text())
    assert manifest["split"]["rows_in"] == rows  # every line of the log read
    assert {f["split"] for f in manifest["files"]} >= {"warm", "valid", "cold"}
    assert json.loads((run / "train_summary.json").read_text())["world_size"] == 2
    # The factor prior's settings, left to choose by the pipeline, were chosen once before
    # the trials (on validation and held-out training users), every trial used them, and
    # tuned.yaml carries them to train and eval.
    tuned = yaml.safe_load((run / "tuned.yaml").read_text())
    prior = tuned["model"]["prior"]
    assert set(prior) == {"damping", "item_bias", "fold_in_prior", "fold_in"}
    trial = yaml.safe_load((run / "tune" / "trial-0" / "config.yaml").read_text())
    assert {k: trial["model"]["prior"][k] for k in prior} == prior
    cold = json.loads((run / "eval" / "cold.json").read_text())
    names = [r["name"] for r in cold["rows"]]
    assert names[0].startswith("meta (maml") and any(n.startswith("baseline fine-tuned")
                                                     for n in names)
    assert "reference: matrix factorisation fold-in" in names
    # each blended row carries its weight, the one its name shows
    blended = [r for r in cold["rows"] if "blend" in r]
    assert {r["name"].split(" (")[0] for r in blended} == {"meta", "baseline fine-tuned"}
    assert all(0.0 <= r["blend"] <= 1.0 and r["name"].endswith(f", blend {r['blend']:.2f})")
               for r in blended)
    assert all(np.isfinite(r["auc"]) and np.isfinite(r["mae"]) for r in cold["rows"])
    assert cold["by_support_size"] and (run / "eval" / "valid.json").is_file()
    assert list((run / "export").iterdir()), "no SavedModel exported"
    assert not (PROJECT_ROOT / "runs" / "ratings").exists() or \
        not any((PROJECT_ROOT / "runs" / "ratings").iterdir())


def test_the_export_serves_the_capped_factors_as_the_trained_model(ratings_run, tmp_path):
    """On this log (users share one mean rating) the prior's factors are past the norm
    cap, so the tower reads them scaled down (``LabelPrior.factor_scale`` < 1): the
    SavedModel, in a fresh process without gmeta_tf, serves both signatures as the
    trained model predicts."""
    from gmeta_tf import data as meta_io
    from gmeta_tf.training.cold_start import restore_models
    from tests.product.conftest import served_and_expected

    work, _, _ = ratings_run
    run = work / "run"
    sets = [f"data.raw={work / 'my_ratings.csv'}", f"run_dir={run}", f"data.path={run}/data",
            f"export.dir={run}/export"]
    cwd = Path.cwd()
    os.chdir(PROJECT_ROOT)  # the pipeline's relative paths, as its commands ran
    try:
        config = load_config("ratings", sets + [s for s in SHORT if s != "--set"])
    finally:
        os.chdir(cwd)
    models, info = restore_models(config)
    model = models.model
    assert 0.0 < float(model.tower.prior.factor_scale().numpy()) < 1.0
    batch = next(iter(meta_io.read_tasks(config.data.path, 2, None, None, split="cold")))
    exported, = (run / "export").iterdir()
    assert exported.name == str(info["step"])
    out, expected, expected_adapted = served_and_expected(model, batch, exported, tmp_path)
    np.testing.assert_allclose(out["serve"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["adapt"], expected_adapted, rtol=1e-5, atol=1e-5)


def test_without_a_declared_range_the_dataset_s_own_ratings_bound_a_served_support_label(
        ratings_run, tmp_path):
    """A log converted without ``label_range`` (``gmeta data csv`` without
    ``--label-range``): the served model refuses a support rating outside the smallest and
    largest rating of its dataset, as the manifest records them, and says so in
    ``gmeta_export.json``."""
    import dataclasses

    import tensorflow as tf

    from gmeta_tf import data as meta_io
    from gmeta_tf.serving import export_saved_model
    from gmeta_tf.training.cold_start import restore_models
    from tests.product.conftest import task_rows

    work, _, _ = ratings_run
    run = work / "run"
    manifest = meta_io.Manifest.load(str(run / "data"))
    assert manifest.split["labels_seen"]["rating"] == [0.5, 5.0]  # the half-star log's
    undeclared = meta_io.Schema([dataclasses.replace(f, value_range=None)
                                 for f in manifest.schema.features])
    sets = [f"data.raw={work / 'my_ratings.csv'}", f"run_dir={run}", f"data.path={run}/data",
            f"export.dir={run}/export"]
    cwd = Path.cwd()
    os.chdir(PROJECT_ROOT)
    try:
        config = load_config("ratings", sets + [s for s in SHORT if s != "--set"])
    finally:
        os.chdir(cwd)
    model = restore_models(config)[0].model
    info = export_saved_model(model, undeclared, tmp_path / "1",
                              labels_seen=manifest.split["labels_seen"])
    assert info["support_label_range"] == [0.5, 5.0]
    assert info["support_label_range_from"] == "the smallest and largest label of the dataset"
    batch = next(iter(meta_io.read_tasks(config.data.path, 2, None, None, split="cold")))
    support, query = task_rows(batch, "support", 0), task_rows(batch, "query", 0)
    features = model.tower.feature_names
    request = {**{f"support_{k}": tf.constant(support[k]) for k in features},
               **{f"query_{k}": tf.constant(query[k]) for k in features}}
    adapt = tf.saved_model.load(str(tmp_path / "1")).signatures["adapt"]
    ratings = np.array(support["rating"], np.float32)
    adapt(**request, support_rating=tf.constant(ratings))  # ratings of the log: served
    ratings[0] = 10.0  # a ten-point scale's
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input support_rating holds a label outside \[0.5, 5\]"):
        adapt(**request, support_rating=tf.constant(ratings))
