"""The README's "Your own data" section, walked as written on small CSV files made here:
ratings + items (joined) -> meta pipeline on 2 ranks -> eval -> export -> a fresh process
serving the SavedModel (both signatures, the adapting one with its ridge-solved output
layer) as the trained model predicts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
import tensorflow as tf

from gmeta_tf import data as meta_io
from gmeta_tf.data import hashing
from tests.product.conftest import served, served_and_expected, task_rows
from tests.product.own_data import (config_in, readme_block,
                                    run_readme_commands,
                                    walk_readme_example,
                                    write_ratings)


@pytest.fixture(scope="module")
def ratings_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("own_ratings")
    rows = write_ratings(work)
    config, results = walk_readme_example(work, "# my_ratings.yaml")
    return work, rows, config, results


def test_every_rating_row_is_in_the_dataset_with_its_items_genres(ratings_run):
    work, rows, config, _ = ratings_run
    manifest = meta_io.Manifest.load(config.data.path)
    assert sum(f.rows for f in manifest.files) == rows  # no user below min_rows: none lost
    assert manifest.split["rows_without_join_match"] == 0
    items = pacsv.read_csv(work / "items.csv",
                           convert_options=pacsv.ConvertOptions(column_types={
                               "item_id": pa.int64(), "genres": pa.string()}))
    expected, _ = hashing.to_slots(items.column("genres"), "genres", "|", 3)
    by_item = dict(zip(items.column("item_id").to_pylist(), expected))
    for entry in manifest.files:
        table = meta_io.TaskDataset(config.data.path, entry.split, rank=0, size=1,
                                    verify="checksum")
        for batch in table.rows(4096):
            genres = batch["genres"].numpy()
            want = np.stack([by_item[int(i)] for i in batch["item_id"].numpy()])
            np.testing.assert_array_equal(genres, want)
            assert (genres[:, 0] != meta_io.PAD_ID).all()  # every item has a genre


def test_training_ran_on_two_ranks_and_eval_compares_with_the_baseline(ratings_run):
    _, _, config, _ = ratings_run
    summary = json.loads(Path(config.run_dir, "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 6
    result = json.loads(Path(config.run_dir, "eval", "cold.json").read_text())
    names = [r["name"] for r in result["rows"]]
    assert names[0].startswith("meta (maml") and any(n.startswith("baseline") for n in names)
    assert "reference: matrix factorisation fold-in" in names  # ratings of tasks
    for row in result["rows"]:
        assert 0.0 <= row["auc"] <= 1.0 and row["mae"] > 0 and row["tasks"] > 0
    # Under the factor prior each model's blend with its fold-in was chosen on validation:
    # the table names it and scores the unblended predictions beside (unless it is 1).
    from gmeta_tf.training.selection import best_checkpoints

    best = best_checkpoints(config.checkpoint_dir)
    baseline = next(n for n in names if n.startswith("baseline fine-tuned"))
    for name, short, chosen in ((names[0], "meta", best["model"]["metrics"]["blend"]),
                                (baseline, "baseline", best["baseline"]["metrics"]["blend"])):
        assert name.endswith(f", blend {chosen:.2f})"), (name, chosen)
        unblended = f"{short}, not blended with the fold-in"
        assert (unblended in names) == (chosen != 1.0), names


def test_each_models_blend_is_chosen_on_validation_and_kept_with_its_checkpoint(ratings_run):
    from gmeta_tf.training.cold_start import restore_models
    from gmeta_tf.training.selection import best_checkpoints

    _, _, config, results = ratings_run
    best = best_checkpoints(config.checkpoint_dir)
    models, _ = restore_models(config)
    for name, model in (("model", models.model), ("baseline", models.baseline)):
        chosen = best[name]["metrics"]["blend"]
        assert 0.0 <= chosen <= 1.0 and 0.0 <= best[name]["metrics"]["blended_auc"] <= 1.0
        assert best[name]["value"] == best[name]["metrics"]["auc"]  # chosen unblended
        assert float(model.tower.prior_blend.numpy()) == pytest.approx(chosen, abs=1e-6)
    train_log = next(r.stderr + r.stdout for r in results if "validation (" in r.stderr + r.stdout)
    assert "blend " in train_log


def test_a_factor_prior_left_to_choose_without_a_validation_split_is_refused(ratings_run):
    import dataclasses

    from gmeta_tf.config import ConfigError
    from gmeta_tf.models.label_prior import LabelPrior
    from gmeta_tf.training.prior_fit import fit_prior

    work, _, config, _ = ratings_run
    # the settings gmeta tune chose (tuned.yaml) unset again, as before a tune
    unset = dataclasses.replace(config.model.prior, damping=None, item_bias=None,
                                fold_in=None, fold_in_prior=None)
    config = dataclasses.replace(
        config, train=dataclasses.replace(config.train, validation_split="absent"),
        model=dataclasses.replace(config.model, prior=unset))
    section = config.model.prior
    prior = LabelPrior(section.feature, "rating", folds=section.folds, factors=section.factors)
    cwd = Path.cwd()
    os.chdir(work)
    try:
        with pytest.raises(ConfigError, match=(
                "'model.prior.damping' = None is not allowed without a validation split to "
                "choose the factorisation's L2, item bias, fold-in strength and fold-in prior "
                "on .*: set model.prior.damping, model.prior.item_bias, model.prior.fold_in "
                "and model.prior.fold_in_prior, e.g. 10, fitted, 3 and empirical$")):
            fit_prior(prior, config)
    finally:
        os.chdir(cwd)


def test_a_blend_set_in_the_config_is_used_as_it_is_not_chosen(ratings_run):
    import dataclasses

    from gmeta_tf.training.cold_start import restore_models
    from gmeta_tf.training.evaluation import Validator

    _, _, config, _ = ratings_run
    prior = dataclasses.replace(config.model.prior, blend=0.25)
    fixed = dataclasses.replace(config, model=dataclasses.replace(config.model, prior=prior))
    models, _ = restore_models(fixed)  # over the checkpoint's chosen blend
    towers = [models.model.tower, models.baseline.tower]
    assert [float(t.prior_blend.numpy()) for t in towers] == [0.25, 0.25]
    validator = Validator(models, fixed)
    assert set(validator.blended) == {"model", "baseline"}
    results = validator()
    assert [results[name]["blend"] for name in ("model", "baseline")] == [0.25, 0.25]
    assert [float(t.prior_blend.numpy()) for t in towers] == [0.25, 0.25]
    # chosen on the model's own predictions, as with a fitted blend: the validator scores
    # them unblended and blends them itself
    unblended = Validator(models, config)()
    assert results["model"]["auc"] == pytest.approx(unblended["model"]["auc"], abs=1e-9)
    assert results["model"]["blended_auc"] != pytest.approx(results["model"]["auc"], abs=1e-6)


def test_validation_scores_an_undone_task_unadapted_and_unblended_as_it_is_served(ratings_run):
    """A validation task whose fine-tuning diverges (its support ratings poisoned) is scored
    as ``gmeta eval`` scores it and the SavedModel serves it: its unadapted outputs, not
    blended with the fold-in; the blend is chosen on the other tasks' rows alone."""

    from gmeta_tf.meta import metrics
    from gmeta_tf.meta.evaluation import fold_in_predictions
    from gmeta_tf.training.cold_start import restore_models
    from gmeta_tf.training.evaluation import (Validator, chosen_blend, fine_tune_adaptation,
                                              fine_tune_predict)

    _, _, config, _ = ratings_run
    models, _ = restore_models(config)
    validator = Validator(models, config)
    assert "baseline" in validator.blended
    splits = validator._load()
    for batches in splits:  # the same user in every split: the first of the first batch
        batch = batches[0][0]
        support = dict(batch["support"], rating=batch["support"]["rating"].numpy().copy())
        support["rating"][0] *= 1e30
        batches[0] = ({**batch, "support": support}, batches[0][1])
    validator._batches = splits
    results = validator()["baseline"]
    label, binary, _ = validator.labels

    adaptation = fine_tune_adaptation(models.baseline, config)
    unadapted = fine_tune_predict(models.baseline, config, 0)  # no steps: nothing blended
    fold_in = fold_in_predictions(models.baseline.tower, models.baseline.head)
    rows = {"unblended": [], "kept": [], "fold_in": [], "unadapted": [], "label": [],
            "binary": [], "task": []}
    for batches in splits:
        per = {k: [] for k in rows}
        for batch, real in batches:
            if not real:
                continue
            mask = batch["query"]["mask"].numpy() > 0
            out = adaptation(batch)
            per["unblended"].append(out["unblended"].numpy()[mask])
            per["kept"].append(out["kept"].numpy()[mask] > 0.5)
            per["fold_in"].append(fold_in(batch).numpy()[mask])
            per["unadapted"].append(unadapted(batch).numpy()[mask])
            per["label"].append(batch["query"][label].numpy()[mask])
            per["binary"].append(batch["query"][binary].numpy()[mask])
            per["task"].append(np.broadcast_to(batch["task_id"].numpy()[:, None],
                                               mask.shape)[mask])
        for k in rows:
            rows[k].append(np.concatenate(per[k]))
    for kept, unblended, unadapted_rows in zip(rows["kept"], rows["unblended"],
                                               rows["unadapted"]):
        assert 0 < kept.sum() < len(kept)  # the poisoned user, and only it, was undone
        # the same outputs, by two graphs (float32 rounding may differ in the last bit)
        np.testing.assert_allclose(unblended[~kept], unadapted_rows[~kept], rtol=1e-6)
    kept_all = np.concatenate(rows["kept"])
    blend = chosen_blend(*(np.concatenate(rows[k])[kept_all]
                           for k in ("unblended", "fold_in", "label", "task")))
    assert results["blend"] == pytest.approx(blend, abs=1e-9)
    aucs = [metrics.auc(b, np.where(k, blend * u + (1 - blend) * f, u))
            for b, k, u, f in zip(rows["binary"], rows["kept"], rows["unblended"],
                                  rows["fold_in"])]
    assert results["blended_auc"] == pytest.approx(np.mean(aucs), abs=1e-9)
    everywhere = [metrics.auc(b, blend * u + (1 - blend) * f)  # the undone rows blended too
                  for b, u, f in zip(rows["binary"], rows["unblended"], rows["fold_in"])]
    assert results["blended_auc"] != pytest.approx(np.mean(everywhere), abs=1e-6)


def test_the_exported_model_serves_in_a_fresh_process_as_trained(ratings_run, tmp_path):
    from gmeta_tf.training.cold_start import restore_models

    _, _, config, _ = ratings_run
    models, info = restore_models(config)
    model = models.model
    assert model.ridge_variable is not None  # the README's pipeline solves the output layer
    prior = model.tower.prior  # and adds each item's prior: served from the SavedModel too
    assert prior.fitted and int(np.count_nonzero(prior.values.numpy())) > 10
    batch = next(iter(meta_io.read_tasks(config.data.path, 2, None, None, split="cold")))
    # The export is of the checkpoint chosen on validation, as restore_models restores.
    exported, = Path(config.export.dir).iterdir()
    assert exported.name == str(info["step"])
    out, expected, expected_adapted = served_and_expected(model, batch, exported, tmp_path)
    np.testing.assert_allclose(out["serve"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["adapt"], expected_adapted, rtol=1e-5, atol=1e-5)
    # a support rating outside the mapping's label_range is refused, naming the input
    export_info = json.loads((exported / "assets.extra" / "gmeta_export.json").read_text())
    assert export_info["support_label_range"] == [1.0, 5.0]
    loaded = tf.saved_model.load(str(exported))
    features = model.tower.feature_names
    support = {k: v for k, v in task_rows(batch, "support", 0).items()
               if k in (*features, "rating")}
    query = {k: v for k, v in task_rows(batch, "query", 0).items() if k in features}
    support["rating"] = support["rating"].astype(np.float32)
    support["rating"][-1] = 7.0
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input support_rating holds a label outside \[1, 5\]"):
        loaded.signatures["adapt"](**{f"support_{k}": tf.constant(v)
                                      for k, v in support.items()},
                                   **{f"query_{k}": tf.constant(v) for k, v in query.items()})


def test_the_factor_prior_is_the_factorisation_of_every_ranks_warm_rows(ratings_run):
    """Each rank read its shard of the warm split; the prior (rank 0's, as saved) is the
    factorisation of all of them, at the L2 chosen on validation."""
    from gmeta_tf.data.schema import TASK_COLUMN
    from gmeta_tf.training.cold_start import restore_models
    from gmeta_tf.training.references import (FOLD_IN_PRIORS, MF_FOLD_IN, MF_ITEM_BIASES,
                                              MF_REGS, FactorModel, rows_of)

    _, _, config, _ = ratings_run
    prior = restore_models(config)[0].model.tower.prior
    assert prior.factors == config.model.prior.factors > 0
    reg = float(prior.damping.numpy())
    assert reg in MF_REGS  # chosen on the validation split, with the fold-in strength
    assert float(prior.fold_in_strength().numpy()) in MF_FOLD_IN
    rows = rows_of(meta_io.TaskDataset(config.data.path, "warm", rank=0, size=1).rows(4096),
                   ["item_id", "rating", TASK_COLUMN])
    # the items fitted with the item bias and under the fold-in prior chosen with them
    fitted, = [m for bias in MF_ITEM_BIASES
               for m in map(FactorModel(rows[TASK_COLUMN], rows["item_id"], rows["rating"],
                                        factors=prior.factors, reg=reg,
                                        item_bias=bias).with_fold_in_prior, FOLD_IN_PRIORS)
               if np.allclose(prior.values.numpy()[:-1], m.biases, atol=1e-4)]
    np.testing.assert_array_equal(prior.ids.numpy(), fitted.keys)
    np.testing.assert_allclose(prior.values.numpy()[-1], fitted.unknown_bias, atol=1e-6)
    np.testing.assert_allclose(prior.factor_rows.numpy()[:-1], fitted.factors, atol=1e-4)
    assert np.abs(fitted.factors).max() > 1e-3  # factors, not zeros
    folded = prior.fold_factor_rows.numpy()
    assert folded.shape[0] == config.model.prior.folds and not np.allclose(folded[0], folded[1])


@pytest.fixture(scope="module")
def clicks_run(tmp_path_factory):
    """The README's click-log example: its steps are one pass over every rank's share of
    the warm rows (so every row is trained on), everything else as written."""
    from tests.product.own_data import write_clicks

    work = tmp_path_factory.mktemp("own_clicks")
    rows = write_clicks(work / "clicks.csv", rows=3000, seed=0, sites=200)
    test_rows = write_clicks(work / "clicks_test.csv", rows=700, seed=1, sites=200)
    (work / "my_clicks.yaml").write_text(readme_block("# my_clicks.yaml"))
    cwd = Path.cwd()
    os.chdir(work)  # prepare_dataset reads the raw file's relative path
    try:
        from gmeta_tf.training import prepare_dataset

        config = config_in(work, "my_clicks.yaml")
        manifest = prepare_dataset(config, world_size=2)  # what train --np 2 does first
        shares = [meta_io.TaskDataset(config.data.path, "warm", rank=r, size=2).num_rows
                  for r in range(2)]
    finally:
        os.chdir(cwd)
    epoch = -(-max(shares) // config.data.batch_size)
    one_pass = ["--set", f"train.steps={epoch}", "--set", "train.eval_every=4",
                "--set", "train.checkpoint_every=4", "--set", "train.log_every=4"]
    results = run_readme_commands(work, "# my_clicks.yaml", one_pass)
    return work, rows, test_rows, manifest, shares, epoch, config, results


def test_plain_ctr_trains_on_every_warm_row_and_scores_every_test_row(clicks_run):
    work, rows, test_rows, manifest, shares, epoch, config, _ = clicks_run
    splits = {s: sum(f.rows for f in manifest.files_of(s)) for s in ("warm", "valid")}
    assert splits["warm"] + splits["valid"] == rows  # nothing dropped, no cold split
    assert 0.07 * rows <= splits["valid"] <= 0.13 * rows  # a tenth of the rows: no task
    assert sum(shares) == splits["warm"] and min(shares) > 0
    summary = json.loads(Path(work, "runs/my_clicks/train_summary.json").read_text())
    assert summary["world_size"] == 2
    # one pass over the larger share: each rank read all of its rows (the smaller share
    # wraps around into its next epoch)
    assert summary["samples"] >= splits["warm"]
    assert summary["samples"] <= 2 * epoch * config.data.batch_size
    result = json.loads(Path(work, "runs/my_clicks/eval/clicks_test.json").read_text())
    model_row = result["rows"][0]
    assert model_row["rows"] == test_rows  # every row of the test file scored
    assert 0.0 <= model_row["auc"] <= 1.0
    assert Path(work, "runs/my_clicks/export").is_dir()


def test_the_click_example_starts_at_the_linear_model_and_validates_it_first(clicks_run):
    """The example's DLRM starts at the logistic regression reference (the rows' linear
    column, the deep part's last layer zeroed) and is validated before its first step, so
    the linear model itself is a checkpoint the run may keep."""
    work, *_, results = clicks_run
    train = next(r for r in results if r.args[1] == "train")
    out = train.stdout + train.stderr
    assert "start_from_linear: the model starts at the linear model" in out
    assert "step 0 validation (valid split" in out, out[-3000:]


def test_clicks_features_share_a_table_but_not_rows(clicks_run):
    from gmeta_tf.training.cold_start import restore_models

    work, *_ = clicks_run
    models, _ = restore_models(config_in(work, "my_clicks.yaml"))
    embedding = models.model.embedding
    salts = {f.name: f.id_salt for f in embedding.feature_configs}
    assert len(set(salts.values())) == 4 and 0 not in salts.values()
    one = tf.constant([1], tf.int64)  # device_type=1 and banner_pos=1 both occur
    out = embedding({n: one for n in salts}, training=False)
    assert not np.allclose(out["device_type"].numpy(), out["banner_pos"].numpy())


def test_the_exported_click_model_serves_in_a_fresh_process_as_trained(clicks_run, tmp_path):
    """Whatever the click example's tower (an ensemble of ``model.members`` towers, each
    reading its slice of the rows), the SavedModel scores rows as the restored model."""
    from gmeta_tf.training.cold_start import restore_models
    from gmeta_tf.training.evaluation import row_batches

    work, *_ = clicks_run
    config = config_in(work, "my_clicks.yaml")
    models, info = restore_models(config)
    batch = next(iter(row_batches(config, config.train.validation_split)))
    model = models.model
    assert model.members == config.model.members
    features = model.tower.feature_names
    expected = model({k: batch[k] for k in features}).numpy()
    exported, = Path(config.export.dir).iterdir()
    assert exported.name == str(info["step"])
    out = served(exported, {f"serve/{k}": np.asarray(batch[k]) for k in features}, tmp_path)
    np.testing.assert_allclose(out["serve"], expected, rtol=1e-5, atol=1e-6)
