"""MetaModel behaviour: configuration errors, padding, serving, Keras fit on Meta-IO data."""

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf import data
from gmeta_tf.meta import (MetaConfig, evaluate_tasks, fine_tuned_adaptation,
                           fine_tuned_predictions, task_rows)
from gmeta_tf.meta.evaluation import traced_once
from gmeta_tf.models import CTRModel, MeLUTower
from tests.meta import tiny

HIDDEN_PLUS_ITEMS = tiny.HIDDEN + tiny.DIM  # the output layer's inputs with item_factors


@pytest.mark.parametrize("kwargs, message", [
    ({"inner_steps": 0}, "inner_steps = 0 is not allowed: expected an integer >= 1"),
    ({"inner_steps": 1.5}, "inner_steps = 1.5 is not allowed: expected an integer"),
    ({"algorithm": "protonet"}, "algorithm = 'protonet' is not allowed: expected one of"),
    ({"inner_lr": -0.1}, r"inner_lr = -0.1 is not allowed: expected a number > 0"),
])
def test_bad_config_names_the_key_and_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MetaConfig(**kwargs)


def test_unknown_fast_weights_or_embedding_feature_are_named():
    with pytest.raises(ValueError, match="selector 'top' matches no weight"):
        tiny.model(MetaConfig(fast_weights=("top",)))
    with pytest.raises(ValueError, match=r"adapt_embeddings \['genres'\] are not sparse"):
        tiny.model(MetaConfig(adapt_embeddings=("genres",)))


def test_batch_missing_a_feature_is_named():
    model = tiny.model(MetaConfig())
    batch = tiny.tasks(2)
    del batch["query"]["rating"]
    with pytest.raises(KeyError, match=r"role 'query' lacks \['rating'\]"):
        model.meta_gradients(batch)


def test_padding_rows_change_nothing():
    batch = tiny.tasks(3, seed=4)
    padded = {"task_id": batch["task_id"], **{r: {} for r in ("support", "query")}}
    for role in ("support", "query"):
        for k, v in batch[role].items():
            extra = np.full((3, 2, *v.shape[2:]), 7 if k != "mask" else 0, v.dtype)
            padded[role][k] = np.concatenate([v, extra], axis=1)
    grads = []
    for b in (batch, padded):
        model = tiny.model(MetaConfig("maml", inner_steps=2, inner_lr=0.2))
        grads.append([g.numpy() for g in model.meta_gradients(b)[2]])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("ridge", [0.0, 3.0])
def test_serving_adapts_one_task_like_the_batched_evaluation(ridge):
    model = tiny.model(MetaConfig("maml", inner_steps=3, inner_lr=0.2, ridge=ridge,
                                  adapt_embeddings=("item_id",)), multi_hot=True)
    batch = tiny.tasks(3, seed=8, multi_hot=True)
    for role in ("support", "query"):  # no padding: serve() takes real rows only
        batch[role]["mask"][:] = 1.0
        batch[role]["item_id"][batch[role]["item_id"] < 0] = 5
    model.meta_gradients(batch)  # insert and train a little
    batched = model.adapted_predictions(batch).numpy()
    unadapted = model.adapted_predictions(batch, steps=0).numpy()
    t = 1
    support = {k: v[t] for k, v in batch["support"].items() if k != "mask"}
    query = {k: v[t] for k, v in batch["query"].items() if k not in ("mask", "rating")}
    np.testing.assert_allclose(model.serve(support, query).numpy(), batched[t], rtol=1e-5)
    assert np.abs(batched - unadapted).max() > 1e-4  # adaptation changed the predictions


def test_meta_sgd_learns_the_inner_rates():
    model = tiny.model(MetaConfig("maml", inner_steps=1, inner_lr=0.1, learn_inner_lr=True))
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05))
    for s in range(3):
        model.train_step(tiny.tasks(4, seed=s))
    rates = [float(v.numpy()) for v in model.inner_lr_variables.values()]
    assert len(rates) == 4 and any(abs(r - 0.1) > 1e-5 for r in rates)


def test_meta_sgd_per_element_learns_one_rate_per_weight_element():
    config = MetaConfig("maml", inner_steps=1, inner_lr=0.1, learn_inner_lr=True,
                        inner_lr_per_element=True, adapt_embeddings=("user_id",))
    model = tiny.model(config)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05))
    for s in range(3):
        model.train_step(tiny.tasks(4, seed=s))
    params = model.tower.params()
    for name, rate in model.inner_lr_variables.items():
        expected = [tiny.DIM] if name.startswith("embedding/") else params[name].shape.as_list()
        assert rate.shape.as_list() == expected, name
    kernel = model.inner_lr_variables["mlp/0/kernel"].numpy()
    assert np.unique(np.round(kernel, 7)).size > 1  # the elements moved apart


def test_per_step_rates_shape_and_adapting_past_k_reuses_the_last_step():
    config = MetaConfig("maml", inner_steps=2, inner_lr=0.1, learn_inner_lr=True,
                        inner_lr_per_step=True, inner_lr_per_element=True)
    model = tiny.model(config)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05))
    batch = tiny.tasks(4, seed=3)
    model.train_step(batch)
    params = model.tower.params()
    for name, rate in model.inner_lr_variables.items():
        assert rate.shape.as_list() == [2] + params[name].shape.as_list(), name
    # Three steps: steps 0 and 1 at their own rates, step 2 at step 1's rates again.
    for rate in model.inner_lr_variables.values():
        rate.assign(tf.stack([rate[0] * 0.0, rate[1]]))
    two = model.adapted_predictions(batch, steps=2).numpy()
    one = model.adapted_predictions(batch, steps=1).numpy()
    three = model.adapted_predictions(batch, steps=3).numpy()
    np.testing.assert_allclose(one, model.adapted_predictions(batch, 0).numpy(),
                               rtol=1e-6)  # step 0's rates are zero
    assert np.abs(three - two).max() > 1e-6  # the third step moved at step 1's rates


def test_multi_step_loss_anneals_from_every_step_to_the_last():
    """MAML++'s multi-step loss: at outer step 0 the mean of the query losses after steps 1
    and 2 (each equal to a 1- and a 2-step model's loss), after the annealing the last's."""
    batch = tiny.tasks(3, seed=4)

    def query_loss(steps, multi_step_loss=0, iterations=0, pretrained=0):
        model = tiny.model(MetaConfig("maml", inner_steps=steps, inner_lr=0.2,
                                      multi_step_loss=multi_step_loss))
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1))
        model.optimizer.iterations.assign(iterations)
        model.pretrained_steps = pretrained
        return float(model.meta_loss(batch)[0])

    one, two = query_loss(1), query_loss(2)
    assert abs(one - two) > 1e-4
    np.testing.assert_allclose(query_loss(2, 4, 0), (one + two) / 2, rtol=1e-5)
    np.testing.assert_allclose(query_loss(2, 4, 2), 0.25 * one + 0.75 * two, rtol=1e-5)
    np.testing.assert_allclose(query_loss(2, 4, 9), two, rtol=1e-5)
    # Pre-training's optimizer steps do not count: the anneal starts at the first meta step.
    np.testing.assert_allclose(query_loss(2, 4, 9, pretrained=9), (one + two) / 2, rtol=1e-5)
    np.testing.assert_allclose(query_loss(2, 4, 11, pretrained=9), 0.25 * one + 0.75 * two,
                               rtol=1e-5)
    with pytest.raises(ValueError, match="multi_step_loss"):
        MetaConfig("reptile", multi_step_loss=10)
    with pytest.raises(ValueError, match="multi_step_loss = -1 is not allowed"):
        MetaConfig("maml", multi_step_loss=-1)


@pytest.mark.parametrize("config", [
    MetaConfig("maml", inner_steps=2, inner_lr=0.1, learn_inner_lr=True, inner_lr_per_step=True,
               multi_step_loss=4, adapt_embeddings=("user_id",)),
    MetaConfig("reptile", inner_steps=2, inner_lr=0.1)], ids=["maml++", "reptile"])
def test_the_step_traced_without_autograph_trains_what_autograph_traced(config, monkeypatch):
    """The library traces its steps with AutoGraph off (``gmeta_tf.graph_function``): its
    code has no Python control flow on tensors for AutoGraph to convert, so the meta step
    and the baseline's step it traces train the weights AutoGraph's graph trains."""
    from gmeta_tf import graph_function

    def trained(autograph):
        monkeypatch.setattr(graph_function, "AUTOGRAPH", autograph)
        model = tiny.model(config)
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05))
        baseline = CTRModel(tiny.embedding(), MeLUTower(["item_id"], ["user_id"], tiny.DIM,
                                                         hidden_units=(tiny.HIDDEN,), seed=3),
                            model.head)
        baseline.compile(optimizer=tf.keras.optimizers.SGD(0.05))
        meta_step = graph_function.graph_function(model.train_step, reduce_retracing=True)
        baseline_step = graph_function.graph_function(
            lambda batch: baseline.train_step(task_rows(batch)), reduce_retracing=True)
        losses = [(float(meta_step(tiny.tasks(4, seed=s))["loss"]),
                   float(baseline_step(tiny.tasks(4, seed=s))["loss"])) for s in range(3)]
        weights = [v.numpy() for v in model.trainable_variables + baseline.trainable_variables]
        return losses, weights

    (losses_on, weights_on), (losses_off, weights_off) = trained(True), trained(False)
    np.testing.assert_array_equal(losses_off, losses_on)
    assert len(weights_off) == len(weights_on) > 0
    for off, on in zip(weights_off, weights_on):
        np.testing.assert_array_equal(off, on)
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):  # what it does not convert
        graph_function.graph_function(lambda x: x if x > 0 else -x)(tf.constant(1.0))


def test_fine_tuning_adapts_the_task_embedding_rows():
    model = tiny.model(MetaConfig())
    baseline = CTRModel(model.embedding, model.tower, model.head)
    batch = tiny.tasks(3, seed=2)
    model.meta_gradients(batch)  # insert the ids
    rows_only = fine_tuned_predictions(baseline, 2, 0.2, fast_weights=("mlp/0/bias",),
                                       adapted_embeddings=("user_id",))(batch).numpy()
    bias_only = fine_tuned_predictions(baseline, 2, 0.2, fast_weights=("mlp/0/bias",))(batch)
    assert np.abs(rows_only - bias_only.numpy()).max() > 1e-5


def test_prediction_is_traced_once_for_batches_of_every_shape():
    """Evaluation batches differ in task count and in support and query width; the
    predict function is traced at the first and gives the eager predictions on all."""
    model = tiny.model(MetaConfig("maml", inner_steps=2, inner_lr=0.2), multi_hot=True)
    traces = []

    def adapted(batch):
        traces.append(1)  # Python runs only while tracing
        return model.adapted_predictions(batch)

    predict = traced_once(adapted)
    for num_tasks, support, query in ((3, 6, 4), (2, 9, 5), (5, 4, 7), (1, 6, 4)):
        batch = tiny.tasks(num_tasks, support, query, seed=support, multi_hot=True)
        model.meta_gradients(batch)  # insert the ids
        np.testing.assert_allclose(predict(batch).numpy(),
                                   model.adapted_predictions(batch).numpy(), rtol=1e-5, atol=1e-6)
    assert len(traces) == 1


def test_the_baseline_is_ridge_fitted_as_the_meta_model_adapts():
    """With the same tower, rows and strength, fine-tuning with ``ridge`` gives the meta
    model's adapted predictions (one code path), which differ from the SGD steps alone;
    after the solve, the support loss is at most the SGD steps' (the solve minimises it
    plus a penalty that is zero at the slow output layer)."""
    model = tiny.model(MetaConfig("maml", inner_steps=2, inner_lr=0.2, ridge=0.5))
    baseline = CTRModel(model.embedding, model.tower, model.head)
    batch = tiny.tasks(4, seed=6)
    model.meta_gradients(batch)  # insert the ids
    meta = model.adapted_predictions(batch).numpy()
    ridge = fine_tuned_predictions(baseline, 2, 0.2, ridge=0.5)(batch).numpy()
    sgd = fine_tuned_predictions(baseline, 2, 0.2)(batch).numpy()
    np.testing.assert_allclose(ridge, meta, rtol=1e-5, atol=1e-6)
    assert np.abs(ridge - sgd).max() > 1e-3
    support_as_query = {**batch, "query": batch["support"]}
    fitted = fine_tuned_predictions(baseline, 2, 0.2, ridge=1e-2)(support_as_query).numpy()
    stepped = fine_tuned_predictions(baseline, 2, 0.2)(support_as_query).numpy()
    real = batch["support"]["mask"] > 0
    labels = batch["support"]["rating"]
    assert (np.square(fitted - labels)[real].sum()
            < np.square(stepped - labels)[real].sum())


def test_ridge_scale_moves_the_learned_strengths_that_many_times_as_fast():
    """The strengths start at ``ridge`` whatever ``ridge_scale`` s is; one Adam step at
    rate r (its first: the rate times the gradient's sign) moves each log strength by
    s * r, so ``model_builder``'s s = ``meta.ridge_lr`` / r makes them learn at
    ``ridge_lr``; the predictions before the step do not depend on s."""
    batch = tiny.tasks(4, seed=6)
    moved, before = {}, {}
    for scale in (1.0, 20.0):
        model = tiny.model(MetaConfig("maml", inner_steps=1, inner_lr=0.2, ridge=0.5),
                           ridge_scale=scale)
        tiny.insert_ids(model, batch)
        np.testing.assert_allclose(model.ridge_strengths().numpy(), 0.5, rtol=1e-6)
        before[scale] = model.adapted_predictions(batch).numpy()
        start = np.log(model.ridge_strengths().numpy())
        _, _, grads = model.meta_gradients(batch)
        tf.keras.optimizers.Adam(1e-3).apply_gradients(zip(grads, model.slow_variables))
        moved[scale] = np.abs(np.log(model.ridge_strengths().numpy()) - start)
        ridge_grad = np.abs(grads[-1].numpy())
    np.testing.assert_allclose(before[20.0], before[1.0], rtol=1e-5, atol=1e-6)
    clear = ridge_grad > 1e-4   # Adam's first step is the rate where |grad| >> epsilon
    assert clear.sum() >= 3
    np.testing.assert_allclose(moved[1.0][clear], 1e-3, rtol=0.02)
    np.testing.assert_allclose(moved[20.0][clear], 20e-3, rtol=0.02)


def test_a_checkpoints_ridge_strengths_do_not_depend_on_the_scale_that_reads_it(tmp_path):
    """The scale is saved with the strengths: a model built with another ``ridge_scale``
    (another ``meta.ridge_lr`` or outer rate) restores the very strengths saved."""
    config = MetaConfig("maml", inner_steps=1, inner_lr=0.2, ridge=0.5)
    saved = tiny.model(config, ridge_scale=30.0)
    saved.set_ridge_strengths(np.linspace(0.1, 5.0, saved.ridge_variable.shape[0]))
    path = tf.train.Checkpoint(model=saved).write(str(tmp_path / "ckpt"))
    read = tiny.model(config, ridge_scale=2.0)
    np.testing.assert_allclose(read.ridge_strengths().numpy(), 0.5, rtol=1e-6)
    tf.train.Checkpoint(model=read).read(path).expect_partial()
    np.testing.assert_allclose(read.ridge_strengths().numpy(),
                               np.linspace(0.1, 5.0, saved.ridge_variable.shape[0]), rtol=1e-5)


def test_item_factors_fold_in_by_ridge_as_the_baseline_does():
    """With ``item_factors`` the ridge solve fits every task a weight on each item
    embedding column too (a matrix-factorisation fold-in), for the meta model and the
    fine-tuned baseline alike, and the outer gradient reaches the item rows through it."""
    model = tiny.model(MetaConfig("maml", inner_steps=1, inner_lr=0.2, ridge=0.5),
                       item_factors=True)
    assert model.ridge_variable.shape == (HIDDEN_PLUS_ITEMS + 1,)
    baseline = CTRModel(model.embedding, model.tower, model.head)
    batch = tiny.tasks(4, seed=6)
    model.meta_gradients(batch)  # inserts the ids and trains their rows once
    inserted = tiny.rows_of(model, {"item_id": batch["support"]["item_id"][0, :2]})["item_id"]
    model.meta_gradients(batch)
    moved = tiny.rows_of(model, {"item_id": batch["support"]["item_id"][0, :2]})["item_id"]
    assert np.abs(moved - inserted).max() > 1e-6
    np.testing.assert_allclose(fine_tuned_predictions(baseline, 1, 0.2, ridge=0.5)(batch),
                               model.adapted_predictions(batch), rtol=1e-5, atol=1e-6)


def test_embedding_penalty_is_added_to_the_outer_objective_in_training():
    """``embedding_l2`` adds its weight times the mean squared norm of the real support
    and query rows' embeddings to the outer objective only; the reported losses are the
    unpenalised ones."""
    config = MetaConfig("maml", inner_steps=2, inner_lr=0.2)
    plain, penalised = tiny.model(config), tiny.model(config, embedding_l2=0.3)
    batch = tiny.tasks(3, seed=2)
    for m in (plain, penalised):
        tiny.insert_ids(m, batch)
    q0, s0, _, _, objective0 = plain.meta_loss(batch)
    q1, s1, _, _, objective1 = penalised.meta_loss(batch)
    np.testing.assert_allclose([q1, s1], [q0, s0], rtol=1e-6)
    names = ["item_id", "user_id"]
    squares, rows = 0.0, 0.0
    for role in ("support", "query"):
        real = batch[role]["mask"] > 0
        emb = tiny.rows_of(penalised, {n: batch[role][n][real] for n in names})
        squares += sum(np.square(emb[n]).sum() for n in names)
        rows += real.sum()
    np.testing.assert_allclose(objective1 - objective0, 0.3 * squares / rows, rtol=1e-4)
    assert float(penalised.meta_loss(batch, training=False)[4]) == pytest.approx(float(q1))


@pytest.mark.shared_data
def test_meta_and_baseline_train_and_evaluate_on_movielens(shared_data, tmp_path):
    """Keras fit on Meta-IO batches of real data trains both models: the meta model's loss
    falls, and on cold users' query rows both models score better after training than
    before it (MAE; nDCG@3 of the meta model adapted on each user's support rows)."""
    path = str(tmp_path / "ml")
    data.convert_movielens(str(shared_data / "ml-100k"), path, seed=0)
    warm = data.read_tasks(path, 16, 16, 10, split="warm", shuffle_seed=0).take(6)
    cold = data.read_tasks(path, 16, None, 10, split="cold").take(2)
    model = tiny.model(MetaConfig("fomaml", inner_steps=2, inner_lr=0.05), optimizer="adagrad",
                       sparse_lr=0.05, multi_hot=True)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))

    def meta_report():
        return evaluate_tasks(model.adapted_predictions, cold, model.head, k=3,
                              binary_label="label").overall

    untrained = meta_report()
    history = model.fit(warm, epochs=2, verbose=0)
    trained = meta_report()
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[1] < losses[0]
    assert trained["tasks"] == untrained["tasks"] == 32 and trained["rows"] == 320
    assert trained["mae"] < untrained["mae"] - 0.01, (untrained, trained)
    assert trained["ndcg@3"] > untrained["ndcg@3"], (untrained, trained)

    baseline = CTRModel(tiny.embedding(0.05, "adagrad", multi_hot=True), model.tower.__class__(
        ["item_id", "genres"], ["user_id"], tiny.DIM, (tiny.HIDDEN,)), model.head)
    baseline.compile(optimizer=tf.keras.optimizers.Adam(1e-3))

    def baseline_report():
        return evaluate_tasks(fine_tuned_predictions(baseline, 2, 0.05), cold,
                              baseline.head).overall

    untuned = baseline_report()
    baseline.fit(warm.map(task_rows), epochs=1, verbose=0)
    tuned = baseline_report()
    assert tuned["tasks"] == 32 and tuned["mae"] < untuned["mae"] - 0.01, (untuned, tuned)


@pytest.mark.parametrize("ridge", [0.0, 0.5])
def test_a_task_whose_adaptation_diverges_is_scored_unadapted(ridge):
    """One task's fine-tuning blows up (its support ratings far beyond the head's range):
    that task gets its unadapted predictions, finite, and is marked undone; the other
    tasks' predictions are those of a batch without it."""
    model = tiny.model(MetaConfig())
    baseline = CTRModel(model.embedding, model.tower, model.head)
    batch = tiny.tasks(4, seed=3)
    model.meta_gradients(batch)  # insert the ids
    poisoned = {**batch, "support": {**batch["support"],
                                     "rating": batch["support"]["rating"].copy()}}
    poisoned["support"]["rating"][1] *= 1e30
    adapted = fine_tuned_predictions(baseline, 3, 0.5, ridge=ridge)
    got = adapted(poisoned).numpy()
    assert np.isfinite(got).all()
    unadapted = fine_tuned_predictions(baseline, 0, 0.5)(poisoned).numpy()
    np.testing.assert_array_equal(got[1], unadapted[1])
    clean = adapted(batch).numpy()
    np.testing.assert_allclose(got[[0, 2, 3]], clean[[0, 2, 3]], rtol=1e-6)
    assert not np.allclose(clean[1], unadapted[1])  # the clean task 1 was adapted
    adaptation = fine_tuned_adaptation(baseline, 3, 0.5, ridge=ridge)
    figures = {k: v.numpy() for k, v in adaptation(poisoned).items()}
    np.testing.assert_array_equal(figures["kept"][:, 0], [1.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(figures["blended"], got)  # one pass: the same figures
    np.testing.assert_array_equal(figures["unblended"][1], unadapted[1])
    np.testing.assert_array_equal(adaptation(batch)["kept"].numpy(), np.ones_like(clean))


def test_fine_tuning_that_blows_up_the_support_loss_is_undone():
    """Steps uphill (a negative rate) raise every task's support loss far beyond
    ``DIVERGED_LOSS_RATIO`` times its start while staying finite: every task is scored
    unadapted and marked undone; small steps are kept."""
    model = tiny.model(MetaConfig())
    baseline = CTRModel(model.embedding, model.tower, model.head)
    batch = tiny.tasks(3, seed=4)
    model.meta_gradients(batch)  # insert the ids
    uphill = fine_tuned_predictions(baseline, 2, -20.0)(batch).numpy()
    assert np.isfinite(uphill).all()
    np.testing.assert_array_equal(uphill, fine_tuned_predictions(baseline, 0, 0.5)(batch).numpy())
    kept = fine_tuned_adaptation(baseline, 2, -20.0)(batch)["kept"].numpy()
    assert (kept == 0).all()
    assert (fine_tuned_adaptation(baseline, 2, 0.05)(batch)["kept"].numpy() == 1).all()


@pytest.mark.parametrize("rows", [(), ("user_id",)])
def test_backtracking_takes_back_every_step_that_raises_a_tasks_support_loss(rows):
    """With ``backtrack``, steps uphill (a negative rate) are all taken back: every task
    ends at its unadapted predictions and is kept (its support loss never rose); a rate
    whose steps all lower the loss gives what plain fine-tuning gives; and at a rate so
    large that plain fine-tuning is undone on some tasks, backtracking keeps every task,
    none worse on its own support rows than before."""
    model = tiny.model(MetaConfig())
    baseline = CTRModel(model.embedding, model.tower, model.head)
    batch = tiny.tasks(6, seed=4)
    model.meta_gradients(batch)  # insert the ids
    unadapted = fine_tuned_predictions(baseline, 0, 0.5)(batch).numpy()
    uphill = fine_tuned_adaptation(baseline, 3, -20.0, adapted_embeddings=rows,
                                   backtrack=True)(batch)
    np.testing.assert_allclose(uphill["blended"].numpy(), unadapted, rtol=1e-6)
    assert (uphill["kept"].numpy() == 1).all()
    np.testing.assert_allclose(
        fine_tuned_predictions(baseline, 3, 0.01, adapted_embeddings=rows)(batch).numpy(),
        fine_tuned_adaptation(baseline, 3, 0.01, adapted_embeddings=rows,
                              backtrack=True)(batch)["blended"].numpy(),
        rtol=1e-5)
    plain = fine_tuned_adaptation(baseline, 5, 8.0, adapted_embeddings=rows)(batch)
    backtracked = fine_tuned_adaptation(baseline, 5, 8.0, adapted_embeddings=rows,
                                        backtrack=True)(batch)
    assert (plain["kept"].numpy() == 0).any()
    assert (backtracked["kept"].numpy() == 1).all()
    assert np.isfinite(backtracked["blended"].numpy()).all()

    # the support loss, task by task, after backtracked steps: never above its start
    from gmeta_tf.meta.task_adapter import TaskAdapter, resolve_fast_weights
    from gmeta_tf.meta.task_batch import role_batches
    adapter = TaskAdapter(baseline.tower, baseline.head, resolve_fast_weights(baseline.tower, ()),
                          rows, 5, backtrack=True)
    support, _, pairs = role_batches(baseline.embedding, baseline.tower, "rating", batch, False,
                                     rows)
    params = baseline.tower.params()
    fast = adapter.initial(params, tf.shape(support.mask)[0], pairs)
    rates = {n: tf.constant(8.0) for n in adapter.fast_names}
    adapted, before, reported = adapter.adapt(params, fast, support, rates, first_order=True)
    after = adapter.task_losses(params, adapted, support).numpy()
    np.testing.assert_allclose(reported.numpy(), after, rtol=1e-6)  # computed once, in the loop
    assert (after <= before.numpy() + 1e-6).all()
    assert (after < before.numpy()).any()  # and some task did move
    with pytest.raises(ValueError, match="first-order"):
        adapter.adapt(params, fast, support, rates, first_order=False)
