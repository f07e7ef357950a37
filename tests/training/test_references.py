"""Reference predictors against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from gmeta_tf.meta import metrics
from gmeta_tf.training import references
from gmeta_tf.training.references import (MF_FACTORS_CLICKS, MF_REGS_CLICKS, FeatureMean,
                                          ReferenceData, fit_linear, fit_references)


def _task_batch(items, labels, query_items, query_labels):
    t = len(items)
    return {"task_id": np.arange(t),
            "support": {"item": np.array(items), "y": np.array(labels, np.float32),
                        "mask": np.ones((t, len(items[0])), np.float32)},
            "query": {"item": np.array(query_items), "y": np.array(query_labels, np.float32),
                      "mask": np.ones((t, len(query_items[0])), np.float32)}}


def test_feature_mean_is_damped_towards_the_global_mean():
    values = np.array([1, 1, 1, 2])
    labels = np.array([5.0, 4.0, 3.0, 1.0])
    mean = FeatureMean(values, labels, damping=2.0)
    g = labels.mean()
    np.testing.assert_allclose(mean(np.array([1, 2, 7])),
                               [(12 + 2 * g) / 5, (1 + 2 * g) / 3, g])
    np.testing.assert_allclose(mean.with_damping(0.0)(np.array([1, 2])), [4.0, 1.0])


def test_feature_mean_from_parts_equals_the_mean_of_all_rows():
    """What ranks gather: each part's keys, sums and counts (a key in several parts, a
    part with no rows) merge into the mean of every row."""
    rng = np.random.default_rng(0)
    values, labels = rng.integers(0, 20, 300), rng.normal(3.0, 1.0, 300)
    parts = [FeatureMean(values[a:b], labels[a:b]) for a, b in ((0, 120), (120, 120),
                                                                  (120, 300))]
    merged = FeatureMean.from_sums(np.concatenate([p.keys for p in parts]),
                                   np.concatenate([p.sums for p in parts]),
                                   np.concatenate([p.counts for p in parts]), damping=3.0)
    whole = FeatureMean(values, labels, damping=3.0)
    np.testing.assert_array_equal(merged.keys, whole.keys)
    np.testing.assert_allclose(merged.global_mean, whole.global_mean)
    probe = np.arange(-1, 22)
    np.testing.assert_allclose(merged(probe), whole(probe))


def test_item_mean_plus_task_offset_adds_each_tasks_support_residual():
    # Items 1 and 2 have means 4 and 2 in training; task 0 rates 1 point above them, task 1
    # 1 point below, so the offset model predicts its query ratings exactly (no damping).
    train = [{"item": np.array([1, 1, 2, 2]), "y": np.array([4.0, 4.0, 2.0, 2.0])}]
    valid = [_task_batch([[1, 2], [1, 2]], [[5, 3], [3, 1]], [[2, 1], [1, 2]], [[3, 5], [3, 1]])]
    data = ReferenceData("rating", "y", ("item",), ("item",))
    refs = fit_references(data, train, valid, tasks=True)
    assert refs.chosen["item mean"]["damping"] == 0.0      # exact item means fit best
    assert refs.chosen["item mean + task offset"]["task_damping"] == 0.0
    np.testing.assert_allclose(refs.predictors["item mean + task offset"](valid[0]),
                               [[3.0, 5.0], [3.0, 1.0]])
    np.testing.assert_allclose(refs.predictors["item mean"](valid[0]), [[2.0, 4.0], [4.0, 2.0]])
    np.testing.assert_allclose(refs.predictors["global mean"](valid[0]), np.full((2, 2), 3.0))


def test_the_reference_feature_is_the_candidate_with_the_best_validation_loss():
    rng = np.random.default_rng(0)
    n = 4000
    good, noise = rng.integers(0, 20, n), rng.integers(0, 20, n)
    p = 0.1 + 0.8 * (good % 2)
    y = (rng.random(n) < p).astype(np.float64)
    rows = {"good": good, "noise": noise, "label": y}
    train = [{k: v[:3000] for k, v in rows.items()}]
    valid = [{k: v[3000:] for k, v in rows.items()}]
    data = ReferenceData("binary", "label", ("noise", "good"), ("noise", "good"))
    refs = fit_references(data, train, valid, tasks=False)
    assert "good mean" in refs.predictors and "noise mean" not in refs.predictors
    auc = metrics.auc(valid[0]["label"], refs.predictors["good mean"](valid[0]))
    assert auc > 0.85
    lr = metrics.auc(valid[0]["label"], refs.predictors["logistic regression"](valid[0]))
    assert lr > 0.85


def test_logistic_regression_of_an_ensemble_is_the_mean_of_as_many_seeded_fits():
    """With ``members`` (the model's ensemble size) the reference is averaged as the
    model is: the mean of fits seeded ``seed``, ``seed + 1000``, ..."""
    rng = np.random.default_rng(2)
    n = 3000
    a, c = rng.integers(0, 40, n), rng.integers(0, 40, n)
    y = (rng.random(n) < np.where((a + c) % 3 == 0, 0.7, 0.2)).astype(np.float64)
    rows = {"a": a, "c": c, "y": y}
    train = [{k: v[:2500] for k, v in rows.items()}]
    valid = [{k: v[2500:] for k, v in rows.items()}]
    data = ReferenceData("binary", "y", ("a", "c"), ("a", "c"))
    refs = fit_references(data, train, valid, tasks=False, seed=3, members=3)
    fits = [fit_linear(data, train[0], valid[0], seed=s)[0] for s in (3, 1003, 2003)]
    expected = np.mean([f.predict_rows(valid[0]) for f in fits], axis=0)
    np.testing.assert_allclose(refs.predictors["logistic regression"](valid[0]), expected)
    assert len(refs.chosen["logistic regression"]["fits"]) == 3
    assert not np.allclose(fits[0].predict_rows(valid[0]), fits[1].predict_rows(valid[0]))


def test_logistic_regression_learns_a_linear_rule_and_stops_on_validation():
    rng = np.random.default_rng(1)
    n = 6000
    a, b = rng.integers(0, 50, n), rng.normal(size=n)
    logit = np.where(a < 25, 1.5, -1.5) + 2.0 * b
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    data = ReferenceData("binary", "y", ("a",), ("a",), ("b",))
    train = {"a": a[:5000], "b": b[:5000].astype(np.float32), "y": y[:5000]}
    valid = {"a": a[5000:], "b": b[5000:].astype(np.float32), "y": y[5000:]}
    model, chosen = fit_linear(data, train, valid)
    p = model.predict_rows(valid)
    assert metrics.auc(valid["y"], p) > 0.85
    assert 1 <= chosen["epochs"] <= 10 and chosen["l2"] > 0
    # Better than the label rate: it learned the rule, not the prior.
    rate = np.full(1000, y.mean())
    assert metrics.log_loss(valid["y"], p) < metrics.log_loss(valid["y"], rate) - 0.1


@pytest.mark.parametrize("kind", ["rating", "binary"])
def test_references_refuse_an_empty_training_split(kind):
    data = ReferenceData(kind, "y", ("item",), ("item",))
    with pytest.raises(ValueError, match="no rows"):
        fit_references(data, [], [], tasks=False)


def test_factorisation_fold_in_learns_the_tasks_tastes_the_offset_model_cannot():
    """Ratings ``3 + u_t . v_i`` with two taste groups: the item mean and a task's offset
    miss the taste, the factorisation's fold-in of a new task's support rows finds it.
    Rows carry their task (as the training split's row batches do)."""
    rng = np.random.default_rng(0)
    items = np.arange(40)
    v = rng.choice([-1.0, 1.0], size=(40, 2))
    def ratings(u, it):
        return 3.0 + v[it] @ u
    tasks, rated, ys = [], [], []
    for t in range(120):
        u = np.array([1.0, 0.0]) if t % 2 else np.array([0.0, 1.0])
        seen = rng.choice(items, 20, replace=False)
        tasks += [t] * 20
        rated += list(seen)
        ys += list(ratings(u, seen))
    train = [{"task_id": np.array(tasks), "item": np.array(rated), "y": np.array(ys)}]

    def batch(users):
        support, query = [], []
        for _ in users:
            seen = rng.choice(items, 14, replace=False)
            support.append(seen[:10])
            query.append(seen[10:])
        support, query = np.array(support), np.array(query)
        su = np.array([ratings(u, s) for u, s in zip(users, support)])
        qu = np.array([ratings(u, q) for u, q in zip(users, query)])
        return _task_batch(support, su, query, qu)

    groups = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    valid = [batch([groups[i % 2] for i in range(8)])]
    test = batch([groups[i % 2] for i in range(8)])
    data = ReferenceData("rating", "y", ("item",), ("item",))
    refs = fit_references(data, train, valid, tasks=True)
    name = "matrix factorisation fold-in"
    assert set(refs.chosen[name]) == {"factors", "reg", "item_bias", "fold_in",
                                      "fold_in_prior"}
    truth = test["query"]["y"]
    mf = np.abs(refs.predictors[name](test) - truth).mean()
    offset = np.abs(refs.predictors["item mean + task offset"](test) - truth).mean()
    assert mf < 0.25 and mf < 0.5 * offset
    # Without task ids on the training rows there is no such reference.
    plain = fit_references(data, [{k: w for k, w in train[0].items() if k != "task_id"}],
                           valid, tasks=True)
    assert name not in plain.predictors


def _two_taste_ratings(rng, v, tasks: int, rows: int):
    """Ratings ``3 + u_t . v_i`` of the items ``v [40, 2]``, every task of one of two
    tastes: the tasks' factors lie on one line, so one rating of a new task tells its taste
    to a fold-in that knows it (the empirical prior) and not to one shrinking every
    direction alike."""
    groups = np.array([[1.0, 0.0], [0.0, 1.0]])
    task_ids = np.repeat(np.arange(tasks), rows)
    items = np.concatenate([rng.choice(40, rows, replace=False) for _ in range(tasks)])
    ratings = 3.0 + np.sum(v[items] * groups[task_ids % 2], axis=1)
    return task_ids, items, ratings


def test_item_biases_held_at_damped_means_with_the_factors_fitted_around_them():
    """``item_bias=d``: each item's bias is its damped mean residual, exactly, whatever
    the factors do; the factors and task biases are fitted on what it leaves (they explain
    the tastes: the training rows' error falls well below the biases' alone)."""
    from gmeta_tf.training.references import FactorModel

    rng = np.random.default_rng(3)
    tasks, items, ratings = _two_taste_ratings(rng, rng.choice([-1.0, 1.0], (40, 2)), 80, 15)
    ratings = ratings + 0.5 * (items % 3) - 0.5
    held = FactorModel(tasks, items, ratings, factors=3, reg=3.0, item_bias=10.0)
    residual = ratings - ratings.mean()
    keys, of = np.unique(items, return_inverse=True)
    np.testing.assert_array_equal(held.keys, keys)
    np.testing.assert_allclose(held.biases, np.bincount(of, residual) / (np.bincount(of) + 10.0),
                               rtol=1e-12)
    fitted = FactorModel(tasks, items, ratings, factors=3, reg=3.0)
    assert not np.allclose(fitted.biases, held.biases, atol=1e-3)
    # the training tasks folded in from their own rows: the factors carry their tastes
    task_rows = [np.flatnonzero(tasks == t) for t in range(80)]
    fold = np.concatenate([held.fold_in(items[r][None], ratings[r][None], np.ones((1, 15)),
                                        items[r][None], 1.0)[0] for r in task_rows])
    order = np.concatenate(task_rows)
    biases_alone = held.mean + held.item(items)[1]
    assert (np.abs(fold - ratings[order]).mean()
            < 0.5 * np.abs(biases_alone - ratings).mean())


def test_the_empirical_fold_in_is_the_bayes_fit_under_the_training_tasks_moments():
    """``with_fold_in_prior("empirical")``: the isotropic ridge on its re-expressed items is
    the fit of a new task's bias and factor under the prior ``N(mean, covariance)`` of the
    training tasks' fitted ones (bias and factor independent, at the bias' variance),
    computed here directly; an item not in training gets the typical task's bias."""
    from gmeta_tf.training.references import FactorModel

    rng = np.random.default_rng(1)
    tasks, items, ratings = _two_taste_ratings(rng, rng.choice([-1.0, 1.0], (40, 2)), 80, 15)
    iso = FactorModel(tasks, items, ratings + rng.normal(0, 0.3, len(ratings)), factors=3,
                      reg=3.0)
    emp = iso.with_fold_in_prior("empirical")
    assert iso.with_fold_in_prior("isotropic") is iso and emp.fold_in_prior == "empirical"
    with pytest.raises(ValueError, match="prior='flat'"):
        iso.with_fold_in_prior("flat")
    mean_p, cov_p, mean_b, var_b = iso._task_moments
    support, labels = np.array([[1, 2, 3]]), np.array([[4.0, 2.0, 5.0]])
    query, strength = np.array([[5, 6, 7, 99]]), 2.0  # 99: not in training
    q, b = iso.item(support[0])
    x = np.hstack([q, np.ones((3, 1))])
    scaled = cov_p / var_b
    precision = np.zeros((4, 4))
    precision[:3, :3] = np.linalg.inv(scaled + 1e-6 * np.trace(scaled) / 3 * np.eye(3))
    precision[3, 3] = 1.0
    prior_mean = np.append(mean_p, mean_b)
    fit = np.linalg.solve(x.T @ x + strength * precision,
                          x.T @ (labels[0] - iso.mean - b) + strength * precision @ prior_mean)
    qq, bq = iso.item(query[0])
    want = iso.mean + bq + np.hstack([qq, np.ones((4, 1))]) @ fit
    got = emp.fold_in(support, labels, np.ones((1, 3)), query, strength)[0]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert emp.item(np.array([99]))[1][0] == mean_b != 0.0


def test_the_reference_folds_in_under_the_prior_validation_chooses():
    """Two tastes, new tasks with two support ratings: the empirical prior's fold-in
    knows a task's taste from them where the isotropic one barely moves, and validation
    chooses it for the reference."""
    from gmeta_tf.training.references import FactorModel

    rng = np.random.default_rng(2)
    v = rng.choice([-1.0, 1.0], (40, 2))
    tasks, items, ratings = _two_taste_ratings(rng, v, 160, 20)
    train = [{"task_id": tasks, "item": items, "y": ratings}]

    def batch(n: int):
        _, it, y = _two_taste_ratings(rng, v, n, 6)
        it, y = it.reshape(n, 6), y.reshape(n, 6)
        return _task_batch(it[:, :2], y[:, :2], it[:, 2:], y[:, 2:])

    valid, test = [batch(40)], batch(200)
    data = ReferenceData("rating", "y", ("item",), ("item",))
    refs = fit_references(data, train, valid, tasks=True)
    name = "matrix factorisation fold-in"
    chosen = refs.chosen[name]
    assert chosen["fold_in_prior"] == "empirical"
    truth = test["query"]["y"]
    mae = np.abs(refs.predictors[name](test) - truth).mean()
    iso = FactorModel(tasks, items, ratings, factors=chosen["factors"], reg=chosen["reg"])
    support = test["support"]
    iso_mae = min(np.abs(np.clip(iso.fold_in(support["item"], support["y"], support["mask"],
                                             test["query"]["item"], s), 1, 5) - truth).mean()
                  for s in (0.3, 1.0, 3.0, 10.0, 30.0))  # its best strength, on test itself
    assert mae < 0.85 * iso_mae


def test_factorisation_fold_in_of_clicks_ranks_by_the_tasks_tastes():
    """Clicks of two taste groups (click rate 0.9 where the item suits the group, 0.1
    where not): the item's click rate and a task's offset rank a new task's items at
    chance, the fold-in of its support clicks ranks them by its taste. Its predictions
    are probabilities, its settings chosen by log loss from the clicks' grid."""
    rng = np.random.default_rng(0)
    items = np.arange(40)
    v = rng.choice([-1.0, 1.0], size=40)  # each item suits one group

    def clicks(u, it):
        return (rng.random(len(it)) < np.where(v[it] * u > 0, 0.9, 0.1)).astype(np.float64)
    groups = [1.0, -1.0]
    tasks, seen_items, ys = [], [], []
    for t in range(200):
        seen = rng.choice(items, 20, replace=False)
        tasks += [t] * 20
        seen_items += list(seen)
        ys += list(clicks(groups[t % 2], seen))
    train = [{"task_id": np.array(tasks), "item": np.array(seen_items), "y": np.array(ys)}]

    def batch(n):
        support, query, su, qu = [], [], [], []
        for i in range(n):
            seen = rng.choice(items, 16, replace=False)
            support.append(seen[:12])
            query.append(seen[12:])
            su.append(clicks(groups[i % 2], seen[:12]))
            qu.append(clicks(groups[i % 2], seen[12:]))
        return _task_batch(support, su, query, qu)

    valid, test = [batch(40)], batch(200)
    data = ReferenceData("binary", "y", ("item",), ("item",))
    refs = fit_references(data, train, valid, tasks=True)
    name = "matrix factorisation fold-in"
    assert refs.chosen[name]["reg"] in MF_REGS_CLICKS
    assert refs.chosen[name]["factors"] in MF_FACTORS_CLICKS
    truth = test["query"]["y"].ravel()
    mf = refs.predictors[name](test).ravel()
    assert ((mf > 0) & (mf < 1)).all()
    offset = refs.predictors["item mean + task offset"](test).ravel()
    assert metrics.auc(truth, mf) > 0.8 > metrics.auc(truth, offset) + 0.15


def test_the_batched_least_squares_solve_each_groups_own_ridge_fit(monkeypatch):
    """The factorisation's half-step solves groups of alike sizes as one padded batch:
    each group's answer is still the ridge fit of its own rows, for groups of one row,
    of none, of sizes that are and are not powers of two, and for batches cut short."""
    monkeypatch.setattr(references, "_BATCH_ROWS", 64)  # several batches per size, and a
    rng = np.random.default_rng(0)                       # group wider than a batch
    sizes = np.array([1, 0, 2, 3, 4, 5, 8, 9, 17, 100, 1, 7, 33, 3])
    key_of_row = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    factors, targets = rng.normal(size=(len(key_of_row), 3)), rng.normal(size=len(key_of_row))
    penalty = 2.0 * np.eye(4)
    got_factors, got_biases = references._ridge_per_group(
        references._Groups.of(key_of_row, len(sizes)), factors, targets, penalty)
    for g in range(len(sizes)):
        rows = np.flatnonzero(key_of_row == g)
        x = np.hstack([factors[rows], np.ones((len(rows), 1))])
        want = np.linalg.solve(x.T @ x + penalty, x.T @ targets[rows])
        np.testing.assert_allclose(got_factors[g], want[:-1], atol=1e-12)
        np.testing.assert_allclose(got_biases[g], want[-1], atol=1e-12)
    assert not got_factors[1].any() and got_biases[1] == 0.0  # no rows: the prior's 0


def _rated(rng, tasks: int, low: int, high: int):
    """Rows of ``tasks`` tasks, each of ``low``..``high`` distinct items of 60."""
    sizes = rng.integers(low, high + 1, tasks)
    task_ids = np.repeat(np.arange(tasks) * 7 + 3, sizes)
    items = np.concatenate([rng.choice(60, n, replace=False) for n in sizes])
    return task_ids, items, rng.integers(1, 6, len(items)).astype(np.float64)


def _valid_tasks(rng, tasks: int, support: int, query: int):
    """A validation split of ``tasks`` tasks of random ratings of items of 60, as the
    fold-in reads it, and its query rows' labels."""
    from gmeta_tf.training.references import FoldInTask

    task = FoldInTask(rng.integers(0, 60, (tasks, support)), rng.integers(0, 60, (tasks, query)),
                      rng.integers(1, 6, (tasks, support)).astype(np.float64),
                      np.ones((tasks, support)), np.ones((tasks, query), bool))
    return task, rng.integers(1, 6, tasks * query).astype(np.float64)


def _small_factorisation(tasks, items, labels, sweeps: int, fits: list | None = None):
    """``held_out_grid``'s ``fit``: a two-factor factorisation of the rows ``rows`` keeps
    (None: every row) at the L2 ``setting``; each call appends to ``fits`` (if given)
    whether it fitted every row."""
    from gmeta_tf.training.references import FactorModel

    def fit(rows, setting):
        if fits is not None:
            fits.append(rows is None)
        rows = slice(None) if rows is None else rows
        return FactorModel(tasks[rows], items[rows], labels[rows], factors=2, reg=setting,
                           sweeps=sweeps)
    return fit


def test_held_out_folds_hold_each_task_of_the_protocols_size_out_once_as_validation_is():
    """Every task of ``min_rows``..``max_rows`` rows is held out in exactly one fold, with
    ``query`` of its rows to score and at most ``support`` others to fold in from; the fold
    is fitted on every other row; the same rows are chosen whatever order they come in."""
    from gmeta_tf.training.references import HeldOutProtocol

    rng = np.random.default_rng(0)
    tasks, items, labels = _rated(rng, 90, 8, 40)
    protocol = HeldOutProtocol(query=4, support=20, min_rows=10, max_rows=35, folds=3)
    folds = protocol.folds_of(tasks, items, labels)
    assert len(folds) == 3
    sizes = dict(zip(*np.unique(tasks, return_counts=True)))
    held = []
    for keep, task, query_labels in folds:
        out = np.unique(tasks[~keep])
        held += list(out)
        assert task.real.shape == (len(out), 4) and task.real.all()
        assert len(query_labels) == 4 * len(out)
        for t, slot in zip(out, range(len(out))):
            assert 10 <= sizes[t] <= 35
            support = task.support[slot][task.mask[slot] > 0]
            assert len(support) == min(20, sizes[t] - 4)
            rated = set(items[tasks == t])  # support and query: the task's own, apart
            assert set(support) | set(task.query[slot]) <= rated
            assert not set(support) & set(task.query[slot])
            by_item = dict(zip(items[tasks == t], labels[tasks == t]))
            np.testing.assert_array_equal(task.labels[slot][task.mask[slot] > 0],
                                          [by_item[i] for i in support])
    assert sorted(held) == sorted(t for t, n in sizes.items() if 10 <= n <= 35)
    assert len(held) == len(set(held))  # once each
    shuffled = rng.permutation(len(tasks))
    again = protocol.folds_of(tasks[shuffled], items[shuffled], labels[shuffled])
    for (keep, task, query_labels), (keep2, task2, query_labels2) in zip(folds, again):
        np.testing.assert_array_equal(keep[shuffled], keep2)
        np.testing.assert_array_equal(task.query, task2.query)
        np.testing.assert_array_equal(task.support, task2.support)
        np.testing.assert_array_equal(query_labels, query_labels2)
    assert HeldOutProtocol(query=4, support=20, min_rows=10, folds=1).folds_of(
        tasks, items, labels) == []


def test_held_out_grid_pools_each_folds_query_rows_with_the_validation_splits():
    """Each setting's loss is the mean over the validation query rows and every held-out
    fold's, each fold scored on a factorisation fitted without it; the models returned are
    the fits of every row."""
    from gmeta_tf.training.references import (HeldOutProtocol, factorisations, fold_in_grid,
                                              held_out_grid)

    rng = np.random.default_rng(1)
    tasks, items, labels = _rated(rng, 60, 12, 30)
    fit = _small_factorisation(tasks, items, labels, sweeps=2)
    valid, valid_labels = _valid_tasks(rng, 5, 6, 3)
    folds = HeldOutProtocol(query=3, support=10, min_rows=12, folds=2).folds_of(
        tasks, items, labels)
    losses, models, rows = held_out_grid(fit, [(3.0, "isotropic"), (30.0, "isotropic")],
                                         [1.0, 10.0], [valid], valid_labels, folds)
    assert rows == 15 + sum(len(q) for _, _, q in folds)
    for key, loss in losses.items():
        (reg, prior), strength = key
        parts = [fold_in_grid(factorisations(lambda s, k=keep: fit(k, s)), [(reg, prior)],
                              [strength], [task], q)[0][key] * len(q)
                 for keep, task, q in [(None, valid, valid_labels), *folds]]
        assert loss == pytest.approx(sum(parts) / rows, rel=1e-12)
    np.testing.assert_allclose(models[(3.0, "isotropic")].factors, fit(None, 3.0).factors)


def test_a_validation_split_large_enough_chooses_alone(monkeypatch):
    """From ``MF_HELD_OUT_BELOW_ROWS`` validation query rows on, ``folds_beside`` gives no
    held-out fold, so none is fitted and the losses are the validation split's alone;
    below it, every fold of ``folds_of``."""
    from gmeta_tf.training.references import HeldOutProtocol, held_out_grid

    rng = np.random.default_rng(3)
    tasks, items, labels = _rated(rng, 40, 12, 20)
    fits = []
    fit = _small_factorisation(tasks, items, labels, sweeps=1, fits=fits)
    valid, valid_labels = _valid_tasks(rng, 4, 5, 3)
    protocol = HeldOutProtocol(query=3, support=10, min_rows=12, folds=2)
    monkeypatch.setattr(references, "MF_HELD_OUT_BELOW_ROWS", 12)
    none = protocol.folds_beside(12, tasks, items, labels)
    assert none == []
    alone, _, rows = held_out_grid(fit, [(3.0, "isotropic")], [1.0], [valid], valid_labels,
                                   none)
    assert rows == 12 and all(fits)
    monkeypatch.setattr(references, "MF_HELD_OUT_BELOW_ROWS", 13)
    folds = protocol.folds_beside(12, tasks, items, labels)
    expected = protocol.folds_of(tasks, items, labels)
    assert len(folds) == len(expected) == 2
    for (keep, task, q), (keep_e, task_e, q_e) in zip(folds, expected):
        np.testing.assert_array_equal(keep, keep_e)
        np.testing.assert_array_equal(task.query, task_e.query)
        np.testing.assert_array_equal(q, q_e)
    pooled, _, rows = held_out_grid(fit, [(3.0, "isotropic")], [1.0], [valid], valid_labels,
                                    folds)
    assert rows > 12 and not all(fits) and pooled != alone


def test_the_mean_references_choose_their_dampings_on_validation_pooled_with_held_out_tasks():
    """Of task data the item mean's damping, and the item mean + task offset's two dampings
    together, are each the first of least loss over the validation query rows and every
    held-out fold's, each fold's item means taken without its tasks' rows."""
    from gmeta_tf.training.references import DAMPINGS, HeldOutProtocol

    rng = np.random.default_rng(4)
    tasks, items, labels = _rated(rng, 60, 12, 30)
    labels += np.repeat(rng.normal(0.0, 1.0, 60), np.unique(tasks, return_counts=True)[1])
    train = [{"task_id": tasks, "item": items, "y": labels}]
    valid, valid_labels = _valid_tasks(rng, 6, 8, 3)
    batch = _task_batch(valid.support, valid.labels, valid.query,
                        valid_labels.reshape(6, 3))
    protocol = HeldOutProtocol(query=3, support=10, min_rows=12, folds=3)
    data = ReferenceData("rating", "y", ("item",), ("item",))
    refs = fit_references(data, train, [batch], tasks=True, held_out=protocol)

    def predict(keep, task, d, d_task):  # by hand, row by row
        mean = FeatureMean(items[keep], labels[keep], damping=d)
        out = []
        for support, support_labels, query in zip(task.support, task.labels, task.query):
            offset = (0.0 if d_task is None else
                      (support_labels - mean(support)).sum() / (len(support) + d_task))
            out += list(mean(query) + offset)
        return np.array(out)

    folds = protocol.folds_of(tasks, items, labels)
    everything = np.ones(len(labels), bool)
    loss = {}
    for d in DAMPINGS:
        for d_task in (None, *DAMPINGS):
            errors = [np.abs(predict(keep, task, d, d_task) - q)
                      for keep, task, q in [(everything, valid, valid_labels), *folds]]
            loss[(d, d_task)] = np.concatenate(errors).mean()
    assert len(np.concatenate(errors)) > 3  # the folds hold tasks out
    alone = min((k for k in loss if k[1] is None), key=loss.get)
    both = min((k for k in loss if k[1] is not None), key=loss.get)
    assert refs.chosen["item mean"] == {"damping": alone[0]}
    assert refs.chosen["item mean + task offset"] == {"damping": both[0],
                                                      "task_damping": both[1]}
    np.testing.assert_allclose(refs.predictors["item mean + task offset"](batch).reshape(-1),
                               predict(everything, valid, *both))
    pooled = references.mean_offset_grid(
        FeatureMean(items, labels), lambda keep: FeatureMean(items[keep], labels[keep]),
        [valid], valid_labels, folds)
    assert pooled == pytest.approx(loss, rel=1e-12)
    valid_alone = references.mean_offset_grid(FeatureMean(items, labels), None, [valid],
                                              valid_labels, [])
    assert min((k for k in valid_alone if k[1] is not None), key=valid_alone.get) != both
