"""A plain CTR model of ``model.members`` towers, as a user runs it: `gmeta train` on 2
ranks (the members' wider rows go through the all-to-all, their dense gradients through
the all-reduce), `gmeta eval` beside a linear reference averaged over as many fits, and
`gmeta export` to a SavedModel that a fresh process serves as the restored model scores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gmeta_tf.models import EnsembleTower
from gmeta_tf.training.cold_start import restore_models
from gmeta_tf.training.evaluation import row_batches
from tests.product.conftest import run_on_two_ranks, served, tiny_overrides

pytestmark = pytest.mark.horovod
MEMBERS = 3


@pytest.fixture(scope="module")
def ensemble_run(tiny_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ensemble")
    return run_on_two_ranks(tiny_overrides(run_dir, tiny_data, steps=12) + [
        "meta.enabled=false", f"model.members={MEMBERS}"])


def test_members_train_as_one_model_and_their_mean_is_scored(ensemble_run):
    config = ensemble_run
    models, info = restore_models(config)
    tower = models.model.tower
    assert isinstance(tower, EnsembleTower) and tower.num_members == MEMBERS
    summary = json.loads(Path(config.run_dir, "train_summary.json").read_text())
    assert summary["world_size"] == 2
    batch = next(iter(row_batches(config, config.train.validation_split)))
    inputs = models.model.tower_inputs(batch, training=False)
    members = tower.member_outputs(tower.params(), inputs).numpy()
    assert members.shape[-1] == MEMBERS
    assert np.std(members, axis=-1).mean() > 1e-4  # members trained apart
    np.testing.assert_allclose(tower(inputs).numpy(), members.mean(axis=-1), rtol=1e-5,
                               atol=1e-6)
    result = json.loads(Path(config.run_dir, "eval", f"{config.eval.split}.json").read_text())
    assert result["rows"][0]["name"] == "ctr model"
    linear = result["references"]["logistic regression"]
    assert len(linear["fits"]) == MEMBERS  # the reference is averaged as the model is


def test_the_exported_ensemble_serves_in_a_fresh_process_as_restored(ensemble_run, tmp_path):
    config = ensemble_run
    models, info = restore_models(config)
    model = models.model
    batch = next(iter(row_batches(config, config.train.validation_split)))
    features = model.tower.feature_names
    expected = model({k: batch[k] for k in features}).numpy()
    exported = Path(config.export.dir, str(info["step"]))
    out = served(exported, {f"serve/{k}": np.asarray(batch[k]) for k in features}, tmp_path)
    np.testing.assert_allclose(out["serve"], expected, rtol=1e-5, atol=1e-6)
