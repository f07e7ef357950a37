"""``model.start_from_linear``: a plain model that starts at the logistic regression
reference. In one process: the started model scores every validation row as the reference
that ``gmeta eval`` fits (a multi-hot feature, dense-free DLRM, several tables). On 2
ranks under horovodrun: `gmeta train` validates the started model before its first step,
and that validation is the reference's own on the same rows, each rank holding the
weights of the ids it owns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gmeta_tf.config import ConfigError, load_config
from gmeta_tf.training.evaluation import fit_reference_predictors, row_batches
from gmeta_tf.training.linear_start import start_from_linear
from gmeta_tf.training.model_builder import build_models
from gmeta_tf.cli import main
from tests.product.conftest import run_on_two_ranks, set_args, tiny_overrides

START = ["meta.enabled=false", "model.start_from_linear=true",
         "model.tables.user.admit_after=1"]


def _validation_rows(config):
    return list(row_batches(config, config.train.validation_split))


def test_the_started_model_scores_rows_as_the_linear_reference(tiny_data, tmp_path):
    config = load_config("default", tiny_overrides(tmp_path, tiny_data) + START)
    models = build_models(config)
    model = models.model
    batches = _validation_rows(config)
    before = np.concatenate([model(b).numpy() for b in batches])
    chosen = start_from_linear(models, config)
    started = np.concatenate([model(b).numpy() for b in batches])
    references = fit_reference_predictors(build_models(config), config)
    assert references.chosen["logistic regression"] == chosen
    linear = np.concatenate([references.predictors["logistic regression"](b)
                             for b in batches])
    assert np.abs(before - linear).max() > 1e-2  # not the linear model by chance
    np.testing.assert_allclose(started, linear, rtol=1e-4, atol=1e-5)
    kernel, _ = model.tower.final_layer
    assert not np.any(model.tower.params()[kernel].numpy())
    # ids the training rows never had (a third of each feature's): they weigh nothing in
    # either, not the weight of a training id sharing the reference's hashed column
    unseen = []
    for b in batches:
        b = dict(b)
        for name in model.tower.sparse_features:
            ids = np.asarray(b[name]).copy()
            rows = np.arange(len(ids)) % 3 == 0
            ids[rows] = np.where(ids[rows] >= 0, (1 << 50) + np.arange(rows.sum()).reshape(
                (-1,) + (1,) * (ids.ndim - 1)), ids[rows])
            b[name] = ids
        unseen.append(b)
    np.testing.assert_allclose(
        np.concatenate([model(b).numpy() for b in unseen]),
        np.concatenate([references.predictors["logistic regression"](b) for b in unseen]),
        rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("override, expected", [
    ("meta.enabled=true", "meta.enabled: true"),
    ("model.linear=false", "without model.linear"),
    ("model.members=2", "model.members > 1"),
    ("model.tables.user.admit_after=5", "admit ids late (['user']"),
])
def test_start_from_linear_is_refused_where_it_cannot_start_there(tiny_data, tmp_path,
                                                                   override, expected):
    with pytest.raises(ConfigError, match="model.start_from_linear") as err:
        load_config("default", tiny_overrides(tmp_path, tiny_data) + START + [override])
    assert expected in str(err.value)


def test_a_linear_margin_needs_the_linear_start(tiny_data, tmp_path):
    with pytest.raises(ConfigError, match=r"train.linear_margin' = 1.0 is not allowed: .*"
                                          r"model.start_from_linear: true"):
        load_config("default", tiny_overrides(tmp_path, tiny_data) + [
            "meta.enabled=false", "train.linear_margin=1"])


@pytest.mark.horovod
def test_two_ranks_keep_the_linear_start_within_its_margin_and_after_a_resume(tiny_data,
                                                                             tmp_path):
    """At a margin no checkpoint can beat, the linear start stays the best checkpoint on
    both ranks, before and after a resumed run (which reads its validation predictions
    from beside the checkpoints), and gmeta eval scores it: the reference's own figures."""
    from tests.multiprocess import run_ranks

    overrides = tiny_overrides(tmp_path, tiny_data, steps=8) + START + [
        "train.eval_batches=null", "train.linear_margin=1000"]
    config = run_on_two_ranks(overrides, export=False)
    assert Path(config.checkpoint_dir, "LINEAR_VALIDATION.npy").is_file()
    more = [o for o in overrides if not o.startswith("train.steps=")] + ["train.steps=16"]
    out = run_ranks("gmeta_tf.cli", "train", "--config", "default", "--resume",
                    *set_args(more), np_=2, timeout=600)
    # the log says why a rising validation AUC is not a new best
    assert "at step 0, the linear start, which a checkpoint replaces only when better by" in out
    best = json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())
    assert [h["step"] for h in best["history"]] == [0, 4, 8, 12, 16]
    later = [h["model"]["linear_margin"] for h in best["history"][1:]]
    assert all(m > 0.01 for m in later), later  # 1000 standard errors of a real gap
    assert best["best"]["model"]["step"] == 0
    assert main(["eval", "--validation", *set_args(more)]) == 0
    result = json.loads(Path(config.run_dir, "eval",
                             f"{config.train.validation_split}.json").read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert rows["ctr model"]["auc"] == pytest.approx(
        rows["reference: logistic regression"]["auc"], abs=1e-4)


@pytest.mark.horovod
def test_two_ranks_validate_the_linear_start_before_the_first_step(tiny_data, tmp_path):
    config = run_on_two_ranks(tiny_overrides(tmp_path, tiny_data, steps=8) + START + [
        "train.eval_batches=null"], export=False)  # every validation row, as eval scores them
    best = json.loads(Path(config.run_dir, "checkpoints", "BEST.json").read_text())
    first = best["history"][0] if "history" in best else None
    assert first is not None and first["step"] == 0, best
    result = json.loads(Path(config.run_dir, "eval",
                             f"{config.train.validation_split}.json").read_text())
    rows = {r["name"]: r for r in result["rows"]}
    reference = rows["reference: logistic regression"]
    assert first["model"]["rows"] == reference["rows"]
    assert first["model"]["auc"] == pytest.approx(reference["auc"], abs=1e-4)  # 4 decimals
