"""gmeta tune's search spaces: each study's first trial is the pipeline's own settings."""

import math

import optuna
import pytest
import yaml

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


def test_the_first_trial_gives_every_table_the_rate_most_of_them_share():
    """A pipeline whose first table never stores a row (the default's user table) keeps
    the rate its learning tables share in the first trial, not that table's; a table at
    another rate is named (gmeta tune warns with it)."""
    config = load_config("default", ["model.tables.user.learning_rate=0.01",
                                     "model.tables.age.learning_rate=0.2",
                                     "model.tables.item.learning_rate=0.2",
                                     "model.tables.category.learning_rate=0.2",
                                     "model.tables.genres.learning_rate=0.2",
                                     "train.baseline_table_learning_rate=null"], tuned=False)
    meta = tuning._meta_space(optuna.trial.FixedTrial(
        tuning.pipeline_params("model", config)), config)
    baseline = tuning._baseline_space(
        optuna.trial.FixedTrial(tuning.pipeline_params("baseline", config)), config)
    assert {meta[f"model.tables.{t}.learning_rate"] for t in config.model.tables} == {0.2}
    assert baseline["train.baseline_table_learning_rate"] == 0.2
    assert tuning.tables_at_another_rate(config) == {"user": 0.01}
    assert tuning.tables_at_another_rate(load_config("movielens", tuned=False)) == {}


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


def test_a_challenger_inside_the_run_to_run_noise_keeps_the_incumbent():
    # Session 26's MovieLens seed 1: k = 1 (trial 1) beat the pipeline's own k = 5 by
    # 0.0001 on the mean of two runs each, while the same settings' two runs differed by
    # 0.0004-0.0013.
    runs = {0: [0.7728, 0.7715], 1: [0.7724, 0.7721]}
    number, margin = tuning.choose_setting(runs, maximize=True)
    spread = math.sqrt(((0.7728 - 0.7715) ** 2 + (0.7724 - 0.7721) ** 2) / 4)
    assert number == 0
    assert margin == pytest.approx(spread)  # sqrt(1/2 + 1/2) = 1


def test_a_challenger_beyond_the_noise_replaces_the_incumbent():
    runs = {0: [0.7334, 0.7332], 5: [0.7367, 0.7373], 7: [0.7354, 0.7357]}
    number, margin = tuning.choose_setting(runs, maximize=True)
    assert number == 5 and 0 < margin < 0.0036


def test_the_rule_turns_with_the_metric_and_counts_a_failed_run_as_the_worst():
    # MAE: lower is better; the challenger is better by 0.01 with a spread of ~0.001.
    assert tuning.choose_setting({0: [0.80, 0.801], 3: [0.79, 0.791]}, maximize=False)[0] == 3
    assert tuning.choose_setting({0: [0.80, 0.801], 3: [0.80, 0.8005]}, maximize=False)[0] == 0
    # The incumbent's re-check failed: its mean is the worst, the challenger wins.
    assert tuning.choose_setting({0: [0.75, math.nan], 2: [0.74, 0.741]}, True) == (2, None)
    # Without the incumbent among the candidates, or without any repeat run, the best mean.
    assert tuning.choose_setting({1: [0.70, 0.71], 2: [0.72, 0.70]}, True) == (2, None)
    assert tuning.choose_setting({0: [0.70], 2: [0.7001]}, True) == (2, None)


def test_every_pick_is_rechecked_when_one_study_has_fewer_trials(monkeypatch, tmp_path):
    """The model's study has one completed trial, the baseline's two: the baseline's own
    settings (trial 0, its last pick) are still re-checked, so it keeps the one-standard-
    error rule; the model's pick fills the extra run unrecorded (the same seeds again
    would count one run twice)."""

    runs = []

    def run_trial(config_arg, overrides, root, merged, np_, patience):
        runs.append(merged)
        return {"model": 0.7, "baseline": 0.6 + 0.01 * len(runs)}, {}, "ok"

    monkeypatch.setattr(tuning, "run_trial", run_trial)
    results = [tuning.TrialResult(n, {"model": {"meta.inner_lr": 0.1 * (n + 1)},
                                      "baseline": {"eval.baseline_lr": 0.2 * (n + 1)}},
                                  {"model": 0.7, "baseline": 0.6}, {}, "ok") for n in range(2)]
    ranked = {"model": [1], "baseline": [1, 0]}  # the model's trial 0 failed
    out = tuning._recheck("default", [], load_config("default"), tmp_path, results, ranked,
                          1, 1, 0, lambda: None)
    assert sorted(out) == [("baseline", 0), ("baseline", 1), ("model", 1)]
    assert len(out[("model", 1)]) == 1  # the filler run is not recorded for it
    assert [r["meta.inner_lr"] for r in runs] == [0.2, 0.2]
    assert [r["eval.baseline_lr"] for r in runs] == [0.4, 0.2]


def test_a_first_trial_without_any_score_stops_the_tune(monkeypatch, tmp_path):
    """The pipeline's own settings must train before they are tuned: a first trial that
    scores neither contender stops tuning with its error, and no tuned.yaml is written.
    (One contender's divergence alone does not stop the other's study: see
    tests/product/test_selection.py.)"""
    from gmeta_tf.config import ConfigError

    monkeypatch.setattr(tuning, "check_data", lambda config, np_: None)
    monkeypatch.setattr(tuning, "chosen_factor_settings", lambda config: {})
    monkeypatch.setattr(tuning, "run_trial", lambda *a: ({}, {}, "failed (exit 1)"))
    with pytest.raises(ConfigError, match=r"the first trial, the pipeline's own settings, "
                                          r"failed \(exit 1\)"):
        tuning.tune("default", [f"run_dir={tmp_path}"], trials=3)
    assert not (tmp_path / "tuned.yaml").exists()


class _Killed(BaseException):
    """The process killed mid-study: nothing after it runs, as with SIGKILL."""


def _fake_trials(monkeypatch, kill_at=None):
    """Trials scored by a fixed function of their settings (the re-checks a little
    lower); the run of number ``kill_at`` (counting from 1) is killed."""
    runs = []

    def run_trial(config_arg, overrides, root, merged, np_, patience):
        runs.append(dict(merged))
        if len(runs) == kill_at:
            raise _Killed
        lower = 0.01 if any("seed" in o for o in overrides) else 0.0
        return ({"model": math.sin(7 * merged["meta.inner_lr"]) - lower,
                 "baseline": math.cos(3 * merged["eval.baseline_lr"]) - lower},
                {"model": 10, "baseline": 20}, "ok")

    monkeypatch.setattr(tuning, "run_trial", run_trial)
    monkeypatch.setattr(tuning, "check_data", lambda config, np_: "data")
    monkeypatch.setattr(tuning, "chosen_factor_settings", lambda config: {})
    return runs


@pytest.mark.parametrize("kill_at", [3, 7])  # during the trials; during the re-checks
def test_a_resumed_study_ends_where_an_uninterrupted_one_does(monkeypatch, tmp_path, kill_at):
    """A study killed after some trials (or re-checks) and resumed runs only what was not
    recorded, asks the samplers for the same settings, and chooses the same ones; a
    larger --trials goes on from where it stopped; a study whose definition changed is
    refused, naming what changed; without --resume an earlier record is kept aside."""
    from gmeta_tf.config import ConfigError

    whole = _fake_trials(monkeypatch)
    tuning.tune("default", [f"run_dir={tmp_path / 'a'}"], trials=5, rechecks=1)
    expected = (tmp_path / "a" / "tuned.yaml").read_text().replace(str(tmp_path / "a"), "R")
    assert len(whole) == 5 + 2  # five trials, two re-checks (the best and trial 0)

    runs = _fake_trials(monkeypatch, kill_at=kill_at)
    args = ("default", [f"run_dir={tmp_path / 'b'}"])
    with pytest.raises(_Killed):
        tuning.tune(*args, trials=5, rechecks=1)
    assert not (tmp_path / "b" / "tuned.yaml").exists()
    with pytest.raises(ConfigError, match="recorded in .*trials.json had another seed: 0, "
                                          "this one 1"):
        tuning.tune(*args, trials=5, rechecks=1, seed=1, resume=True)
    with pytest.raises(ConfigError, match="asks for 5 trials; resume it with --trials 5 or"):
        tuning.tune(*args, trials=4, rechecks=1, resume=True)
    runs = _fake_trials(monkeypatch)
    tuning.tune(*args, trials=5, rechecks=1, resume=True)
    assert runs == whole[kill_at - 1:]  # the killed run again, then the rest
    assert (tmp_path / "b" / "tuned.yaml").read_text().replace(str(tmp_path / "b"), "R") \
        == expected
    runs = _fake_trials(monkeypatch)
    tuning.tune(*args, trials=5, rechecks=1, resume=True)
    assert runs == []  # everything recorded: chosen again without training

    more = _fake_trials(monkeypatch)
    tuning.tune("default", [f"run_dir={tmp_path / 'a'}"], trials=7, rechecks=1)
    runs = _fake_trials(monkeypatch)
    tuning.tune(*args, trials=7, rechecks=1, resume=True)
    assert runs[:2] == more[5:7] and len(runs) == len(more) - 5  # trials 6-7, re-checks
    tune_dir = tmp_path / "b" / "tune"
    before = {p.relative_to(tune_dir): p.read_bytes() for p in tune_dir.rglob("*")
              if p.is_file()}
    _fake_trials(monkeypatch)
    tuning.tune(*args, trials=2, rechecks=0)
    kept = list(tmp_path.joinpath("b").glob("tune.previous-*"))
    assert len(kept) == 1 and before == {p.relative_to(kept[0]): p.read_bytes()
                                         for p in kept[0].rglob("*") if p.is_file()
                                         and p.name != "tuned.yaml"}
    assert (kept[0] / "tuned.yaml").is_file()  # the settings it chose, kept with it


def test_a_new_study_stopped_before_its_first_trial_ends_resumes(monkeypatch, tmp_path):
    """A new study over an earlier one, stopped during its first trial: the earlier study
    is kept whole beside it, the new one's record is its own, so --resume goes on with
    it; a resume that is not the study recorded is refused before the prior's fit."""
    from gmeta_tf.config import ConfigError

    args = ("default", [f"run_dir={tmp_path}"])
    _fake_trials(monkeypatch)
    tuning.tune(*args, trials=3, rechecks=0)
    earlier = (tmp_path / "tune" / "trials.json").read_text()
    _fake_trials(monkeypatch, kill_at=1)
    with pytest.raises(_Killed):
        tuning.tune(*args, trials=3, rechecks=0, seed=5)
    assert [p.joinpath("trials.json").read_text()
            for p in tmp_path.glob("tune.previous-*")] == [earlier]
    assert [p.joinpath("tuned.yaml").read_text() for p in tmp_path.glob("tune.previous-*")] \
        == [(tmp_path / "tuned.yaml").read_text()]  # the settings it chose, kept with it
    fits = []
    monkeypatch.setattr(tuning, "chosen_factor_settings", lambda config: fits.append(1) or {})
    with pytest.raises(ConfigError, match="had another seed: 5, this one 0"):
        tuning.tune(*args, trials=3, rechecks=0, resume=True)
    assert fits == []
    runs = _fake_trials(monkeypatch)
    tuning.tune(*args, trials=3, rechecks=0, seed=5, resume=True)
    assert len(runs) == 3 and (tmp_path / "tuned.yaml").is_file()


def test_a_study_whose_config_file_changed_is_not_resumed(monkeypatch, tmp_path):
    from gmeta_tf.config import ConfigError, resolve_pipeline

    mine = tmp_path / "mine.yaml"
    mine.write_text(resolve_pipeline("default").read_text())
    _fake_trials(monkeypatch, kill_at=2)
    args = (str(mine), [f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(_Killed):
        tuning.tune(*args, trials=3, rechecks=0)
    mine.write_text(mine.read_text().replace("  patience: 5", "  patience: 6", 1))
    _fake_trials(monkeypatch)
    with pytest.raises(ConfigError, match=r"had another pipeline \(the checked config \(a "
                                          r"file edited since\?\)\)"):
        tuning.tune(*args, trials=3, rechecks=0, resume=True)


def test_every_trial_reads_the_dataset_the_tune_converted(monkeypatch, tmp_path):
    """A trial trains in its own run directory, under which its dataset would be by
    default (``<run_dir>/data``): every trial and re-check is given the tune's dataset,
    converted once, instead of converting its own."""
    overrides_seen = []

    def run_trial(config_arg, overrides, root, merged, np_, patience):
        overrides_seen.append(list(overrides))
        return {"model": 0.7, "baseline": 0.6}, {"model": 10, "baseline": 10}, "ok"

    monkeypatch.setattr(tuning, "run_trial", run_trial)
    monkeypatch.setattr(tuning, "check_data", lambda config, np_: "data")
    monkeypatch.setattr(tuning, "chosen_factor_settings", lambda config: {})
    tuning.tune("default", [f"run_dir={tmp_path}"], trials=2, rechecks=1)
    assert len(overrides_seen) == 2 + 1
    for overrides in overrides_seen:
        assert f"data.path={tmp_path / 'data'}" in overrides
    # tuned.yaml records the pipeline's own value of every key it sets (a later edit of
    # the config is then told apart from a value the tune chose)
    tuned = yaml.safe_load((tmp_path / "tuned.yaml").read_text())
    own = load_config("default", [f"run_dir={tmp_path}"], tuned=False)
    assert tuned["tuned_at"]["pipeline"]["meta.inner_lr"] == own.meta.inner_lr
    assert set(tuned["tuned_at"]["pipeline"]) >= {"meta.inner_lr", "eval.baseline_lr"}


def test_trials_that_all_score_alike_are_warned_of_and_the_pipeline_settings_kept(
        monkeypatch, tmp_path, caplog):
    """Every trial kept the linear start (step 0) and so scored the same: the tune says the
    search could not tell the settings apart, and keeps the pipeline's own."""

    def run_trial(config_arg, overrides, root, merged, np_, patience):
        return {"model": 0.6615}, {"model": 0}, "ok"

    monkeypatch.setattr(tuning, "run_trial", run_trial)
    monkeypatch.setattr(tuning, "check_data", lambda config, np_: "data")
    monkeypatch.setattr(tuning, "chosen_factor_settings", lambda config: {})
    with caplog.at_level("WARNING", logger="gmeta_tf.training.tuning"):
        summary = tuning.tune("default", [f"run_dir={tmp_path}", "meta.enabled=false",
                                          "train.baseline=false"], trials=3, rechecks=1)
    assert summary["chosen"]["model"]["trial"] == 0
    assert ("every completed trial of the model scored the same validation auc, 0.6615 (each "
            "kept its checkpoint of step 0, the linear start)") in caplog.text
