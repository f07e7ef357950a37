"""LabelPrior: each value's damped mean label, a fixed term of every tower's raw output,
kept as it is while a task's weights adapt."""

import copy

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.meta import MetaConfig, MetaModel, role_batches, task_rows
from gmeta_tf.meta.evaluation import fine_tuned_predictions, fold_in_predictions
from gmeta_tf.meta.task_adapter import initial_ridge
from gmeta_tf.models import CTRModel, DLRMTower, LabelPrior, MeLUTower, RatingHead
from gmeta_tf.models.label_prior import MAX_FACTOR_NORM, PRIOR_INPUT
from gmeta_tf.models.tower import PRIOR_SCALE
from gmeta_tf.training.evaluation import chosen_blend
from gmeta_tf.training.references import FactorModel, FeatureMean
from tests.meta import tiny

DIM = 4


def _fit(prior: LabelPrior, values, labels, damping: float) -> None:
    """As ``training.prior_fit`` fits it: the item-mean reference's damped means."""
    mean = FeatureMean(values, labels, damping)
    prior.set_means(mean.keys, mean(mean.keys), mean.global_mean, damping)


def test_fit_gives_each_value_its_damped_mean_against_the_global_mean():
    values = np.array([7, 7, 7, 3, 9, 9])
    labels = np.array([5.0, 4.0, 3.0, 1.0, 2.0, 3.0])
    prior = LabelPrior("item_id", "rating")
    assert not prior.fitted
    _fit(prior, values, labels, damping=2.0)
    g = labels.mean()
    want = {7: (12 + 2 * g) / 5 - g, 3: (1 + 2 * g) / 3 - g, 9: (5 + 2 * g) / 4 - g}
    out = prior(tf.constant([[9, 3, 42], [7, -1, 7]], tf.int64)).numpy()
    assert out.shape == (2, 3)
    np.testing.assert_allclose(out, [[want[9], want[3], 0.0], [want[7], 0.0, want[7]]],
                               rtol=1e-5, atol=1e-6)  # unknown ids and padding: 0
    assert prior.fitted and float(prior.damping.numpy()) == 2.0


def test_a_binary_prior_is_the_damped_rate_as_a_logit_against_the_global_rate():
    prior = LabelPrior("site", "binary")
    _fit(prior, np.array([1, 1, 1, 1, 2, 2]), np.array([1, 1, 1, 0, 0, 0.0]), damping=1.0)
    g = 0.5
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    np.testing.assert_allclose(prior(tf.constant([1, 2, 3])).numpy(),
                               [logit((3 + g) / 5) - logit(g), logit(g / 3) - logit(g), 0.0],
                               rtol=1e-5)


def test_an_unfitted_prior_is_zero_and_bad_priors_are_refused():
    prior = LabelPrior("item_id", "rating")
    np.testing.assert_array_equal(prior(tf.constant([1, 2])).numpy(), [0.0, 0.0])
    with pytest.raises(ValueError, match="duplicate ids"):
        prior.assign(np.array([1, 1]), np.array([0.1, 0.2]), 1.0)
    with pytest.raises(ValueError, match="non-finite"):
        prior.assign(np.array([1, 2]), np.array([0.1, np.nan]), 1.0)
    with pytest.raises(ValueError, match="no training rows"):
        _fit(prior, np.zeros(0), np.zeros(0), 1.0)
    with pytest.raises(ValueError, match="kind"):
        LabelPrior("item_id", "ranking")


@pytest.mark.parametrize("linear", [False, True])
@pytest.mark.parametrize("make", [
    lambda linear: MeLUTower(["item_id"], ["age"], DIM, hidden_units=(5,), seed=1,
                             linear=linear),
    lambda linear: DLRMTower(["item_id", "age"], DIM, {"price": 1}, bottom_units=(3,),
                             top_units=(5,), seed=2, linear=linear)], ids=["melu", "dlrm"])
def test_a_towers_prior_adds_each_rows_prior_times_its_scale_to_its_raw_output(make, linear):
    plain_tower, tower = make(linear), make(linear)
    prior = LabelPrior("item_id", "rating")
    prior.assign(np.array([1, 2]), np.array([0.5, -1.25]), damping=1.0)
    tower.prior = prior  # before its weights: the prior's scale is one of them
    params = tower.params()
    assert list(params)[-1] == PRIOR_SCALE and float(params[PRIOR_SCALE].numpy()) == 1.0
    assert {n: v.numpy().tolist() for n, v in plain_tower.params().items()} == {
        n: v.numpy().tolist() for n, v in params.items() if n != PRIOR_SCALE}
    rng = np.random.default_rng(0)
    width = tower.input_width
    embedded = {"item_id": rng.normal(size=(2, 3, width)).astype(np.float32),
                "age": rng.normal(size=(2, 3, width)).astype(np.float32)}
    raw = {"item_id": np.array([[1, 2, 5], [2, 2, 8]], np.int64),
           "price": rng.normal(size=(2, 3)).astype(np.float32)}
    plain = plain_tower.apply(plain_tower.params(),
                              {**embedded, **plain_tower.raw_inputs(raw)}).numpy()
    inputs = {**embedded, **tower.raw_inputs(raw)}
    np.testing.assert_allclose(inputs[PRIOR_INPUT], [[0.5, -1.25, 0.0], [-1.25, -1.25, 0.0]])
    np.testing.assert_allclose(tower.apply(params, inputs).numpy() - plain,
                               inputs[PRIOR_INPUT], rtol=1e-5, atol=1e-5)
    # The scale per task (a fast weight [T]) scales each task's rows.
    per_task = {**params, PRIOR_SCALE: tf.constant([2.0, -0.5])}
    np.testing.assert_allclose(tower.apply(per_task, inputs).numpy() - plain,
                               inputs[PRIOR_INPUT] * np.array([[2.0], [-0.5]]),
                               rtol=1e-5, atol=1e-5)


def _zero_tower(tower) -> None:
    for v in tower.params().values():
        v.assign(tf.zeros_like(v))


def test_adaptation_keeps_the_prior_and_learns_each_tasks_offset():
    """With the MLP at zero, a ridge-adapted meta model is the bias model: each user's
    adapted output bias is its mean residual against offset + prior on its support
    ratings, and its query predictions are offset + prior + that bias."""
    batch = tiny.tasks(3, support=6, query=4, seed=2)
    prior = LabelPrior("item_id", "rating")
    items = np.arange(12)
    prior.assign(items, np.linspace(-1.0, 1.0, 12), damping=1.0)
    tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,), seed=3)
    tower.prior = prior
    model = MetaModel(tiny.embedding(), tower, RatingHead("rating", offset=3.0),
                      MetaConfig("maml", inner_steps=1, inner_lr=1e-9, ridge=1e-2))
    assert PRIOR_SCALE in model.adapter.fast_names  # MeLU adapts every weight
    _zero_tower(tower)
    tower.params()[PRIOR_SCALE].assign(1.0)
    model.set_ridge_strengths(1e-2)
    got = model.adapted_predictions(batch).numpy()
    support, query = batch["support"], batch["query"]
    base = lambda role: 3.0 + np.where(role["item_id"] >= 0,  # noqa: E731
                                       np.linspace(-1.0, 1.0, 12)[role["item_id"]], 0.0)
    mask = support["mask"]
    offset = ((support["rating"] - base(support)) * mask).sum(1) / (mask.sum(1) + 1e-2)
    np.testing.assert_allclose(got, base(query) + offset[:, None], rtol=1e-4, atol=1e-4)
    unadapted = model.adapted_predictions(batch, steps=0).numpy()
    np.testing.assert_allclose(unadapted, base(query), rtol=1e-5, atol=1e-5)


def test_a_ctr_model_reads_the_prior_from_the_raw_ids():
    tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,), seed=3)
    prior = LabelPrior("item_id", "rating")
    prior.assign(np.array([4, 6]), np.array([0.75, -0.5]), damping=1.0)
    tower.prior = prior
    model = CTRModel(tiny.embedding(), tower, RatingHead("rating", offset=3.0))
    _zero_tower(tower)
    tower.params()[PRIOR_SCALE].assign(1.0)
    rows = {"item_id": tf.constant([4, 6, 9], tf.int64),
            "user_id": tf.constant([1, 1, 2], tf.int64)}
    np.testing.assert_allclose(model(rows).numpy(), [3.75, 2.5, 3.0], rtol=1e-6)


def test_each_task_adapts_how_much_it_follows_the_prior():
    """The prior's scale as the only fast weight: a user whose ratings are offset + 2 x
    prior is fitted with scale 2; the slow scale stays 1."""
    batch = tiny.tasks(2, support=6, query=4, seed=5)
    priors = np.linspace(-1.0, 1.0, 12)
    for role in ("support", "query"):
        items = batch[role]["item_id"]
        batch[role]["rating"] = np.where(items >= 0, 3.0 + 2.0 * priors[items], 0.0
                                         ).astype(np.float32)
    prior = LabelPrior("item_id", "rating")
    prior.assign(np.arange(12), priors, damping=1.0)
    tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,), seed=3)
    tower.prior = prior
    model = MetaModel(tiny.embedding(), tower, RatingHead("rating", offset=3.0),
                      MetaConfig("maml", inner_steps=60, inner_lr=1.0,
                                 fast_weights=(PRIOR_SCALE,)))
    _zero_tower(tower)
    tower.params()[PRIOR_SCALE].assign(1.0)
    query = batch["query"]
    want = np.where(query["item_id"] >= 0, 3.0 + 2.0 * priors[query["item_id"]], 0.0)
    np.testing.assert_allclose(model.adapted_predictions(batch).numpy(), want, atol=1e-3)
    assert float(tower.params()[PRIOR_SCALE].numpy()) == 1.0


def _folded_prior() -> tuple[LabelPrior, np.ndarray, np.ndarray]:
    """A prior on items 0..11 whose fold k's prior is the whole one + 10 (k + 1)."""
    prior = LabelPrior("item_id", "rating", folds=3)
    whole = np.linspace(-1.0, 1.0, 12)
    folded = whole[None, :] + 10.0 * np.arange(1, 4)[:, None]
    prior.assign(np.arange(12), whole, 1.0, folded)
    return prior, whole, folded


def test_training_rows_read_the_prior_of_the_other_folds_and_other_rows_the_whole_one():
    prior, whole, folded = _folded_prior()
    assert prior.fitted
    ids = tf.constant([[3, 11, 40], [0, 3, -1]], tf.int64)
    tasks = tf.constant([[7], [-2]], tf.int64)  # fold 1 both: 7 mod 3 and -2 mod 3
    np.testing.assert_allclose(prior(ids).numpy(), [[whole[3], whole[11], 0], [whole[0],
                                                     whole[3], 0]], rtol=1e-6)
    np.testing.assert_allclose(prior(ids, tasks).numpy(),
                               [[folded[1, 3], folded[1, 11], 0],
                                [folded[1, 0], folded[1, 3], 0]], rtol=1e-6)
    rows = prior(tf.constant([5, 5, 5]), tf.constant([0, 1, 5])).numpy()  # one task per row
    np.testing.assert_allclose(rows, [folded[0, 5], folded[1, 5], folded[2, 5]], rtol=1e-6)
    with pytest.raises(ValueError, match=r"fold_priors of shape None, expected \(3, 12\)"):
        prior.assign(np.arange(12), whole, 1.0)
    with pytest.raises(ValueError, match="folds=0"):
        LabelPrior("item_id", "rating", folds=0)
    unfolded = LabelPrior("item_id", "rating", folds=3)
    unfolded.ids.assign(np.arange(12))  # as a checkpoint from before folds restores it
    unfolded.damping.assign(1.0)
    assert not unfolded.fitted  # so training fits it again


def test_a_meta_model_and_its_baseline_train_on_out_of_fold_priors_and_score_the_whole():
    prior, whole, folded = _folded_prior()
    batch = tiny.tasks(4, support=6, query=4, seed=7)
    batch["task_id"] = np.array([30, 31, 32, 35], np.int64)  # folds 0, 1, 2, 2
    tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,), seed=3)
    tower.prior = prior
    model = MetaModel(tiny.embedding(), tower, RatingHead("rating", offset=3.0),
                      MetaConfig("maml", inner_steps=1, inner_lr=0.1))
    fold = np.array([0, 1, 2, 2])[:, None]
    for training in (True, False):
        support, query, _ = role_batches(model.embedding, tower, "rating", batch, training)
        for role, got in (("support", support), ("query", query)):
            items = batch[role]["item_id"]
            table = np.where(items >= 0, folded[fold, items] if training else whole[items], 0)
            np.testing.assert_allclose(got.inputs[PRIOR_INPUT].numpy(), table, rtol=1e-6)
    rows = task_rows(batch)  # the baseline's rows carry their tasks
    real = {r: batch[r]["mask"].reshape(-1) > 0 for r in ("support", "query")}
    np.testing.assert_array_equal(rows["task_id"].numpy(), np.concatenate(
        [np.repeat(batch["task_id"], batch[r]["mask"].shape[1])[real[r]]
         for r in ("support", "query")]))
    baseline = CTRModel(tiny.embedding(), tower, RatingHead("rating", offset=3.0))
    items, tasks = rows["item_id"].numpy(), rows["task_id"].numpy()
    np.testing.assert_allclose(
        baseline.tower_inputs(rows, training=True)[PRIOR_INPUT].numpy(),
        np.where(items >= 0, folded[tasks % 3, items], 0), rtol=1e-6)
    np.testing.assert_allclose(baseline.tower_inputs(rows, training=False)[PRIOR_INPUT].numpy(),
                               np.where(items >= 0, whole[items], 0), rtol=1e-6)


def test_a_factor_prior_gives_each_id_its_factors_and_training_rows_their_folds():
    rng = np.random.default_rng(4)
    # factors of RMS norm under MAX_FACTOR_NORM: read as stored (factor_scale 1)
    whole, factors = rng.normal(size=12), 0.5 * rng.normal(size=(12, 2))
    fold_priors, fold_factors = rng.normal(size=(3, 12)), 0.5 * rng.normal(size=(3, 12, 2))
    prior = LabelPrior("item_id", "rating", folds=3, factors=2)
    order = rng.permutation(12)  # any order of ids
    with pytest.raises(ValueError, match=r"factors of shape None, expected \(12, 2\)"):
        prior.assign(order, whole[order], 5.0, fold_priors[:, order])
    with pytest.raises(ValueError, match=r"fold_factors of shape \(12, 2\), expected"):
        prior.assign(order, whole[order], 5.0, fold_priors[:, order], factors[order],
                     factors[order])
    assert not prior.fitted  # a refused assignment changes nothing
    prior.assign(order, whole[order], 5.0, fold_priors[:, order], factors[order],
                 fold_factors[:, order])
    assert prior.fitted
    ids = tf.constant([[3, 11, 40], [0, 3, -1]], tf.int64)
    got = prior.factors_of(ids).numpy()
    assert got.shape == (2, 3, 2)
    np.testing.assert_allclose(got, [[factors[3], factors[11], [0, 0]],
                                     [factors[0], factors[3], [0, 0]]], rtol=1e-6)
    tasks = tf.constant([[7], [5]], tf.int64)  # folds 1 and 2
    np.testing.assert_allclose(prior.factors_of(ids, tasks).numpy(),
                               [[fold_factors[1, 3], fold_factors[1, 11], [0, 0]],
                                [fold_factors[2, 0], fold_factors[2, 3], [0, 0]]], rtol=1e-6)
    np.testing.assert_allclose(prior(ids, tasks).numpy(),
                               [[fold_priors[1, 3], fold_priors[1, 11], 0],
                                [fold_priors[2, 0], fold_priors[2, 3], 0]], rtol=1e-6)
    with pytest.raises(ValueError, match="factors=2 with kind 'binary'"):
        LabelPrior("site", "binary", factors=2)


def test_a_ridge_adapted_melu_reading_factor_priors_is_the_factorisation_fold_in():
    """With the MLP at zero, the ridge-adapted output layer over the prior's item factors
    is the matrix-factorisation reference: each user's bias and factor the ridge fit of
    its support residuals, its query predictions mean + item bias + item factor . user
    factor (``references.FactorModel.fold_in``)."""
    fitted = _fold_in_data(5)
    prior = LabelPrior("item_id", "rating", factors=3)
    prior.assign(fitted.keys, fitted.biases, 3.0, factors=fitted.factors)
    tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,), seed=3)
    tower.prior = prior
    strength = 2.0
    model = MetaModel(tiny.embedding(), tower, RatingHead("rating", offset=fitted.mean),
                      MetaConfig("maml", inner_steps=1, inner_lr=1e-9, ridge=strength))
    kernel, _ = tower.output_layer
    assert tower.params()[kernel].shape == (tiny.HIDDEN + 3, 1)  # hidden, then the factors
    _zero_tower(tower)
    tower.params()[PRIOR_SCALE].assign(1.0)
    model.set_ridge_strengths(strength)
    batch = tiny.tasks(4, support=8, query=4, seed=6)
    support = batch["support"]
    want = fitted.fold_in(support["item_id"], support["rating"], support["mask"],
                          batch["query"]["item_id"], strength)
    real = batch["query"]["mask"] > 0
    np.testing.assert_allclose(model.adapted_predictions(batch).numpy()[real], want[real],
                               rtol=1e-4, atol=1e-4)


def _fold_in_data(seed: int):
    """Ratings of 40 users on 12 items from 3 latent factors, and their factorisation
    (its factors' RMS norm under ``MAX_FACTOR_NORM``, so the tower reads them as fitted)."""
    rng = np.random.default_rng(seed)
    users, items = rng.integers(0, 40, 600), rng.integers(0, 12, 600)
    taste, kind = 0.7 * rng.normal(size=(40, 3)), rng.normal(size=(12, 3))
    ratings = np.clip(3 + (taste[users] * kind[items]).sum(1) + rng.normal(0, .3, 600), 1, 5)
    return FactorModel(users, items, ratings, factors=3, reg=3.0)


def test_the_solve_shrinks_the_factors_and_bias_at_the_priors_fold_in_strength():
    """``initial_ridge``: the weights on the last hidden layer at the ridge strength, the
    weights on the prior's factors and the bias at the fold-in strength chosen with the
    factorisation (its L2 for a prior saved without one). The baseline's solve with the
    MLP at zero is then the factorisation's fold-in at that strength, whatever its ridge
    strength; the meta model starts from the same strengths."""
    fitted = _fold_in_data(5)
    prior = LabelPrior("item_id", "rating", factors=3)
    prior.assign(fitted.keys, fitted.biases, 3.0, factors=fitted.factors, fold_in=0.5)
    tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,), seed=3)
    tower.prior = prior
    baseline = CTRModel(tiny.embedding(), tower, RatingHead("rating", offset=fitted.mean))
    np.testing.assert_allclose(initial_ridge(tower, 30.0)().numpy(),
                               [30.0] * tiny.HIDDEN + [0.5] * 4)
    _zero_tower(tower)
    tower.params()[PRIOR_SCALE].assign(1.0)
    batch = tiny.tasks(4, support=8, query=4, seed=6)
    support, real = batch["support"], batch["query"]["mask"] > 0
    for strength in (0.5, 3.0):
        want = fitted.fold_in(support["item_id"], support["rating"], support["mask"],
                              batch["query"]["item_id"], strength)
        got = fine_tuned_predictions(baseline, 1, 1e-9, ridge=30.0)(batch).numpy()
        np.testing.assert_allclose(got[real], want[real], rtol=1e-4, atol=1e-4)
        prior.fold_in.assign(-1.0)  # saved before the fold-in strength: the L2, 3
    meta = MetaModel(tiny.embedding(), tower, RatingHead("rating", offset=fitted.mean),
                     MetaConfig("maml", inner_steps=1, inner_lr=1e-9, ridge=30.0))
    meta.set_ridge_strengths(initial_ridge(tower, 30.0)().numpy())
    np.testing.assert_allclose(meta.ridge_strengths().numpy(),
                               [30.0] * tiny.HIDDEN + [3.0] * 4, rtol=1e-5)


def test_factors_past_the_norm_cap_are_scaled_down_and_the_fold_in_is_the_same(tmp_path):
    """Factors of RMS norm above ``MAX_FACTOR_NORM`` (a log whose users share one mean
    rating makes the empirical-Bayes fold-in's factors that large) reach the tower scaled
    to that norm, and the strength on their weights rises by the scale squared: the
    fold-in in the graph and the baseline's solve with the MLP at zero are still the
    factorisation's own fold-in of the unscaled factors. Under the cap nothing changes, to
    the bit. The scale is kept with the factors in a checkpoint."""
    fitted = _fold_in_data(5)
    norm = np.sqrt((fitted.factors ** 2).sum(1).mean())
    assert norm < MAX_FACTOR_NORM
    big = copy.copy(fitted)
    big.factors = fitted.factors * (4 * MAX_FACTOR_NORM / norm)
    head = RatingHead("rating", offset=fitted.mean)
    batch = tiny.tasks(4, support=8, query=4, seed=6)
    support, real = batch["support"], batch["query"]["mask"] > 0
    ids = tf.constant(fitted.keys)
    for model, scale in ((fitted, 1.0), (big, 0.25)):
        prior = LabelPrior("item_id", "rating", factors=3)
        prior.assign(model.keys, model.biases, 3.0, factors=model.factors, fold_in=0.5)
        assert float(prior.factor_scale().numpy()) == pytest.approx(scale, rel=1e-5)
        read = prior.factors_of(ids).numpy()
        if scale == 1.0:
            np.testing.assert_array_equal(read, model.factors.astype(np.float32))
        else:
            np.testing.assert_allclose(np.sqrt((read ** 2).sum(1).mean()), MAX_FACTOR_NORM,
                                       rtol=1e-5)
        np.testing.assert_allclose(prior.fold_in_strengths().numpy(),
                                   [0.5 * scale ** 2] * 3 + [0.5], rtol=1e-5)
        # kept in a checkpoint; a prior restored from one without it reads 1 (unscaled)
        path = tf.train.Checkpoint(prior=prior).write(str(tmp_path / f"prior-{scale}"))
        restored = LabelPrior("item_id", "rating", factors=3)
        assert float(restored.factor_scale().numpy()) == 1.0
        tf.train.Checkpoint(prior=restored).read(path).expect_partial()
        assert float(restored.factor_scale().numpy()) == pytest.approx(scale, rel=1e-5)
        tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,), seed=3)
        tower.prior = prior
        np.testing.assert_allclose(initial_ridge(tower, 30.0)().numpy(),
                                   [30.0] * tiny.HIDDEN + [0.5 * scale ** 2] * 3 + [0.5],
                                   rtol=1e-5)
        want = model.fold_in(support["item_id"], support["rating"], support["mask"],
                             batch["query"]["item_id"], 0.5)
        fold_in = fold_in_predictions(tower, head)(batch).numpy()
        np.testing.assert_allclose(fold_in[real], want[real], rtol=1e-4, atol=1e-4)
        _zero_tower(tower)
        tower.params()[PRIOR_SCALE].assign(1.0)
        baseline = CTRModel(tiny.embedding(), tower, head)
        got = fine_tuned_predictions(baseline, 1, 1e-9, ridge=30.0, blended=False)(batch).numpy()
        np.testing.assert_allclose(got[real], want[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("factors_in_output", [True, False])
def test_adapted_outputs_blend_with_the_factorisations_own_fold_in_at_the_towers_weight(
        factors_in_output):
    """``fold_in_predictions`` is the factorisation reference's fold-in at the prior's
    strength, whatever the tower's weights; an adapted model's predictions are ``b *
    adapted + (1 - b) * fold-in`` at the tower's ``prior_blend`` ``b`` (1 until set), the
    meta model's and the fine-tuned baseline's alike; without adaptation nothing is
    blended. With the factors kept out of the output layer, that layer reads the last
    hidden layer alone, the solve shrinks it all at the ridge strength, and the blend is
    still with the fold-in."""
    fitted = _fold_in_data(5)
    prior = LabelPrior("item_id", "rating", factors=3, factors_in_output=factors_in_output)
    prior.assign(fitted.keys, fitted.biases, 3.0, factors=fitted.factors, fold_in=0.5)
    head = RatingHead("rating", offset=fitted.mean)
    batch = tiny.tasks(4, support=8, query=4, seed=6)
    support, real = batch["support"], batch["query"]["mask"] > 0
    want = fitted.fold_in(support["item_id"], support["rating"], support["mask"],
                          batch["query"]["item_id"], 0.5)
    for tower_seed in (3, 4):
        tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,),
                          seed=tower_seed)
        tower.prior = prior
        kernel = tower.params()[tower.output_layer[0]]
        assert kernel.shape[0] == tiny.HIDDEN + (3 if factors_in_output else 0)
        strengths = initial_ridge(tower, 7.0)().numpy()
        np.testing.assert_allclose(strengths[-4:], [0.5] * 4 if factors_in_output else [7.0] * 4)
        assert float(tower.prior_blend.numpy()) == 1.0
        assert all(v is not tower.prior_blend for v in tower.trainable_variables)
        fold_in = fold_in_predictions(tower, head)(batch).numpy()
        np.testing.assert_allclose(fold_in[real], want[real], rtol=1e-4, atol=1e-4)
        meta = MetaModel(tiny.embedding(), tower, head,
                         MetaConfig("maml", inner_steps=2, inner_lr=0.05, ridge=3.0))
        baseline = CTRModel(tiny.embedding(), tower, head)
        for predict in (lambda blended, meta=meta: meta.adapted_predictions(batch, blended=blended),
                        lambda blended, baseline=baseline: fine_tuned_predictions(
                            baseline, 2, 0.05, ridge=3.0, blended=blended)(batch)):
            tower.prior_blend.assign(1.0)
            alone = predict(False).numpy()
            np.testing.assert_allclose(predict(True).numpy(), alone, rtol=1e-6)
            assert np.abs(alone - fold_in)[real].max() > 1e-2
            for blend in (0.0, 0.3):
                tower.prior_blend.assign(blend)
                np.testing.assert_allclose(predict(True).numpy()[real],
                                           (blend * alone + (1 - blend) * fold_in)[real],
                                           rtol=1e-4, atol=1e-4)
        tower.prior_blend.assign(0.3)
        np.testing.assert_allclose(meta.adapted_predictions(batch, steps=0).numpy(),
                                   meta.adapted_predictions(batch, steps=0,
                                                            blended=False).numpy())


def test_the_chosen_blend_is_the_least_squares_weight_moved_toward_half_by_one_se():
    rng = np.random.default_rng(0)
    users, rows = 60, 20
    groups = np.repeat(np.arange(users), rows)
    labels = rng.normal(3.5, 1.0, users * rows)
    # the adapted prediction is the better one; each user's errors share a term
    fold_in = labels + rng.normal(0, 0.9, users * rows) + np.repeat(rng.normal(0, 0.5, users),
                                                                     rows)
    adapted = labels + rng.normal(0, 0.4, users * rows) + np.repeat(rng.normal(0, 0.2, users),
                                                                     rows)
    grid = np.linspace(0, 1, 1001)
    errors = [np.sum((b * adapted + (1 - b) * fold_in - labels) ** 2) for b in grid]
    fitted = grid[int(np.argmin(errors))]
    assert fitted > 0.75
    # the standard error of the fitted weight, by resampling users
    diff, residual = adapted - fold_in, labels - fold_in
    boot = []
    for _ in range(2000):
        pick = np.concatenate([np.flatnonzero(groups == g)
                               for g in rng.integers(0, users, users)])
        boot.append(np.dot(residual[pick], diff[pick]) / np.dot(diff[pick], diff[pick]))
    error = float(np.std(boot))
    chosen = chosen_blend(adapted, fold_in, labels, groups)
    assert 0.5 < chosen < fitted
    assert abs((fitted - chosen) - error) < 0.25 * error
    # treating a user's rows as independent understates the error: moved less
    assert chosen < chosen_blend(adapted, fold_in, labels) < fitted
    # two predictions as good as each other, from a handful of users: an equal mix
    few = groups < 5
    other = labels + rng.normal(0, 0.4, users * rows) + np.repeat(rng.normal(0, 0.2, users),
                                                                  rows)
    assert chosen_blend(adapted[few], other[few], labels[few], groups[few]) == 0.5
    assert chosen_blend(labels, fold_in, labels, groups) == 1.0           # the adapted is exact
    assert chosen_blend(2 * fold_in - labels, fold_in, labels, groups) == 0.0  # -1, clipped
    assert chosen_blend(fold_in, fold_in, labels, groups) == 1.0          # nothing to choose
    diverged = adapted.copy()
    diverged[3] = np.nan
    assert chosen_blend(diverged, fold_in, labels, groups) == 1.0         # not hidden by it
