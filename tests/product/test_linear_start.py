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
from tests.product.conftest import run_on_two_ranks, tiny_overrides

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
