"""``model.prior``: fitted on the training split before step 0 (its damping chosen on the
validation split unless set), saved with the checkpoints, restored (not fitted again) by a
resumed run and by gmeta eval / export."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from gmeta_tf import checkpoint
from gmeta_tf import data as meta_io
from gmeta_tf.config import ConfigError, from_dict, load_config
from gmeta_tf.data.schema import Feature, FeatureKind, Schema
from gmeta_tf.meta import metrics
from gmeta_tf.models.label_prior import PRIOR_INPUT
from gmeta_tf.training.evaluation import task_batches
from gmeta_tf.training import Trainer
from gmeta_tf.training.cold_start import restore_models
from gmeta_tf.training.model_builder import _check_features
from gmeta_tf.training.references import DAMPINGS
from tests.multiprocess import load_ranks, run_ranks
from tests.product.conftest import tiny_overrides


def _rows(data, split, names, query_only=False):
    dataset = meta_io.TaskDataset(str(data), split, rank=0, size=1, features=names)
    names = names if query_only else names + ["task_id"]
    out = {n: [] for n in names}
    batches = dataset.tasks(8, None, None) if query_only else dataset.rows(512)
    for batch in batches:
        rows = batch["query"] if query_only else batch
        real = np.asarray(rows["mask"]) > 0 if query_only else slice(None)
        for n in names:
            out[n].append(np.asarray(rows[n])[real])
    return {n: np.concatenate(v) for n, v in out.items()}


def _expected_prior(data, folds=5):
    """The damped click rate per item on the warm rows, as a logit against the global
    rate, at the damping with the lowest validation log loss; and per fold of tasks
    (task id mod folds) the same on the other folds' rows: computed here apart."""
    train = _rows(data, "warm", ["item_id", "label"])
    valid = _rows(data, "valid", ["item_id", "label"], query_only=True)
    g = train["label"].mean()
    keys = np.unique(train["item_id"])

    def rates(d, ids, rows):
        sums = np.array([train["label"][rows & (train["item_id"] == k)].sum() for k in keys])
        counts = np.array([(rows & (train["item_id"] == k)).sum() for k in keys], float)
        at = np.searchsorted(keys, ids).clip(0, len(keys) - 1)
        known = keys[at] == ids
        return np.where(known, (sums[at] + d * g) / (counts[at] + d), g)

    every = np.ones(len(train["label"]), bool)
    losses = {d: metrics.log_loss(valid["label"], np.clip(rates(d, valid["item_id"], every),
                                                          1e-3, 1 - 1e-3)) for d in DAMPINGS}
    d = min(losses, key=losses.get)
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    fold = train["task_id"] % folds
    out_of_fold = np.stack([logit(rates(d, keys, fold != k)) - logit(g) for k in range(folds)])
    return keys, logit(rates(d, keys, every)) - logit(g), d, out_of_fold


def test_training_fits_the_prior_and_every_later_step_restores_it(tiny_data, tmp_path, caplog):
    overrides = tiny_overrides(tmp_path / "run", tiny_data, steps=4) + [
        "model.prior.feature=item_id"]
    config = load_config("default", overrides)
    with caplog.at_level(logging.INFO, logger="gmeta_tf.training.prior_fit"):
        Trainer(config, fresh=True).run()
    assert "label prior of 'item_id'" in caplog.text
    keys, values, damping, out_of_fold = _expected_prior(tiny_data)
    models, _ = restore_models(config)
    for model in (models.model, models.baseline):  # one prior, read by both towers
        prior = model.tower.prior
        assert prior.fitted and float(prior.damping.numpy()) == damping
        np.testing.assert_array_equal(prior.ids.numpy(), keys)
        np.testing.assert_allclose(prior.values.numpy()[:-1], values, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(prior.fold_values.numpy()[:, :-1], out_of_fold,
                                   rtol=1e-4, atol=1e-5)
        assert not np.allclose(prior.fold_values.numpy()[:, :-1], values)
    assert models.model.tower.prior is models.baseline.tower.prior

    caplog.clear()
    more = load_config("default", overrides + ["train.steps=8"])
    with caplog.at_level(logging.INFO, logger="gmeta_tf.training.prior_fit"):
        Trainer(more, resume=True).run()
    assert "label prior" not in caplog.text  # restored with the checkpoint, not fitted again
    resumed, info = restore_models(more, str(checkpoint.latest(more.checkpoint_dir)))
    assert info["step"] == 8
    np.testing.assert_allclose(resumed.model.tower.prior.values.numpy()[:-1], values,
                               rtol=1e-4, atol=1e-5)


def test_a_set_damping_is_used_as_it_is(tiny_data, tmp_path):
    overrides = tiny_overrides(tmp_path / "run", tiny_data, steps=2) + [
        "model.prior.feature=item_id", "model.prior.damping=7", "train.eval_every=0"]
    config = load_config("default", overrides)
    Trainer(config, fresh=True).run()
    models, _ = restore_models(config)
    assert float(models.model.tower.prior.damping.numpy()) == 7.0


def test_a_prior_on_a_multi_hot_feature_is_refused(tiny_data, tmp_path):
    config = load_config("default", tiny_overrides(tmp_path / "run", tiny_data) + [
        "model.prior.feature=genres"])
    with pytest.raises(ConfigError, match="model.prior.feature.*single-valued sparse"):
        Trainer(config, fresh=True).run()


def test_a_damping_left_to_choose_without_a_validation_split_is_refused(tiny_data, tmp_path):
    config = load_config("default", tiny_overrides(tmp_path / "run", tiny_data) + [
        "model.prior.feature=item_id", "train.validation_split=absent", "train.eval_every=0"])
    with pytest.raises(ConfigError, match="'model.prior.damping' = None is not allowed without "
                                          "a validation split to choose it on .*: set a "
                                          "damping, e.g. 10$"):
        Trainer(config, fresh=True).run()


@pytest.mark.horovod
def test_ranks_fit_the_prior_of_the_whole_split_from_their_shards(tiny_data, tmp_path):
    """Under horovodrun -np 2 each rank reads its shard; the gathered prior is the whole
    split's on both ranks, damping choice included."""
    out = tmp_path / "out"
    out.mkdir()
    run_ranks("tests.product.prior_worker", str(tmp_path / "run"), str(tiny_data), str(out))
    keys, values, damping, out_of_fold = _expected_prior(tiny_data)
    shards = [meta_io.TaskDataset(str(tiny_data), "warm", rank=r, size=2).num_rows
              for r in range(2)]
    assert all(0 < n < sum(shards) for n in shards)  # each rank holds part of the split
    ranks = load_ranks(out, 2)
    for fitted in ranks:
        assert float(fitted["damping"]) == damping
        np.testing.assert_array_equal(fitted["ids"], keys)
        np.testing.assert_allclose(fitted["values"][:-1], values, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(fitted["fold_values"][:, :-1], out_of_fold, rtol=1e-4,
                                   atol=1e-5)
    np.testing.assert_array_equal(ranks[0]["values"], ranks[1]["values"])
    np.testing.assert_array_equal(ranks[0]["fold_values"], ranks[1]["fold_values"])
    np.testing.assert_array_equal(ranks[0]["losses"], ranks[1]["losses"])


def test_a_prior_beside_a_dense_feature_of_its_input_name_is_refused():
    """The towers read the prior as the input ``label_prior``: a dense feature of that
    name would be read in its place."""
    schema = Schema([Feature("item_id", FeatureKind.SPARSE),
                     Feature(PRIOR_INPUT, FeatureKind.DENSE, dim=1),
                     Feature("label", FeatureKind.LABEL)])
    raw = {"model": {"tower": "dlrm", "tables": {"items": {"features": ["item_id"]}},
                     "dense_features": {PRIOR_INPUT: 1}}}
    _check_features(from_dict(raw).model, schema)  # without a prior it is a dense feature
    raw["model"]["prior"] = {"feature": "item_id"}
    with pytest.raises(ConfigError, match=f"model.dense_features.{PRIOR_INPUT}"):
        _check_features(from_dict(raw).model, schema)


@pytest.mark.parametrize("training_query", [4, 2])
def test_held_out_tasks_of_a_latest_rows_protocol_are_scored_on_their_latest_rows(
        tmp_path, training_query):
    """With ``query_selection: last`` the training tasks held out to choose the
    factorisation's settings are scored on their latest rows, the rows the protocol made
    their query rows, as validation and cold tasks are: read back as the references read
    the training split, in whatever order the log held them. Scored tasks keep every
    stored query row whatever ``data.query`` (which caps training batches only), and so
    do the held-out ones."""
    from gmeta_tf.training.prior_fit import _shard_rows, held_out_protocol

    rng = np.random.default_rng(3)
    lines = ["u,i,y,ts"]
    for u in range(40):
        n = int(rng.integers(12, 20))
        lines += [f"{u},{1000 * u + t},{rng.integers(1, 6)},{t}" for t in range(n)]
    order = [lines[0]] + [lines[1 + j] for j in rng.permutation(len(lines) - 1)]
    (tmp_path / "log.csv").write_text("\n".join(order) + "\n")
    out = tmp_path / "ds"
    meta_io.convert_csv(str(tmp_path / "log.csv"), str(out),
                        {"task": "u", "label": "y", "sparse": ["i"], "order_by": "ts"},
                        split=meta_io.SplitConfig(warm_fraction=1.0, valid_fraction=0.3,
                                                  query_size=4, min_rows=8,
                                                  query_selection="last"))
    config = load_config("default", tiny_overrides(tmp_path / "run", out)
                         + [f"data.query={training_query}"])
    protocol = held_out_protocol(config)
    assert protocol.last and protocol.query == 4
    valid = meta_io.TaskDataset(str(out), "valid", rank=0, size=1)
    scored = 0
    for batch in task_batches(config, "valid", equal_steps=False):  # as validation reads
        for ids, mask in zip(np.asarray(batch["query"]["i"]), np.asarray(batch["query"]["mask"])):
            got = np.sort(ids[mask > 0].reshape(-1))
            u = int(got[0]) // 1000
            mine = np.sort([int(x.split(",")[1]) for x in lines[1:] if int(x.split(",")[0]) == u])
            np.testing.assert_array_equal(got, mine[-4:])
            scored += 1
    assert scored == valid.num_tasks > 0
    rows = _shard_rows(config, "warm", ["i", "label"], query_only=False)
    tasks, items = np.asarray(rows["task_id"]), np.asarray(rows["i"])
    folds = protocol.folds_of(tasks, items, np.asarray(rows["label"], np.float64))
    held = 0
    for keep, task, _ in folds:
        for slot, t in enumerate(np.unique(tasks[~keep])):
            mine = np.sort(items[tasks == t])  # item 1000 u + t: time order
            np.testing.assert_array_equal(np.sort(task.query[slot]), mine[-4:])
            np.testing.assert_array_equal(np.sort(task.support[slot][task.mask[slot] > 0]),
                                          mine[:-4])
            held += 1
    assert held + scored == 40


def test_held_out_tasks_are_folded_in_from_all_their_support_rows(tiny_data, tmp_path):
    """The training tasks held out to choose the factorisation's settings are folded in as
    validation and cold tasks are adapted: from every one of their support rows, not the
    training batches' support slots (``data.support``)."""
    from gmeta_tf.training.prior_fit import held_out_protocol

    config = load_config("default", tiny_overrides(tmp_path / "run", tiny_data)
                         + ["data.support=3"])
    protocol = held_out_protocol(config)
    rows = 3 * protocol.min_rows
    valid = meta_io.TaskDataset(str(tiny_data), "valid", rank=0, size=1)
    scored = next(iter(valid.tasks(8, None, None)))
    assert np.asarray(scored["support"]["mask"]).shape[1] > 3  # scored: every support row
    rng = np.random.default_rng(0)
    tasks = np.repeat(np.arange(30), rows)
    folds = protocol.folds_of(tasks, rng.integers(0, 50, tasks.size), rng.random(tasks.size))
    assert folds
    for _, task, _ in folds:
        assert task.mask.shape[1] == rows - protocol.query
        np.testing.assert_array_equal(task.mask.sum(axis=1), rows - protocol.query)
