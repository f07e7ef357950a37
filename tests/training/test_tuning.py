"""gmeta tune's search spaces: each study's first trial is the pipeline's own settings."""

import optuna
import pytest

from gmeta_tf.config import load_config
from gmeta_tf.training import tuning


@pytest.mark.parametrize("overrides, ridge, l2", [
    ([], (10.0, 10.0), (0.0, 0.0)),  # as shipped: the baseline's ridge defaults to the model's
    (["meta.ridge=0", "train.embedding_l2=0.01"], (0.0, 0.0), (0.01, 0.01)),  # defaults
    (["meta.ridge=3", "eval.baseline_ridge=30", "train.baseline_embedding_l2=0.1"],
     (3.0, 30.0), (0.0, 0.1)),
])
def test_the_pipelines_own_settings_are_a_point_of_each_space(overrides, ridge, l2):
    config = load_config("movielens", overrides, tuned=False)
    meta = tuning._meta_space(optuna.trial.FixedTrial(tuning.pipeline_params("model", config)),
                              config)
    baseline = tuning._baseline_space(
        optuna.trial.FixedTrial(tuning.pipeline_params("baseline", config)), config)
    assert (meta["meta.ridge"], baseline["eval.baseline_ridge"]) == ridge
    assert (meta["train.embedding_l2"], baseline["train.baseline_embedding_l2"]) == l2
    assert meta["meta.inner_steps"] == config.meta.inner_steps
    assert meta["meta.multi_step_loss"] == config.meta.multi_step_loss
    assert baseline["eval.baseline_steps"] == config.eval.baseline_steps
    assert baseline["eval.baseline_lr"] == config.eval.baseline_lr
    rates = {t.optimizer.learning_rate for t in config.model.tables.values()}
    assert {meta[f"model.tables.{t}.learning_rate"] for t in config.model.tables} == rates
    assert [baseline["train.baseline_table_learning_rate"]] == list(rates)


def test_each_study_searches_its_own_models_table_rate():
    """The meta model's study sets every table's rate; the baseline's study its own
    ``train.baseline_table_learning_rate``, so neither study moves the other's rows."""
    config = load_config("movielens", ["train.baseline_table_learning_rate=0.2"], tuned=False)
    meta = tuning._meta_space(optuna.trial.FixedTrial(
        {**tuning.pipeline_params("model", config), "table_learning_rate": 0.01}), config)
    baseline = tuning._baseline_space(
        optuna.trial.FixedTrial(tuning.pipeline_params("baseline", config)), config)
    assert {k: v for k, v in meta.items() if k.startswith("model.tables.")} == {
        f"model.tables.{t}.learning_rate": 0.01 for t in config.model.tables}
    assert baseline["train.baseline_table_learning_rate"] == 0.2
    assert not any(k.startswith("model.") for k in baseline)


def test_ridge_is_searched_only_where_it_applies():
    config = load_config("default", tuned=False)  # a DLRM with a binary head
    meta = tuning._meta_space(optuna.trial.FixedTrial(tuning.pipeline_params("model", config)),
                              config)
    baseline = tuning._baseline_space(
        optuna.trial.FixedTrial(tuning.pipeline_params("baseline", config)), config)
    assert "meta.ridge" not in meta and "eval.baseline_ridge" not in baseline


@pytest.mark.parametrize("ranked, rechecks, expected", [
    ({"model": [0, 3, 1], "baseline": [2, 0, 1]}, 2, {"model": [0, 3], "baseline": [2, 0]}),
    # the incumbent (trial 0) is re-checked too; the other study takes its next best
    ({"model": [3, 1, 0], "baseline": [2, 0, 1]}, 2,
     {"model": [3, 1, 0], "baseline": [2, 0, 1]}),
    ({"model": [3, 1, 0, 2], "baseline": [2, 1, 0, 3]}, 1,
     {"model": [3, 0], "baseline": [2, 0]}),
    # trial 0 failed for the model: nothing to keep; a study with too few trials runs short
    ({"model": [1], "baseline": [1, 0]}, 1, {"model": [1], "baseline": [1, 0]}),
    ({"model": [1, 0], "baseline": [0, 1]}, 0, {"model": [], "baseline": []}),
])
def test_rechecks_take_each_studys_best_and_its_own_settings(ranked, rechecks, expected):
    assert tuning.recheck_picks(ranked, rechecks) == expected
