"""``model.dense_scaling``: dense inputs put on a unit scale inside the tower.

A click log whose dense column is an hour written as 14102100-14102123 (as Avazu writes
it), the click rate rising with the hour: read as stored, the DLRM and the logistic
regression reference learn nothing from it (on an Avazu-shaped log, before the scaling:
validation AUC 0.4984 and 0.5000; on this one, `none` below asserts under 0.65). Through
the product path (`gmeta train`, `gmeta eval`, `gmeta export`)
the scaling is fitted on the training rows, restored by `gmeta eval`, read by the
reference alike, and kept in the SavedModel.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
import yaml

from gmeta_tf.cli import main
from gmeta_tf.config import load_config
from gmeta_tf.training.cold_start import restore_models
from gmeta_tf.training.dense_scaling import (DENSE_AUTO_LIMIT, DENSE_TAIL_LIMIT, _Moments,
                                             dense_scaling, scaling_of, signed_log)
from gmeta_tf.training.evaluation import row_batches


def test_auto_scales_the_inputs_beyond_the_limit_and_standard_every_one():
    rng = np.random.default_rng(0)
    views = np.floor(rng.lognormal(3, 2, 500))  # a count with a long tail
    values = np.stack([14102100 + rng.integers(0, 24, 500),   # an hour stamp
                       rng.uniform(0, 5, 500),                   # already small
                       np.full(500, 3e5),                        # large and constant
                       views], axis=1)
    assert views.max() > DENSE_AUTO_LIMIT
    assert (views.max() - views.mean()) / views.std() > DENSE_TAIL_LIMIT
    shift, scale, logged = dense_scaling(values, "auto")
    np.testing.assert_array_equal(logged, [0, 0, 0, 1])  # the count only: its tail
    log_views = np.log1p(views)
    np.testing.assert_allclose(shift, [values[:, 0].mean(), 0.0, 3e5, log_views.mean()])
    np.testing.assert_allclose(scale, [1 / values[:, 0].std(), 1.0, 1.0, 1 / log_views.std()])
    read = np.where(logged > 0, signed_log(values), values)
    scaled = (read - shift) * scale
    for column in (0, 3):
        assert abs(scaled[:, column].mean()) < 1e-6 and abs(scaled[:, column].std() - 1) < 1e-6
    assert not scaled[:, 2].any()  # a constant input: shifted to 0, not divided by 0
    # standardised as it is, the count's values would sit near the mean, a few far out
    assert ((views - views.mean()) / views.std()).max() > 10 > np.abs(scaled[:, 3]).max()
    shift, scale, logged = dense_scaling(values, "standard")
    np.testing.assert_allclose(shift, values.mean(axis=0))
    np.testing.assert_allclose(scale[:2], 1 / values[:, :2].std(axis=0))
    assert not logged.any()
    shift, scale, logged = dense_scaling(values, "log")
    assert logged.all()
    np.testing.assert_allclose(shift, signed_log(values).mean(axis=0))
    shift, scale, logged = dense_scaling(values, "none")
    assert not shift.any() and (scale == 1).all() and not logged.any()
    # a few missing hours stored as 0 put the stamps' zeros 180 deviations out, but their
    # logarithm draws nothing in (and would lose the hours' differences in float32): not
    # logged
    stamps = 14102100.0 + rng.integers(0, 24, 100_000)
    stamps[:3] = 0.0
    shift, scale, logged = dense_scaling(stamps[:, None], "auto")
    assert not logged.any() and scale[0] != 1
    # a negative value keeps its sign: -1 and 1 stay apart, 0 stays 0
    np.testing.assert_allclose(signed_log(np.array([-1.0, 0.0, 1.0, 1e6])),
                               [-np.log(2), 0.0, np.log(2), np.log1p(1e6)])
    # merged batch by batch (as the fit reads the training split), the moments are the
    # whole array's
    moments = _Moments(4)
    for part in np.array_split(values, [1, 7, 300]):
        moments.add(part)
    np.testing.assert_allclose(moments.raw.mean, values.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(moments.raw.std, values.std(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(moments.logged.std, signed_log(values).std(axis=0),
                               rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(moments.largest, np.abs(values).max(axis=0))
    assert moments.count == 500
    # as ranks merge theirs: each part's moments packed, in order, one part empty
    parts = []
    for part in np.array_split(values, [0, 120, 121]):
        own = _Moments(4)
        own.add(part)
        parts.append(own.packed())
    merged = _Moments.from_packed(np.concatenate(parts), 4)
    assert merged.count == 500
    for name in ("raw", "logged"):
        np.testing.assert_allclose(getattr(merged, name).mean, getattr(moments, name).mean,
                                   rtol=1e-12)
        np.testing.assert_allclose(getattr(merged, name).std, getattr(moments, name).std,
                                   rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(merged.largest, moments.largest)
    for whole, of_parts in zip(dense_scaling(values, "auto"), scaling_of(merged, "auto")):
        np.testing.assert_allclose(of_parts, whole, rtol=1e-9)
    # the constant input merged batch by batch: its deviation is off in the last bits, not 0,
    # and it is still only shifted (not scaled by 1e14)
    assert 0 < moments.logged.std[2] < 1e-9 and scaling_of(moments, "log")[1][2] == 1.0


def _write_log(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    hour = rng.integers(0, 24, n)
    site = rng.integers(0, 20, n)
    views = np.floor(rng.lognormal(3, 2, n)).astype(int)  # a count with a long tail
    p = 1 / (1 + np.exp(-(hour - 11.5) / 3 - (np.log1p(views) - 3) / 2))
    click = (rng.random(n) < p).astype(int)
    lines = ["click,site_id,hour,banner,views"] + [
        f"{c},s{s},{14102100 + h},{b:.3f},{v}"
        for c, s, h, b, v in zip(click, site, hour, rng.uniform(0, 2, n), views)]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense_scaling")
    _write_log(root / "clicks.csv", 2400, 0)
    _write_log(root / "clicks_test.csv", 600, 1)
    config = {
        "name": "clicks", "run_dir": str(root / "run"),
        "data": {"source": "csv", "raw": str(root / "clicks.csv"),
                 "path": str(root / "run" / "data"),
                 "mapping": {"label": "click", "label_range": [0, 1], "sparse": ["site_id"],
                             "dense": ["hour", "banner", "views"]},
                 "split": {"warm_fraction": 1.0, "valid_fraction": 0.2, "query_size": 0,
                           "min_rows": 1},
                 "batch_size": 64},
        "model": {"tower": "dlrm", "embedding_dim": 4,
                  "tables": {"categorical": {"features": ["site_id"]}},
                  "dense_features": {"hour": 1, "banner": 1, "views": 1}, "bottom_units": [8],
                  "top_units": [8], "head": {"kind": "binary", "label": "label"},
                  "start_from_linear": True},
        "meta": {"enabled": False},
        "train": {"steps": 120, "learning_rate": 0.01, "log_every": 40, "eval_every": 40,
                  "checkpoint_every": 40, "baseline": False},
        "eval": {"split": None, "data": [str(root / "clicks_test.csv")]},
        "export": {"dir": str(root / "run" / "export"), "adaptation": False},
    }
    path = root / "clicks.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_training_scales_the_hour_and_eval_and_export_read_it_scaled(trained, capfd):
    assert main(["train", "--config", str(trained), "--fresh"]) == 0
    fitted = [line for line in capfd.readouterr().err.splitlines()
              if "dense inputs scaled" in line]
    assert len(fitted) == 1 and "hour (mean 1.41021e+07, std 6.9" in fitted[0]
    assert "views (signed log: mean 3.16" in fitted[0]  # a long tail: its logarithm
    assert "banner" not in fitted[0]  # on a small scale already: read as stored
    config = load_config(str(trained))
    summary = json.loads(Path(config.run_dir, "train_summary.json").read_text())
    best = summary["best"]["model"]
    assert best["metrics"]["auc"] > 0.7, best  # read as stored: 0.5

    assert main(["eval", "--config", str(trained), "--validation"]) == 0
    rows = {r["name"]: r for r in json.loads(
        Path(config.run_dir, "eval", "valid.json").read_text())["rows"]}
    # the restored checkpoint scores validation as training did: the scaling was restored
    np.testing.assert_allclose(rows["ctr model"]["auc"], best["metrics"]["auc"], atol=1e-4)
    assert rows["reference: logistic regression"]["auc"] > 0.7  # it reads them scaled too

    assert main(["export", "--config", str(trained)]) == 0
    models, manifest = restore_models(config)
    tower = models.model.tower
    hour, banner, views = (list(config.model.dense_features).index(n)
                           for n in ("hour", "banner", "views"))
    shift, scale = tower.dense_shift.numpy(), tower.dense_scale.numpy()
    assert shift[banner] == 0 and scale[banner] == 1
    np.testing.assert_array_equal(tower.dense_log.numpy()[[hour, banner, views]], [0, 0, 1])
    assert abs(shift[hour] - 14102111.5) < 1.0 and abs(1 / scale[hour] - 6.92) < 0.2
    batch = next(iter(row_batches(config, config.train.validation_split)))
    exported = tf.saved_model.load(str(Path(config.export.dir, str(manifest["step"]))))
    inputs = {k: tf.constant(batch[k]) for k in tower.feature_names}
    served = exported.signatures["serving_default"](**inputs)["scores"].numpy()
    np.testing.assert_allclose(served, np.asarray(models.model(batch)),
                               rtol=1e-5, atol=1e-6)
    assert served.std() > 0.05  # the hour moves the score: not saturated by raw values


def test_read_as_stored_the_hour_saturates_the_model(trained, tmp_path):
    """The same log and settings with ``model.dense_scaling: none``: the model and the
    reference it starts from learn nothing from the hour."""
    sets = ["--set", "model.dense_scaling=none", "--set", f"run_dir={tmp_path}",
            "--set", f"export.dir={tmp_path}/export"]
    assert main(["train", "--config", str(trained), "--fresh", *sets]) == 0
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["best"]["model"]["metrics"]["auc"] < 0.65


@pytest.mark.horovod
def test_two_ranks_scale_alike_and_score_validation_as_one_process_does(trained, tmp_path):
    """Under horovodrun each rank reads its shard of the training split and the moments
    are merged over the ranks: the ranks' validation (each scores its shard of the rows)
    is the one a single process scores from the restored checkpoint, which a rank
    reading its inputs otherwise would move."""
    from tests.multiprocess import run_ranks

    sets = ["--set", f"run_dir={tmp_path}", "--set", f"export.dir={tmp_path}/export"]
    run_ranks("gmeta_tf.cli", "train", "--config", str(trained), "--fresh", *sets, np_=2)
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    best = summary["best"]["model"]
    assert summary["world_size"] == 2 and best["metrics"]["auc"] > 0.7, summary
    assert main(["eval", "--config", str(trained), "--validation", *sets]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "eval" / "valid.json").read_text())[
        "rows"]}
    np.testing.assert_allclose(rows["ctr model"]["auc"], best["metrics"]["auc"], atol=1e-4)


def _dataset_with_nan(trained: Path, tmp_path: Path) -> list[str]:
    """The fixture's dataset copied with one training row's ``views`` set to NaN (as a
    dataset written by other means than the converter may hold), and the ``--set``s
    that read it."""
    import hashlib
    import shutil

    import pyarrow.parquet as pq

    assert main(["data", "prepare", "--config", str(trained)]) == 0
    copy = tmp_path / "data"
    shutil.copytree(load_config(str(trained)).data.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    entry = next(f for f in manifest["files"] if f["split"] == "warm")
    path = copy / entry["path"]
    table = pq.read_table(path)
    views = table.column("views").to_numpy(zero_copy_only=False).copy()
    views[5] = np.nan
    table = table.set_column(table.schema.get_field_index("views"), "views",
                             pa.array(views, table.schema.field("views").type))
    writer = pq.ParquetWriter(path, table.schema)
    start = 0
    for n, _ in entry["blocks"]:  # the same blocks as listed
        writer.write_table(table.slice(start, n))
        start += n
    writer.close()
    entry["bytes"] = path.stat().st_size
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return [f"data.path={copy}", "data.source=dataset", "data.mapping=null", "data.raw=null",
            f"run_dir={tmp_path / 'run'}", f"export.dir={tmp_path / 'export'}"]


NAN_REFUSED = (r"dense feature 'views' holds nan on the training split, expected finite "
               r"numbers")


def test_a_dense_value_not_finite_is_refused_naming_the_feature(trained, tmp_path):
    """A dataset written by other means than the converter (which stores a missing value
    as 0.0) may hold NaN: the fit refuses it naming the feature and the value."""
    from gmeta_tf.data import DataError
    from gmeta_tf.training.dense_scaling import fit_dense_scaling
    from gmeta_tf.training.model_builder import build_models

    config = load_config(str(trained), _dataset_with_nan(trained, tmp_path))
    with pytest.raises(DataError, match=NAN_REFUSED):
        fit_dense_scaling(build_models(config), config)


@pytest.mark.horovod
def test_two_ranks_refuse_a_value_not_finite_on_one_ranks_shard(trained, tmp_path):
    """Each rank reads its shard: the rank holding the NaN refuses it, and the other stops
    with it (pointing at that rank) instead of waiting in the merge's collective until
    the launcher's timeout."""
    import re

    from tests.multiprocess import run_ranks

    sets = [a for s in _dataset_with_nan(trained, tmp_path) for a in ("--set", s)]
    with pytest.raises(AssertionError) as failed:
        run_ranks("gmeta_tf.cli", "train", "--config", str(trained), "--fresh", *sets, np_=2)
    output = str(failed.value)
    assert re.search(NAN_REFUSED, output), output[-3000:]
    # the other rank's own message: it stopped at the agreement, not at a timeout
    assert "reading the training split's dense inputs failed on rank(s) [0]" in output, (
        output[-3000:])
