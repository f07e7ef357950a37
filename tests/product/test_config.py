"""The pipeline config: ready pipelines load; bad keys and values fail with a clear message."""

from __future__ import annotations

import logging

import pytest
import yaml

from gmeta_tf.cli import main
from gmeta_tf.config import (PIPELINES_DIR, ConfigError, PipelineConfig, apply_override,
                             dump_config, from_dict, load_config)
from gmeta_tf.data import SplitConfig
from gmeta_tf.embedding import MixCacheConfig, TableConfig
from gmeta_tf.embedding.sparse_optimizers import Adagrad
from gmeta_tf.meta import MetaConfig


def _default_raw() -> dict:
    return yaml.safe_load((PIPELINES_DIR / "default.yaml").read_text())


@pytest.mark.parametrize("name", sorted(p.stem for p in PIPELINES_DIR.glob("*.yaml")))
def test_ready_pipelines_load(name):
    config = load_config(name)
    assert isinstance(config, PipelineConfig)
    assert config.model.tables and config.train.steps >= 1


@pytest.mark.parametrize("name", ["default", "movielens", "ratings", "criteo"])
def test_a_run_directory_holds_its_dataset_and_export_unless_they_are_given(name, tmp_path):
    """One ``--set run_dir=...`` moves a ready pipeline's dataset and SavedModel with its
    checkpoints; a path given beside it is kept."""
    config = load_config(name, [f"run_dir={tmp_path}"])
    assert (config.data.path, config.export.dir) == (str(tmp_path / "data"),
                                                     str(tmp_path / "export"))
    given = load_config(name, [f"run_dir={tmp_path}", f"data.path={tmp_path / 'shared'}",
                               f"export.dir={tmp_path / 'served'}"])
    assert (given.data.path, given.export.dir) == (str(tmp_path / "shared"),
                                                   str(tmp_path / "served"))


def test_overrides_change_typed_values(tmp_path):
    config = load_config("default", ["train.steps=7", "meta.enabled=false",
                                     "model.top_units=[16, 4]", f"run_dir={tmp_path}"])
    assert config.train.steps == 7 and config.meta.enabled is False
    assert config.model.top_units == (16, 4)
    assert config.run_dir == str(tmp_path)


def test_the_item_bias_is_a_damping_or_fitted_and_loads_back(tmp_path):
    """``model.prior.item_bias``: a number (a damping, held at the item's damped mean) or
    the word ``fitted``; either survives a dump and load."""
    for given, expected in (("10", 10.0), ("0", 0.0), ("fitted", "fitted"), ("null", None)):
        config = load_config("movielens", [f"model.prior.item_bias={given}"], tuned=False)
        assert config.model.prior.item_bias == expected
        dump_config(config, tmp_path / "config.yaml")
        assert load_config(tmp_path / "config.yaml", tuned=False) == config


def test_numbers_in_exponent_form_without_a_dot_are_numbers(tmp_path):
    """``1e-4`` is a float in a ``--set`` value and in a pipeline file (YAML 1.1 would read
    it as the string '1e-4' and the rate would be refused as not a number)."""
    config = load_config("default", ["train.learning_rate=1e-4", "eval.baseline_lr=2E-2"])
    assert config.train.learning_rate == 1e-4 and config.eval.baseline_lr == 0.02
    path = tmp_path / "p.yaml"
    text = (PIPELINES_DIR / "default.yaml").read_text()
    assert "\n  learning_rate: 0.003\n" in text
    path.write_text(text.replace("\n  learning_rate: 0.003\n", "\n  learning_rate: 3e-3\n"))
    assert load_config(str(path)).train.learning_rate == 3e-3
    assert load_config("default", ["name=1e5x"]).name == "1e5x"   # not a number
    with pytest.raises(ConfigError, match="'train.steps' = 100000.0 is not allowed: expected "
                                          "an integer"):
        load_config("default", ["train.steps=1e5"])
    # a mapping file (data.mapping: FILE, gmeta data csv --mapping) reads them the same way
    from gmeta_tf.data.converters.csv_mapping import CsvMapping
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("task: user_id\nlabel: rating\nlabel_threshold: 4e0\n")
    assert CsvMapping.from_yaml(str(mapping)).label_threshold == 4.0


@pytest.mark.parametrize("override, message", [
    ("train.steps=-5", "config key 'train.steps' = -5 is not allowed: expected an integer >= 1"),
    ("train.steps=ten", "config key 'train.steps' = 'ten' is not allowed: expected an integer"),
    ("train.learning_rate=0", "'train.learning_rate' = 0.0 is not allowed: expected a number > 0"),
    ("meta.algorithm=sgd", "config key 'meta.algorithm' = 'sgd' is not allowed: expected one of "
                           "['maml', 'fomaml', 'reptile']"),
    ("meta.enabled=maybe", "'meta.enabled' = 'maybe' is not allowed: expected true or false"),
    ("train.stepz=3", "config key 'train.stepz' is not allowed: unknown key (did you mean "
     "'steps'?); 'train' allows"),
    ("model.top_units=64", "'model.top_units' = 64 is not allowed: expected a list of integers"),
    ("model.tables.user.optimizer=rmsprop", "'model.tables.user.optimizer' = 'rmsprop' is not "
                                            "allowed: expected one of ['sgd', 'adagrad', 'adam']"),
    ("data.source=hdfs", "'data.source' = 'hdfs' is not allowed: expected one of"),
    ("data.split.warm_fraction=1.5", "'data.split.warm_fraction' = 1.5 is not allowed: expected "
                                     "a number in [0.0, 1.0]"),
    ("meta.adapt_embeddings=[zip]", "'meta.adapt_embeddings' = ['zip'] is not allowed: expected "
                                    "sparse features of the tower"),
    ("model.sparse_features=[user_id, price]", "'model.sparse_features' = ['user_id', 'price'] "
                                               "is not allowed: expected features embedded by "
                                               "a table"),
    ("train=5", "config key 'train' = 5 is not allowed: expected a mapping"),
    ("meta.multi_step_loss=-1", "'meta.multi_step_loss' = -1 is not allowed: expected an "
                                "integer >= 0"),
    ("meta.plain_loss=-0.5", "'meta.plain_loss' = -0.5 is not allowed: expected a number "
                             ">= 0"),
    ("meta.within_task_loss=-1", "'meta.within_task_loss' = -1.0 is not allowed: expected a "
                                 "number >= 0"),
    ("meta.within_task_loss=1", "'meta.within_task_loss' = 1.0 is not allowed: expected 0 "
                                "with a 'binary' head"),
    ("meta.label_shift=-0.5", "'meta.label_shift' = -0.5 is not allowed: expected a number "
                              ">= 0"),
    ("meta.label_shift=0.5", "'meta.label_shift' = 0.5 is not allowed: expected 0 with a "
                             "'binary' head"),
    ("meta.grad_dropout=1", "'meta.grad_dropout' = 1.0 is not allowed: expected a number "
                            "in [0.0, 0.9]"),
    ("meta.grad_dropout=-0.1", "'meta.grad_dropout' = -0.1 is not allowed: expected a number "
                               "in [0.0, 0.9]"),
    ("meta.task_interpolation=1.5", "'meta.task_interpolation' = 1.5 is not allowed: expected "
                                    "a number in [0.0, 1.0]"),
    ("train.pretrain_steps=-5", "'train.pretrain_steps' = -5 is not allowed: expected an "
                                "integer >= 0"),
    ("train.valid_resplits=0", "'train.valid_resplits' = 0 is not allowed: expected an "
                               "integer >= 1"),
    ("train.embedding_l2=-0.1", "'train.embedding_l2' = -0.1 is not allowed: expected a number "
                                ">= 0"),
    ("train.baseline_embedding_l2=x", "'train.baseline_embedding_l2' = 'x' is not allowed: "
                                      "expected a number"),
    ("model.item_factors=true", "'model.item_factors' = True is not allowed: expected false "
                                "unless tower 'melu' with item_features"),
    ("model.prior={feature: item_id, factors: 8}",
     "'model.prior.factors' = 8 is not allowed: expected 0 for tower 'dlrm' with a 'binary' "
     "head"),
    ("model.prior={feature: item_id, factors: -1}", "'model.prior.factors' = -1 is not "
                                                    "allowed: expected an integer >= 0"),
    ("model.prior={feature: item_id, fold_in: 0}", "'model.prior.fold_in' = 0.0 is not "
                                                   "allowed: expected a number > 0"),
    ("model.prior={feature: item_id, blend: 1.5}", "'model.prior.blend' = 1.5 is not "
                                                   "allowed: expected a number in [0.0, 1.0]"),
    ("model.prior={feature: item_id, blend: 0.5}", "'model.prior.blend' = 0.5 is not "
                                                   "allowed: expected None without "
                                                   "model.prior.factors"),
    ("model.prior={feature: item_id, fold_in_prior: flat}",
     "'model.prior.fold_in_prior' = 'flat' is not allowed: expected one of"),
    ("model.prior={feature: item_id, fold_in_prior: empirical}",
     "'model.prior.fold_in_prior' = 'empirical' is not allowed: expected None without "
     "model.prior.factors"),
    ("model.prior={feature: item_id, item_bias: held}",
     "'model.prior.item_bias' = 'held' is not allowed: expected a number or one of "
     "['fitted']"),
    ("model.prior={feature: item_id, item_bias: -1}",
     "'model.prior.item_bias' = -1.0 is not allowed: expected a number >= 0.0"),
    ("model.prior={feature: item_id, item_bias: fitted}",
     "'model.prior.item_bias' = 'fitted' is not allowed: expected None without "
     "model.prior.factors"),
    ("model.prior={feature: item_id, factors_in_output: false}",
     "'model.prior.factors_in_output' = False is not allowed: expected true (the default) "
     "when model.prior.factors is 0"),
    ("model.prior={feature: item_id, factors_in_output: 2}",
     "'model.prior.factors_in_output' = 2 is not allowed"),
])
def test_bad_values_are_rejected_naming_key_value_and_allowed(override, message):
    with pytest.raises(ConfigError) as err:
        load_config("default", [override])
    assert message in str(err.value)


def test_maml_plus_plus_options_reach_the_meta_config():
    config = load_config("default", ["meta.inner_lr_per_step=true", "meta.multi_step_loss=50",
                                     "meta.learn_inner_lr=true"])
    meta = config.meta
    assert isinstance(meta, MetaConfig)  # what MetaModel takes, built by the loader
    assert meta.inner_lr_per_step and meta.multi_step_loss == 50 and meta.learn_inner_lr
    with pytest.raises(ConfigError, match="'meta.multi_step_loss' = 50 is not allowed: "
                                          "expected 0 with algorithm 'reptile'"):
        load_config("default", ["meta.multi_step_loss=50", "meta.algorithm=reptile"])
    with pytest.raises(ConfigError, match="'meta.plain_loss' = 0.3 is not allowed: "
                                          "expected 0 with algorithm 'reptile'"):
        load_config("default", ["meta.plain_loss=0.3", "meta.algorithm=reptile"])
    assert load_config("movielens", tuned=False).meta.plain_loss == 0.3
    with pytest.raises(ConfigError, match="'meta.within_task_loss' = 1.0 is not allowed: "
                                          "expected 0 with algorithm 'reptile'"):
        load_config("movielens", ["meta.within_task_loss=1", "meta.algorithm=reptile",
                                  "meta.multi_step_loss=0", "meta.plain_loss=0"], tuned=False)
    with pytest.raises(ConfigError, match="'meta.within_task_loss' = 1.0 is not allowed: "
                                          "expected 0 with meta.enabled: false"):
        load_config("movielens", ["meta.within_task_loss=1", "meta.enabled=false"],
                    tuned=False)
    assert load_config("movielens", ["meta.within_task_loss=1"],
                       tuned=False).meta.within_task_loss == 1.0


def test_the_loader_builds_the_libraries_own_config_types():
    config = load_config("movielens", ["model.tables.item_id.cache={capacity: 64}"],
                         tuned=False)
    table = config.model.tables["item_id"]
    assert isinstance(table, TableConfig) and isinstance(table.cache, MixCacheConfig)
    assert (table.name, table.dim, table.seed) == ("item_id", config.model.table_dim,
                                                   config.model.seed)
    assert table.optimizer == Adagrad(0.05) and table.cache == MixCacheConfig(64)
    assert isinstance(config.data.split, SplitConfig)
    # the keys given replace the source's protocol; the rest and the seed are its own
    given = load_config("default", ["data.split.query_size=3"]).data.split
    assert given == SplitConfig(query_size=3, min_rows=8)  # synthetic data's min_rows
    assert load_config("default", ["data.seed=7"]).data.split == SplitConfig(
        seed=7, query_size=5, min_rows=8)


def test_a_dumped_config_loads_back_equal(tmp_path):
    for name in ("default", "movielens", "criteo"):
        config = load_config(name, ["model.tables.item.cache={capacity: 64}"]
                             if name == "default" else [], tuned=False)
        dump_config(config, tmp_path / "config.yaml")
        assert load_config(tmp_path / "config.yaml", tuned=False) == config


@pytest.mark.parametrize("override, message", [
    # checked by MixCacheConfig, SplitConfig and TableConfig themselves; named by key
    ("model.tables.item.cache={capacity: 10, min_count: 0}",
     "config key 'model.tables.item.cache.min_count' = 0 is not allowed: expected an "
     "integer >= 1"),
    ("data.split={query_size: 12, min_rows: 12}",
     "config key 'data.split.min_rows' = 12 is not allowed: expected at least query_size + 1"),
    ("model.tables.item.initializer=gauss", "config key 'model.tables.item.initializer' = "
                                            "'gauss' is not allowed: expected one of "
                                            "['zeros', 'uniform', 'normal']"),
    ("model.tables.item.init_scale=-1", "config key 'model.tables.item.init_scale' = -1.0 is "
                                        "not allowed: expected a number >= 0.0"),
    ("model.tables.item.learning_rate=0", "config key 'model.tables.item.learning_rate' = 0.0 "
                                          "is not allowed: expected a number > 0.0"),
    ("model.tables.item.dim=4", "config key 'model.tables.item.dim' is not allowed: "
                                "'model.tables.item' gets it from the pipeline"),
    ("data.split.seed=x", "config key 'data.split.seed' = 'x' is not allowed: expected an "
                          "integer"),
    ("data.split.size=3", "config key 'data.split.size' is not allowed: unknown key"),
])
def test_the_library_types_checks_name_the_config_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config("default", [override])
    assert message in str(err.value)


def test_pretraining_is_for_the_meta_model():
    assert load_config("default", ["train.pretrain_steps=20"]).train.pretrain_steps == 20
    with pytest.raises(ConfigError, match="'train.pretrain_steps' = 20 is not allowed: "
                                          "expected 0 while meta.enabled is false"):
        load_config("default", ["train.pretrain_steps=20", "meta.enabled=false"])


def test_gradient_dropout_is_for_the_meta_model():
    assert load_config("default", ["meta.grad_dropout=0.2"]).meta.grad_dropout == 0.2
    with pytest.raises(ConfigError, match="'meta.grad_dropout' = 0.2 is not allowed: "
                                          "expected 0 with meta.enabled: false"):
        load_config("default", ["meta.grad_dropout=0.2", "meta.enabled=false"])


def test_task_interpolation_is_for_the_meta_model():
    assert load_config("default", ["meta.task_interpolation=0.5"]).meta.task_interpolation == 0.5
    with pytest.raises(ConfigError, match="'meta.task_interpolation' = 0.5 is not allowed: "
                                          "expected 0 with meta.enabled: false"):
        load_config("default", ["meta.task_interpolation=0.5", "meta.enabled=false"])


def test_ridge_adaptation_is_for_a_melu_rating_model():
    config = load_config("movielens", ["meta.ridge=10", "eval.baseline_ridge=0"], tuned=False)
    assert config.meta.ridge == 10.0 and config.eval.baseline_ridge == 0.0
    for key in ("meta.ridge", "eval.baseline_ridge"):  # default: a DLRM with a binary head
        with pytest.raises(ConfigError, match=f"'{key}' = 3.0 is not allowed: expected 0 for "
                                              f"tower 'dlrm' with a 'binary' head"):
            load_config("default", [f"{key}=3"])
    with pytest.raises(ConfigError, match="'meta.ridge' = -1.0 is not allowed: expected a "
                                          "number >= 0.0"):
        load_config("movielens", ["meta.ridge=-1"], tuned=False)
    with pytest.raises(ConfigError, match="'meta.ridge_lr' = 0.0 is not allowed: expected a "
                                          "number > 0"):
        load_config("movielens", ["meta.ridge_lr=0"], tuned=False)


@pytest.mark.parametrize("overrides, scale", [
    (["train.learning_rate=0.001"], 20.0),                          # default ridge_lr 0.02
    (["train.learning_rate=0.001", "meta.ridge_lr=0.005"], 5.0),
    (["train.learning_rate=0.001", "train.optimizer=sgd"], 20.0 ** 0.5),
    (["train.learning_rate=0.001", "meta.ridge_lr=null"], 1.0),     # the outer rate
])
def test_the_ridge_strengths_learn_at_their_own_rate(overrides, scale):
    from gmeta_tf.training.model_builder import ridge_scale
    config = load_config("movielens", overrides, tuned=False)
    assert ridge_scale(config) == pytest.approx(scale)


def test_item_factors_and_embedding_penalties_reach_the_models():
    from gmeta_tf.config import baseline_embedding_l2
    from gmeta_tf.training.model_builder import make_tower
    config = load_config("movielens", ["model.item_factors=true", "train.embedding_l2=0.01"],
                         tuned=False)
    assert make_tower(config.model, "t").item_factors and config.train.embedding_l2 == 0.01
    assert baseline_embedding_l2(config) == 0.01  # the baseline's default: the model's
    own = load_config("movielens", ["train.baseline_embedding_l2=0.1"], tuned=False)
    assert (own.train.embedding_l2, baseline_embedding_l2(own)) == (0.0, 0.1)


def test_the_configured_blend_is_none_without_a_prior_or_a_fixed_weight():
    """Whether a run fixes its blend, asked of one helper: a pipeline without a prior has
    no ``model.prior`` to read a blend from (the Validator once did, and failed)."""
    from gmeta_tf.config import configured_blend
    assert load_config("default", tuned=False).model.prior is None
    assert configured_blend(load_config("default", tuned=False).model) is None
    chosen = load_config("movielens", tuned=False)
    assert chosen.model.prior is not None and configured_blend(chosen.model) is None
    fixed = load_config("movielens", ["model.prior.blend=0.5"], tuned=False)
    assert configured_blend(fixed.model) == 0.5


def test_a_feature_in_two_tables_is_rejected():
    raw = _default_raw()
    raw["model"]["tables"]["item"]["features"].append("user_id")
    with pytest.raises(ConfigError, match="each feature in one table only"):
        from_dict(raw)


def test_bad_override_syntax_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="expected KEY.SUB=VALUE"):
        apply_override({}, "train.steps")
    with pytest.raises(ConfigError, match="'train.steps' is a value, not a section"):
        apply_override({"train": {"steps": 3}}, "train.steps.x=1")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrain: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    message = str(err.value)
    assert message.startswith(f"config file {bad}, line 3, column 1: not valid YAML (while "
                              f"parsing a flow sequence; expected ',' or ']'") and (
        "\n" not in message), message
    with pytest.raises(ConfigError, match="neither a file nor a ready pipeline"):
        load_config("no-such-pipeline")
    twice = tmp_path / "twice.yaml"  # PyYAML alone would keep the later value silently
    twice.write_text("name: x\ntrain:\n  steps: 1000\n  log_every: 5\n  steps: 7\n")
    with pytest.raises(ConfigError, match=rf"config file {twice}, line 5, column 3: not valid "
                                          rf"YAML \(key 'steps' given twice \(first on line 3\)"):
        load_config(twice)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match=rf"config file {empty}: empty \(no key in it\)"):
        load_config(empty)


def test_an_override_with_a_colon_is_text_unless_written_as_a_flow_mapping():
    raw: dict = {}
    for item, want in (("data.mapping.delimiter=::", "::"), ("a.b=x: y", "x: y"),
                       ("a.c={x: 1}", {"x": 1}), ("a.d=[u, v]", ["u", "v"]), ("a.e=3", 3),
                       ("a.f=false", False)):
        apply_override(raw, item)
        node = raw
        for part in item.partition("=")[0].split("."):
            node = node[part]
        assert node == want, item
    config = load_config("ratings", ["data.mapping.delimiter=::", "data.mapping.header=false",
                                     "data.mapping.columns=[user_id,item_id,rating,timestamp]"],
                         tuned=False)
    assert config.data.mapping["delimiter"] == "::"


def test_yaml_is_loaded_safely(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(evil)


def test_cli_exits_2_with_the_message(capsys):
    assert main(["config", "--set", "train.steps=0"]) == 2
    err = capsys.readouterr().err
    assert ("gmeta: error: --set train.steps=0: config key 'train.steps' = 0 is not allowed: "
            "expected an integer >= 1") in err


def test_a_bad_value_names_the_file_and_line_or_the_override_that_set_it(tmp_path):
    """A value refused by the checks is named with where it was set: the config file and
    the line of its key, or the --set override (which wins over the file)."""
    config = tmp_path / "mine.yaml"
    text = (PIPELINES_DIR / "default.yaml").read_text()
    steps = next(t for t in text.splitlines() if t.startswith("  steps: "))
    text = text.replace(f"\ntrain:\n{steps}\n", "\ntrain:\n  steps: -3\n", 1)
    config.write_text(text)
    line = text.splitlines().index("  steps: -3") + 1
    with pytest.raises(ConfigError) as err:
        load_config(config, [f"run_dir={tmp_path}/run"])
    assert str(err.value).startswith(f"config file {config}, line {line}: config key "
                                     f"'train.steps' = -3 is not allowed")
    with pytest.raises(ConfigError) as err:
        load_config(config, [f"run_dir={tmp_path}/run", "train={steps: -4}"])
    assert str(err.value).startswith("--set train={steps: -4}: config key 'train.steps' = -4")


def test_cli_prints_the_checked_config(capsys, tmp_path):
    assert main(["config", "--set", "train.steps=9"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["steps"] == 9 and printed["meta"]["algorithm"] == "maml"
    # a csv pipeline's column mapping is checked too, inline or in its own file
    missing = tmp_path / "missing.yaml"
    assert main(["config", "--config", "ratings", "--set", f"data.mapping={missing}"]) == 2
    assert f"{missing}: cannot read the mapping file" in capsys.readouterr().err
    assert main(["config", "--config", "ratings", "--set", "data.mapping.task=null",
                 "--set", f"run_dir={tmp_path}"]) == 2
    assert "config key 'data.mapping.task' is missing" in capsys.readouterr().err


def test_a_misspelt_key_in_the_file_is_blamed_on_the_file_not_on_tuned_settings(tmp_path):
    """With ``tuned.yaml`` in the run directory setting other keys of the same section, a
    misspelt key of the config file is named at the file's line, with the key it resembles."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "tuned.yaml").write_text(yaml.safe_dump({"train": {"learning_rate": 0.01}}))
    config = tmp_path / "mine.yaml"
    text = (PIPELINES_DIR / "default.yaml").read_text().replace(
        "\ntrain:\n", "\ntrain:\n  learnig_rate: 0.02\n", 1)
    config.write_text(text)
    line = text.splitlines().index("  learnig_rate: 0.02") + 1
    with pytest.raises(ConfigError) as err:
        load_config(config, [f"run_dir={run}"])
    assert str(err.value).startswith(
        f"config file {config}, line {line}: config key 'train.learnig_rate' is not allowed: "
        f"unknown key (did you mean 'learning_rate'?)")
    # a key the tuned settings themselves set is still theirs
    (run / "tuned.yaml").write_text(yaml.safe_dump({"train": {"steps": -1}}))
    with pytest.raises(ConfigError, match=r"^tuned settings .*tuned.yaml: config key "
                                          r"'train.steps' = -1"):
        load_config(PIPELINES_DIR / "default.yaml", [f"run_dir={run}"])


def test_a_setting_edited_after_tuning_is_warned_of_and_the_tuned_value_kept(tmp_path, caplog):
    """``tuned.yaml`` wins over the config file (below any ``--set``): a tuned key the file
    gives another value than when ``gmeta tune`` ran is named in a warning."""
    run = tmp_path / "run"
    run.mkdir()
    text = (PIPELINES_DIR / "default.yaml").read_text()
    own = load_config("default", [f"run_dir={tmp_path / 'other'}"]).model.embedding_dim
    (run / "tuned.yaml").write_text(yaml.safe_dump({
        "model": {"embedding_dim": own + 4},
        "tuned_at": {"world_size": 1, "pipeline": {"model.embedding_dim": own}}}))
    config = tmp_path / "mine.yaml"
    config.write_text(text)
    with caplog.at_level("WARNING", logger="gmeta_tf.config"):
        assert load_config(config, [f"run_dir={run}"]).model.embedding_dim == own + 4
    assert "when gmeta tune ran" not in caplog.text  # not edited: the tuned value, silently
    config.write_text(text.replace(f"embedding_dim: {own}\n", "embedding_dim: 32\n", 1))
    with caplog.at_level("WARNING", logger="gmeta_tf.config"):
        assert load_config(config, [f"run_dir={run}"]).model.embedding_dim == own + 4
    assert f"model.embedding_dim: {own} when tuned, 32 now, {own + 4} used" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="gmeta_tf.config"):
        loaded = load_config(config, [f"run_dir={run}", "model.embedding_dim=16"])
    assert loaded.model.embedding_dim == 16 and "when gmeta tune ran" not in caplog.text


def test_a_mapped_column_no_input_reads_is_warned_of(tmp_path, caplog):
    """A column the csv mapping converts as a feature but no table or dense input reads
    trains nothing: named in a warning with the key that would read it (the task column
    excepted: a new user's id has no trained row)."""
    from gmeta_tf import data as meta_io
    from gmeta_tf.training.config_check import warn_unread_features

    src = tmp_path / "r.csv"
    src.write_text("user_id,item_id,rating,timestamp,hour,genre\n" + "".join(
        f"u{u},{i},{1 + (u + i) % 5},{i},{i % 24},g{i % 3}\n" for u in range(20)
        for i in range(15)))
    mapping = {"task": "user_id", "label": "rating", "label_threshold": 4,
               "sparse": ["item_id", "genre"], "dense": ["hour"], "order_by": "timestamp"}
    meta_io.convert_csv(str(src), str(tmp_path / "data"), mapping,
                        split=meta_io.SplitConfig(query_size=3, min_rows=5))
    config = load_config("ratings", [f"run_dir={tmp_path}/run", f"data.raw={src}",
                                     f"data.path={tmp_path}/data",
                                     "data.mapping.sparse=[item_id, genre]",
                                     "data.mapping.dense=[hour]"])
    with caplog.at_level(logging.WARNING):
        warn_unread_features(config, meta_io.Manifest.load(str(tmp_path / "data")))
    assert "data.mapping's sparse column 'genre' is an input of no model" in caplog.text
    assert "data.mapping's dense column 'hour' is an input of no model" in caplog.text
    assert "{hour: 1}" in caplog.text and "'item_id'" not in caplog.text
    assert "'user_id'" not in caplog.text


def test_a_conflict_a_set_made_is_blamed_on_the_set_too():
    """A key refused because of another key's value names both where they were set: the
    file's line of the one refused, and the --set that gave the other its value."""
    with pytest.raises(ConfigError) as err:
        load_config("criteo", ["model.start_from_linear=false"])
    message = str(err.value)
    assert "config key 'train.linear_margin'" in message and message.startswith("config file")
    assert message.endswith("(model.start_from_linear as --set model.start_from_linear=false "
                            "gives it)")


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["train", "--bogus"],
                                  ["tune", "--trials", "x"]])
def test_help_and_usage_errors_answer_before_tensorflow_is_imported(argv):
    """`gmeta --help` and a mistyped flag answer at once: TensorFlow (seconds to import, and
    its start-up lines) is imported only once the arguments are parsed."""
    import re
    import subprocess
    import sys

    program = ("import sys\nfrom gmeta_tf import cli\ntry:\n    cli.main(sys.argv[1:])\n"
               "except SystemExit as e:\n    code = e.code\n"
               "print('tensorflow imported' if 'tensorflow' in sys.modules else 'no tensorflow', "
               "code, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", program, *argv], capture_output=True,
                            text=True, timeout=60)
    assert result.stderr.splitlines()[-1] == f"no tensorflow {0 if '--help' in argv else 2}", \
        result.stderr
    assert ("usage: gmeta" in result.stdout) if "--help" in argv else \
        re.search(r"^gmeta( \w+)?: error: ", result.stderr, flags=re.M)
