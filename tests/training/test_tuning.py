"""gmeta tune's search spaces: each study's first trial is the pipeline's own settings."""

import optuna
import pytest

from gmeta_tf.config import load_config
from gmeta_tf.training import tuning


@pytest.mark.parametrize("overrides, ridge", [
    ([], (0.0, 0.0)),
    (["meta.ridge=10"], (10.0, 10.0)),                     # the baseline's default: meta's
    (["meta.ridge=3", "eval.baseline_ridge=30"], (3.0, 30.0)),
])
def test_the_pipelines_own_settings_are_a_point_of_each_space(overrides, ridge):
    config = load_config("movielens", overrides, tuned=False)
    meta = tuning._meta_space(optuna.trial.FixedTrial(tuning.pipeline_params("model", config)),
                              config)
    baseline = tuning._baseline_space(
        optuna.trial.FixedTrial(tuning.pipeline_params("baseline", config)), config)
    assert (meta["meta.ridge"], baseline["eval.baseline_ridge"]) == ridge
    assert meta["meta.inner_steps"] == config.meta.inner_steps
    assert meta["meta.multi_step_loss"] == config.meta.multi_step_loss
    assert baseline["eval.baseline_steps"] == config.eval.baseline_steps
    assert baseline["eval.baseline_lr"] == config.eval.baseline_lr


def test_ridge_is_searched_only_where_it_applies():
    config = load_config("default", tuned=False)  # a DLRM with a binary head
    meta = tuning._meta_space(optuna.trial.FixedTrial(tuning.pipeline_params("model", config)),
                              config)
    baseline = tuning._baseline_space(
        optuna.trial.FixedTrial(tuning.pipeline_params("baseline", config)), config)
    assert "meta.ridge" not in meta and "eval.baseline_ridge" not in baseline
