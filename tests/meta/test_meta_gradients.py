"""MAML, first-order MAML and Reptile against a plain per-task reference with nested tapes."""

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.meta import MetaConfig
from gmeta_tf.meta.task_batch import task_rows
from gmeta_tf.models import CTRModel, MeLUTower, RatingHead
from tests.meta import tiny

LR, STEPS = 0.3, 2
NAMES = ["mlp/0/kernel", "mlp/0/bias", "mlp/1/kernel", "mlp/1/bias"]


def _reference(model, batch, first_order, per_step=False, ridge=0.0):
    """Meta-gradients computed task by task with nested tapes, from the model's current
    weights and embedding rows, written independently of gmeta_tf.meta. ``per_step``: one
    inner rate per weight and step (its gradient has a leading step axis). ``ridge``: the
    output layer is then set to the ridge fit of the support rows toward the slow one, by
    the normal equations with an explicit inverse; ``dlr["ridge"]`` is the gradient of the
    logs of its strengths.

    Returns (dense gradients by name, inner-rate gradients by name, row gradients by
    (feature, id), per-task adapted weights by name).
    """
    params = {n: tf.Variable(v.numpy()) for n, v in model.tower.params().items()}
    rates = {n: tf.Variable([LR] * STEPS if per_step else LR) for n in NAMES}
    log_strength = tf.Variable(np.full(tiny.HIDDEN + 1, np.log(ridge or 1.0), np.float32))
    ids = {f: np.unique(np.concatenate([batch[r][f][batch[r]["mask"] > 0]
                                        for r in ("support", "query")]))
           for f in ("user_id", "item_id")}
    tables = {f: tf.Variable(tiny.rows_of(model, {f: ids[f]})[f]) for f in ids}
    num_tasks = len(batch["task_id"])
    dense, dlr, drows, adapted = ({n: 0.0 for n in NAMES}, {n: 0.0 for n in NAMES},
                                  {f: 0.0 for f in ids}, {n: [] for n in NAMES})

    def hidden(w, role, t):
        real = batch[role]["mask"][t] > 0
        x = tf.concat([tf.gather(tables[f], np.searchsorted(ids[f], batch[role][f][t][real]))
                       for f in ("item_id", "user_id")], axis=1)
        return tf.nn.relu(x @ w[0] + w[1]), batch[role]["rating"][t][real]

    def loss(w, role, t):
        h, y = hidden(w, role, t)
        pred = tf.squeeze(h @ w[2] + w[3], 1) + 3.0
        return tf.reduce_mean(tf.square(pred - y))

    def ridge_fit(w, t):
        h, y = hidden(w, "support", t)
        z = tf.concat([h, tf.ones([len(y), 1])], axis=1)
        prior = tf.concat([params[NAMES[2]][:, 0], params[NAMES[3]]], axis=0)[:, None]
        inverse = tf.linalg.inv(tf.transpose(z) @ z + tf.linalg.diag(tf.exp(log_strength)))
        layer = prior + inverse @ tf.transpose(z) @ (y[:, None] - 3.0 - z @ prior)
        return [w[0], w[1], layer[:-1], layer[-1]]

    for t in range(num_tasks):
        with tf.GradientTape() as outer:
            w = [params[n] * 1.0 for n in NAMES]
            for step in range(STEPS):
                with tf.GradientTape() as inner:
                    inner.watch(w)
                    support_loss = loss(w, "support", t)
                g = inner.gradient(support_loss, w)
                if first_order:
                    g = [tf.stop_gradient(x) for x in g]
                w = [wi - (rates[n][step] if per_step else rates[n]) * gi
                     for wi, gi, n in zip(w, g, NAMES)]
            if ridge:
                w = ridge_fit(w, t)
            query_loss = loss(w, "query", t)
        sources = ([params[n] for n in NAMES] + [rates[n] for n in NAMES]
                   + [tables[f] for f in ids] + [log_strength])
        grads = outer.gradient(query_loss, sources,
                               unconnected_gradients=tf.UnconnectedGradients.ZERO)
        dlr["ridge"] = dlr.get("ridge", 0.0) + grads[-1].numpy() / num_tasks
        for i, n in enumerate(NAMES):
            dense[n] += grads[i].numpy() / num_tasks
            dlr[n] += grads[len(NAMES) + i].numpy() / num_tasks
            adapted[n].append(w[i].numpy())
        for j, f in enumerate(ids):
            drows[f] += tf.convert_to_tensor(grads[2 * len(NAMES) + j]).numpy() / num_tasks
    return dense, dlr, {(f, int(i)): drows[f][k] for f in ids for k, i in enumerate(ids[f])}, adapted


def _ids(batch):
    return {f: np.unique(np.concatenate([batch[r][f][batch[r]["mask"] > 0]
                                         for r in ("support", "query")]))
            for f in ("user_id", "item_id")}


def _rows(model, ids):
    """(feature, id) -> row, for the user and item ids given."""
    return {(f, int(i)): row for f in ids
            for i, row in zip(ids[f], tiny.rows_of(model, {f: ids[f]})[f])}


def _meta_step(algorithm, batch, learn_inner_lr=False, per_step=False, ridge=0.0):
    """A fresh tiny model, ids inserted; returns (model, its grads by name, row changes)."""
    model = tiny.model(MetaConfig(algorithm, inner_steps=STEPS, inner_lr=LR,
                                  learn_inner_lr=learn_inner_lr, inner_lr_per_step=per_step,
                                  ridge=ridge))
    tiny.insert_ids(model, batch)
    ids = _ids(batch)
    before = _rows(model, ids)
    reference = _reference(model, batch, first_order=algorithm != "maml", per_step=per_step,
                           ridge=ridge)
    _, _, grads = model.meta_gradients(batch)
    after = _rows(model, ids)
    names = [v.name.split("/", 1)[-1] for v in model.slow_variables]
    by_name = dict(zip(NAMES, [g.numpy() for g in grads[: len(NAMES)]]))
    if learn_inner_lr:
        by_name.update({f"lr:{n}": g.numpy() for n, g in zip(NAMES, grads[len(NAMES):])})
    if ridge:
        by_name["ridge"] = grads[-1].numpy()
    assert len(names) == len(grads)
    changes = {k: after[k] - before[k] for k in before}
    return model, by_name, changes, reference


@pytest.mark.parametrize("num_tasks", [1, 4])
def test_maml_meta_gradient_equals_nested_tape_reference(num_tasks):
    batch = tiny.tasks(num_tasks, seed=num_tasks)
    _, grads, changes, (dense, dlr, drows, _) = _meta_step("maml", batch, learn_inner_lr=True)
    for n in NAMES:
        np.testing.assert_allclose(grads[n], dense[n], rtol=1e-4, atol=1e-6, err_msg=n)
        np.testing.assert_allclose(grads[f"lr:{n}"], dlr[n], rtol=1e-4, atol=1e-6, err_msg=n)
    # Sparse SGD(1.0): a row moves by minus its (second-order) meta-gradient.
    for key, change in changes.items():
        np.testing.assert_allclose(change, -drows[key], rtol=1e-4, atol=1e-6, err_msg=str(key))


def test_per_step_inner_rates_get_their_own_meta_gradients():
    """MAML++ per-step rates: each step's rate gets its own gradient (nested-tape reference);
    with all rates equal, the forward is plain Meta-SGD's and the per-step gradients sum
    to the one rate's gradient."""
    batch = tiny.tasks(3, seed=7)
    _, grads, changes, (dense, dlr, drows, _) = _meta_step("maml", batch, True, per_step=True)
    _, shared, _, _ = _meta_step("maml", batch, learn_inner_lr=True)
    for n in NAMES:
        assert grads[f"lr:{n}"].shape == (STEPS,)
        np.testing.assert_allclose(grads[f"lr:{n}"], dlr[n], rtol=1e-4, atol=1e-6, err_msg=n)
        np.testing.assert_allclose(grads[f"lr:{n}"].sum(), shared[f"lr:{n}"], rtol=1e-4,
                                   atol=1e-6, err_msg=n)
        np.testing.assert_allclose(grads[n], dense[n], rtol=1e-4, atol=1e-6, err_msg=n)
    assert abs(grads[f"lr:{NAMES[0]}"][0] - grads[f"lr:{NAMES[0]}"][1]) > 1e-6
    for key, change in changes.items():
        np.testing.assert_allclose(change, -drows[key], rtol=1e-4, atol=1e-6, err_msg=str(key))


@pytest.mark.parametrize("algorithm", ["maml", "fomaml"])
def test_ridge_output_layer_meta_gradient_equals_nested_tape_reference(algorithm):
    """``meta.ridge``: after the k steps the output layer is the ridge fit of the support
    rows (the batched Cholesky solve, against one explicit inverse per task); the
    meta-gradients of the slow weights, the inner rates, the rows and the logs of the ridge
    strengths match the nested-tape reference, and the strengths do get one."""
    batch = tiny.tasks(3, seed=17)
    _, grads, changes, (dense, dlr, drows, _) = _meta_step(algorithm, batch, True, ridge=2.0)
    for n in NAMES:
        np.testing.assert_allclose(grads[n], dense[n], rtol=1e-3, atol=1e-5, err_msg=n)
        np.testing.assert_allclose(grads[f"lr:{n}"], dlr[n], rtol=1e-3, atol=1e-5, err_msg=n)
    np.testing.assert_allclose(grads["ridge"], dlr["ridge"], rtol=1e-3, atol=1e-5)
    assert np.abs(grads["ridge"]).max() > 1e-4
    for key, change in changes.items():
        np.testing.assert_allclose(change, -drows[key], rtol=1e-3, atol=1e-5, err_msg=str(key))


def test_first_order_drops_the_second_order_term():
    batch = tiny.tasks(4, seed=11)
    _, fo, fo_changes, (dense, _, drows, _) = _meta_step("fomaml", batch)
    _, so, _, _ = _meta_step("maml", batch)
    for n in NAMES:
        np.testing.assert_allclose(fo[n], dense[n], rtol=1e-4, atol=1e-6, err_msg=n)
    for key, change in fo_changes.items():
        np.testing.assert_allclose(change, -drows[key], rtol=1e-4, atol=1e-6, err_msg=str(key))
    gap = max(np.abs(fo[n] - so[n]).max() for n in NAMES)
    assert gap > 1e-3, "first-order and second-order meta-gradients should differ"


def test_reptile_moves_slow_weights_toward_the_adapted_ones():
    batch = tiny.tasks(4, seed=5)
    model = tiny.model(MetaConfig("reptile", inner_steps=STEPS, inner_lr=LR))
    model.compile(optimizer=tf.keras.optimizers.SGD(0.5))
    tiny.insert_ids(model, batch)
    before = {n: v.numpy() for n, v in model.tower.params().items()}
    _, _, _, adapted = _reference(model, batch, first_order=True)
    model.train_step(batch)
    for n in NAMES:
        target = np.mean(adapted[n], axis=0)
        expected = before[n] + 0.5 * (target - before[n])
        np.testing.assert_allclose(model.tower.params()[n].numpy(), expected, rtol=1e-4,
                                   atol=1e-6, err_msg=n)
        moved = np.abs(model.tower.params()[n].numpy() - target).sum()
        assert moved < np.abs(before[n] - target).sum() or np.allclose(before[n], target)


@pytest.mark.parametrize("algorithm", ["maml", "fomaml"])
def test_batched_tasks_equal_tasks_one_by_one(algorithm):
    batch = tiny.tasks(4, seed=21, multi_hot=True)
    config = MetaConfig(algorithm, inner_steps=STEPS, inner_lr=LR, learn_inner_lr=True,
                        adapt_embeddings=("item_id",))

    def run(part):
        model = tiny.model(config, multi_hot=True)
        tiny.insert_ids(model, batch)
        ids = _ids(batch)
        before = _rows(model, ids)
        _, _, grads = model.meta_gradients(part)
        after = _rows(model, ids)
        return [g.numpy() for g in grads], {k: after[k] - before[k] for k in before}

    batched_grads, batched_changes = run(batch)
    singles = [run(tiny.task_slice(batch, t, t + 1)) for t in range(4)]
    for i, g in enumerate(batched_grads):
        np.testing.assert_allclose(g, np.mean([s[0][i] for s in singles], axis=0), rtol=1e-4,
                                   atol=1e-6)
    for key, change in batched_changes.items():
        np.testing.assert_allclose(change, np.mean([s[1][key] for s in singles], axis=0),
                                   rtol=1e-4, atol=1e-6, err_msg=str(key))


def test_pretraining_gradient_is_the_plain_loss_over_every_row():
    """``pretrain_gradients`` (``train.pretrain_steps``): the unadapted squared error over
    every real support and query row of every task (rows weighted alike), its gradient in
    the tower and in the rows (sparse SGD(1.0): a row moves by minus it); the learned inner
    rates get none."""
    batch = tiny.tasks(3, seed=13)
    model = tiny.model(MetaConfig("maml", inner_steps=STEPS, inner_lr=LR, learn_inner_lr=True))
    tiny.insert_ids(model, batch)
    ids = _ids(batch)
    before = _rows(model, ids)
    params = {n: tf.Variable(v.numpy()) for n, v in model.tower.params().items()}
    tables = {f: tf.Variable(tiny.rows_of(model, {f: ids[f]})[f]) for f in ids}
    with tf.GradientTape() as tape:
        errors = []
        for role in ("support", "query"):
            real = batch[role]["mask"] > 0
            x = tf.concat([tf.gather(tables[f], np.searchsorted(ids[f], batch[role][f][real]))
                           for f in ("item_id", "user_id")], axis=1)
            h = tf.nn.relu(x @ params[NAMES[0]] + params[NAMES[1]])
            pred = tf.squeeze(h @ params[NAMES[2]] + params[NAMES[3]], 1) + 3.0
            errors.append(tf.square(pred - batch[role]["rating"][real]))
        reference_loss = tf.reduce_mean(tf.concat(errors, 0))
    sources = [params[n] for n in NAMES] + [tables[f] for f in ids]
    reference = tape.gradient(reference_loss, sources)

    loss, grads = model.pretrain_gradients(batch)
    np.testing.assert_allclose(loss.numpy(), reference_loss.numpy(), rtol=1e-5)
    for i, n in enumerate(NAMES):
        np.testing.assert_allclose(grads[i].numpy(), reference[i].numpy(), rtol=1e-4,
                                   atol=1e-6, err_msg=n)
    assert all(not np.any(g.numpy()) for g in grads[len(NAMES):])  # the inner rates
    after = _rows(model, ids)
    for j, f in enumerate(ids):
        row_grads = tf.convert_to_tensor(reference[len(NAMES) + j]).numpy()
        for k, i in enumerate(ids[f]):
            np.testing.assert_allclose(after[(f, int(i))] - before[(f, int(i))], -row_grads[k],
                                       rtol=1e-4, atol=1e-6, err_msg=f"{f} {i}")


@pytest.mark.parametrize("algorithm", ["maml", "fomaml"])
def test_plain_loss_adds_its_weight_times_the_plain_gradient(algorithm):
    """``MetaConfig.plain_loss``: the outer gradient is the meta-gradient plus the weight
    times the plain (pre-training) gradient, in the tower, the inner rates and the rows;
    the reported loss stays the query loss."""
    batch = tiny.tasks(3, seed=17)
    weight = 0.5

    def step(plain_loss, pretrain=False):
        model = tiny.model(MetaConfig(algorithm, inner_steps=STEPS, inner_lr=LR,
                                      learn_inner_lr=True, plain_loss=plain_loss))
        tiny.insert_ids(model, batch)
        ids = _ids(batch)
        before = _rows(model, ids)
        if pretrain:
            loss, grads = model.pretrain_gradients(batch)
        else:
            loss, _, grads = model.meta_gradients(batch)
        after = _rows(model, ids)
        return loss.numpy(), [g.numpy() for g in grads], {k: after[k] - before[k] for k in after}

    meta_loss, meta, meta_rows = step(0.0)
    _, plain, plain_rows = step(0.0, pretrain=True)
    loss, both, both_rows = step(weight)
    np.testing.assert_allclose(loss, meta_loss, rtol=1e-6)
    assert any(np.any(g) for g in plain[: len(NAMES)])
    for i, g in enumerate(both):
        np.testing.assert_allclose(g, meta[i] + weight * plain[i], rtol=1e-4, atol=1e-6)
    for key, change in both_rows.items():
        np.testing.assert_allclose(change, meta_rows[key] + weight * plain_rows[key],
                                   rtol=1e-4, atol=1e-6, err_msg=str(key))


def test_plain_loss_is_refused_under_reptile():
    with pytest.raises(ValueError, match="plain_loss"):
        MetaConfig("reptile", plain_loss=1.0)


def test_ridge_fit_leaves_the_towers_linear_term_as_it_is():
    """With a first-order term beside the output layer (``MeLUTower(linear=True)``), the
    ridge solve fits each task's output layer to what the term leaves: ``y - offset -
    linear - h'w0`` on the real support rows, checked against the normal equations."""
    from gmeta_tf.meta.task_adapter import TaskAdapter
    from gmeta_tf.meta.task_batch import RoleBatch
    from gmeta_tf.models import MeLUTower, RatingHead

    tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,), seed=3,
                      linear=True)
    params = {n: tf.constant(v.numpy()) for n, v in tower.params().items()}
    strengths = np.linspace(0.5, 2.0, tiny.HIDDEN + 1).astype(np.float32)
    adapter = TaskAdapter(tower, RatingHead("rating", offset=3.0), tuple(params), (), 1,
                          ridge=lambda: tf.constant(strengths))
    rng = np.random.default_rng(5)
    tasks, rows = 3, 7
    inputs = {f: tf.constant(rng.normal(size=(tasks, rows, tiny.DIM + 1)), tf.float32)
              for f in ("item_id", "user_id")}
    labels = rng.integers(1, 6, (tasks, rows)).astype(np.float32)
    mask = np.ones((tasks, rows), np.float32)
    mask[:, -2:] = 0.0
    fast = {n: tf.broadcast_to(v, (tasks, *v.shape)) for n, v in params.items()}
    solved = adapter.solve_output_layer(params, fast,
                                        RoleBatch(inputs, tf.constant(labels), tf.constant(mask), {}))
    kernel, bias = tower.output_layer
    prior = np.concatenate([params[kernel].numpy()[:, 0], params[bias].numpy()])
    for t in range(tasks):
        real = mask[t] > 0
        one = {f: tf.boolean_mask(v[t], real) for f, v in inputs.items()}
        h = tower.hidden(params, one).numpy()
        z = np.concatenate([h, np.ones((len(h), 1), np.float32)], axis=1)
        linear = (one["item_id"][:, tiny.DIM] + one["user_id"][:, tiny.DIM]).numpy()
        residual = labels[t][real] - 3.0 - linear - z @ prior
        layer = prior + np.linalg.solve(z.T @ z + np.diag(strengths), z.T @ residual)
        np.testing.assert_allclose(solved[kernel][t, :, 0].numpy(), layer[:-1], rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(solved[bias][t].numpy(), layer[-1:], rtol=1e-4, atol=1e-5)


def _within_task_reference(predictions: np.ndarray, labels: np.ndarray,
                           mask: np.ndarray) -> np.ndarray:
    """Each task's mean over its real rows of ((p - mean p) - (y - mean y))^2."""
    out = []
    for p, y, m in zip(predictions, labels, mask > 0):
        p, y = p[m].astype(np.float64), y[m].astype(np.float64)
        out.append(np.mean(((p - p.mean()) - (y - y.mean())) ** 2) if len(p) else 0.0)
    return np.array(out)


def test_within_task_loss_is_the_squared_error_less_the_level_error():
    """``RatingHead.within_task_loss``: the centred squared error of each task's real rows
    (padding ignored), which is its squared error less its mean error squared; the same
    for every shift of a task's predictions; the row form equals it row for row."""
    head = RatingHead("rating", offset=3.0)
    rng = np.random.default_rng(0)
    outputs = rng.normal(size=(4, 6)).astype(np.float32)
    labels = rng.integers(1, 6, (4, 6)).astype(np.float32)
    mask = np.ones((4, 6), np.float32)
    mask[0, 4:] = 0.0
    mask[3, 1:] = 0.0  # one real row: nothing to centre
    got = head.within_task_loss(labels, outputs, mask).numpy()
    np.testing.assert_allclose(got, _within_task_reference(outputs + 3.0, labels, mask),
                               rtol=1e-5, atol=1e-6)
    assert got[3] == 0.0 and np.all(got[:3] > 0)
    error = (outputs + 3.0 - labels) * mask
    level = (error.sum(1) / mask.sum(1)) ** 2
    np.testing.assert_allclose(got, head.masked_loss(labels, outputs, mask).numpy() - level,
                               rtol=1e-4, atol=1e-5)
    shifted = outputs + np.array([[0.5], [-2.0], [1.0], [3.0]], np.float32)
    np.testing.assert_allclose(head.within_task_loss(labels, shifted, mask).numpy(), got,
                               rtol=1e-4, atol=1e-5)
    real = mask > 0
    tasks = np.repeat(np.array([7, 3, 9, 1]), 6).reshape(4, 6)[real]
    rows = head.within_task_row_loss(labels[real], outputs[real], tasks).numpy()
    per_task = [rows[tasks == t].mean() for t in (7, 3, 9, 1)]
    np.testing.assert_allclose(per_task, got, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["maml", "fomaml"])
def test_within_task_loss_adds_its_weight_times_the_adapted_query_rows_centred_error(algorithm):
    """``MetaConfig.within_task_loss``: the outer objective is the query loss after
    adaptation plus the weight times each task's within-task squared error of its adapted
    query predictions (the predictions scored at evaluation), averaged over the tasks;
    the reported loss stays the query loss; outside training nothing is added."""
    batch = tiny.tasks(3, seed=19)
    weight = 0.7

    def run(within):
        model = tiny.model(MetaConfig(algorithm, inner_steps=STEPS, inner_lr=LR,
                                      learn_inner_lr=True, within_task_loss=within))
        tiny.insert_ids(model, batch)
        predictions = model.adapted_predictions(batch, blended=False).numpy()
        query_loss, _, _, _, objective = model.meta_loss(batch)
        *_, untrained = model.meta_loss(batch, training=False)
        return query_loss.numpy(), objective.numpy(), untrained.numpy(), predictions

    loss0, objective0, _, _ = run(0.0)
    loss, objective, untrained, predictions = run(weight)
    np.testing.assert_allclose(loss, loss0, rtol=1e-6)
    np.testing.assert_allclose(untrained, loss, rtol=1e-6)
    within = _within_task_reference(predictions, batch["query"]["rating"],
                                    batch["query"]["mask"]).mean()
    assert within > 0
    np.testing.assert_allclose(objective - objective0, weight * within, rtol=1e-4, atol=1e-6)


def test_the_baselines_within_task_loss_centres_each_tasks_rows():
    """The baseline (``CTRModel(within_task_loss=W)``), trained on a task batch's rows as
    ``gmeta train`` trains it: its loss is the rows' squared error plus W times the mean
    over rows of each row's error centred on its task's mean error."""
    batch = tiny.tasks(3, seed=23)
    rows = task_rows(batch)
    weight = 0.4

    def first_loss(within):
        tower = MeLUTower(["item_id"], ["user_id"], tiny.DIM, hidden_units=(tiny.HIDDEN,),
                          seed=3)
        model = CTRModel(tiny.embedding(), tower, RatingHead("rating", offset=3.0),
                         within_task_loss=within)
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1))
        tiny.insert_ids(model, batch)
        predictions = model(rows).numpy()  # before the step's update
        return model.train_step(rows)["loss"].numpy(), predictions

    plain, predictions = first_loss(0.0)
    loss, _ = first_loss(weight)
    error = predictions - rows["rating"].numpy()
    tasks = rows["task_id"].numpy()
    centred = np.concatenate([error[tasks == t] - error[tasks == t].mean()
                              for t in np.unique(tasks)])
    np.testing.assert_allclose(plain, np.mean(error ** 2), rtol=1e-5)
    np.testing.assert_allclose(loss - plain, weight * np.mean(centred ** 2), rtol=1e-4,
                               atol=1e-6)


@pytest.mark.parametrize("algorithm", ["maml", "fomaml"])
def test_label_shift_trains_on_each_tasks_ratings_moved_by_one_offset(algorithm, monkeypatch):
    """``MetaConfig.label_shift`` (meta-augmentation): in training, the outer objective is
    that of the batch whose every task has its support and query ratings moved by one
    offset of its own; outside training the ratings are as they are."""
    from gmeta_tf.meta import meta_model
    batch = tiny.tasks(3, seed=23)
    offsets = np.array([[0.4], [-0.25], [0.1]], np.float32)
    monkeypatch.setattr(meta_model, "task_offsets", lambda n, width: tf.constant(offsets))

    def run(shift, batch):
        model = tiny.model(MetaConfig(algorithm, inner_steps=STEPS, inner_lr=LR,
                                      learn_inner_lr=True, label_shift=shift))
        tiny.insert_ids(model, batch)
        *_, objective = model.meta_loss(batch)
        *_, untrained = model.meta_loss(batch, training=False)
        return objective.numpy(), untrained.numpy()

    moved = {role: dict(rows, rating=rows["rating"] + offsets) for role, rows in batch.items()
             if role in ("support", "query")}
    objective, untrained = run(0.5, batch)
    objective_moved, _ = run(0.0, {**batch, **moved})
    objective_plain, untrained_plain = run(0.0, batch)
    np.testing.assert_allclose(objective, objective_moved, rtol=1e-5)
    assert abs(objective - objective_plain) > 1e-4
    np.testing.assert_allclose(untrained, untrained_plain, rtol=1e-6)


@pytest.mark.parametrize("algorithm", ["maml", "fomaml", "reptile"])
def test_gradient_dropout_acts_on_the_inner_gradients_in_training_only(algorithm,
                                                                      monkeypatch):
    """``MetaConfig.grad_dropout`` (DropGrad): in training, every inner step moves the fast
    weights by the dropped gradient; outside training by the whole one. A "dropout" that
    doubles every gradient must train as the inner rate doubled, and leave evaluation as
    it was."""
    from gmeta_tf.meta import task_adapter
    batch = tiny.tasks(3, seed=29)
    seen = []

    def doubled(grad, rate):
        seen.append(rate)
        return 2.0 * grad

    monkeypatch.setattr(task_adapter, "dropped_gradient", doubled)

    def run(lr, dropout):
        model = tiny.model(MetaConfig(algorithm, inner_steps=STEPS, inner_lr=lr,
                                      grad_dropout=dropout))
        tiny.insert_ids(model, batch)
        *_, objective = model.meta_loss(batch)
        *_, untrained = model.meta_loss(batch, training=False)
        return objective.numpy(), untrained.numpy()

    objective, untrained = run(LR, 0.25)
    assert seen and set(seen) == {0.25}
    objective_doubled, _ = run(2 * LR, 0.0)
    objective_plain, untrained_plain = run(LR, 0.0)
    np.testing.assert_allclose(objective, objective_doubled, rtol=1e-5)
    assert abs(objective - objective_plain) > 1e-4
    np.testing.assert_allclose(untrained, untrained_plain, rtol=1e-6)


def test_embedding_dropout_draws_once_a_step_for_both_loops_in_training_only(monkeypatch):
    """``embedding_dropout``: in training the tower reads the support and the query rows
    dropped out (one call each, before the inner loop, so the inner and outer loops see
    the same draw); a "dropout" that leaves the rows as they are trains as none; outside
    training nothing is dropped."""
    from gmeta_tf.meta import meta_model
    batch = tiny.tasks(3, seed=31)
    calls = []

    def run(dropout):
        model = tiny.model(MetaConfig("maml", inner_steps=STEPS, inner_lr=LR))
        model.embedding_dropout = dropout
        tiny.insert_ids(model, batch)
        *_, objective = model.meta_loss(batch)
        *_, untrained = model.meta_loss(batch, training=False)
        return objective.numpy(), untrained.numpy()

    objective_plain, untrained_plain = run(0.0)
    objective, untrained = run(0.5)
    assert abs(objective - objective_plain) > 1e-4
    np.testing.assert_allclose(untrained, untrained_plain, rtol=1e-6)

    def kept(rows, names, rate):
        calls.append(rate)
        return dict(rows)

    monkeypatch.setattr(meta_model, "dropped_embeddings", kept)
    objective_kept, _ = run(0.5)
    assert calls == [0.5, 0.5]
    np.testing.assert_allclose(objective_kept, objective_plain, rtol=1e-6)


def test_dropped_gradient_zeroes_a_fraction_and_keeps_the_expectation():
    from gmeta_tf.meta.task_adapter import dropped_gradient
    grad = tf.fill([400, 500], 3.0)
    got = dropped_gradient(grad, 0.2).numpy()
    np.testing.assert_allclose(got[got != 0.0], 3.75, rtol=1e-6)
    assert abs(np.mean(got == 0.0) - 0.2) < 0.01
    assert abs(got.mean() - 3.0) < 0.05
    with tf.GradientTape() as tape:
        w = tf.Variable(tf.ones([1000]))
        tape.watch(w)
        out = tf.reduce_sum(dropped_gradient(w * 2.0, 0.5))
    dw = tape.gradient(out, w).numpy()
    np.testing.assert_allclose(dw[dw != 0.0], 4.0, rtol=1e-6)
    assert 0 < np.mean(dw == 0.0) < 1


def test_task_offsets_are_one_per_task_within_the_width():
    from gmeta_tf.meta.meta_model import task_offsets
    got = task_offsets(tf.constant(500), 0.5).numpy()
    assert got.shape == (500, 1) and np.all(np.abs(got) <= 0.5)
    assert got.min() < -0.4 and got.max() > 0.4


def test_label_shift_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="label_shift.*only through the support rows"):
        MetaConfig("reptile", label_shift=0.5)
    with pytest.raises(ValueError, match="label_shift"):
        MetaConfig("maml", label_shift=-0.1)


def _role(values: np.ndarray, mask: np.ndarray):
    from gmeta_tf.meta.task_batch import RoleBatch
    values = tf.constant(values, tf.float32)
    return RoleBatch({"x": values[..., None], "ids": tf.zeros(values.shape, tf.int64)},
                     values, tf.constant(mask, tf.float32), {})


def test_task_interpolation_mixes_each_row_with_the_partners_row_of_its_rank():
    """MLTI: a mixed task's row r is ``lam`` times its own plus ``1 - lam`` times the
    partner task's real row of rank ``r mod n``; its labels alike with the same ``lam`` in
    both roles; its mask and non-floating inputs are its own."""
    from gmeta_tf.meta.meta_model import interpolated_tasks
    # Task 0: 3 real support rows, 2 query rows; task 1: 2 support rows (one padding row
    # between them), 1 query row. Values tell rows apart.
    support = _role(np.array([[1.0, 2.0, 3.0, 0.0], [10.0, 0.0, 20.0, 0.0]]),
                    np.array([[1, 1, 1, 0], [1, 0, 1, 0]]))
    query = _role(np.array([[4.0, 5.0], [30.0, 0.0]]), np.array([[1, 1], [1, 0]]))
    tf.random.set_seed(3)
    seen_mixed = False
    for _ in range(20):
        s, q = interpolated_tasks(support, query, 1.0)
        lam0 = (s.labels[0, 0].numpy() - 10.0) / (1.0 - 10.0)
        if abs(lam0 - 1.0) < 1e-6:  # the shuffle left the task its own partner
            np.testing.assert_allclose(s.labels, support.labels)
            continue
        seen_mixed = True
        assert 0.0 <= lam0 <= 1.0
        own, other = np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([10.0, 20.0, 10.0, 30.0, 30.0])
        np.testing.assert_allclose(np.concatenate([s.labels[0, :3], q.labels[0]]),
                                   lam0 * own + (1 - lam0) * other, rtol=1e-5)
        np.testing.assert_allclose(s.inputs["x"][..., 0], s.labels, rtol=1e-6)
        lam1 = (s.labels[1, 0].numpy() - 1.0) / (10.0 - 1.0)
        np.testing.assert_allclose(s.labels[1, 2], lam1 * 20 + (1 - lam1) * 3.0, rtol=1e-5)
        np.testing.assert_allclose(q.labels[1, 0], lam1 * 30 + (1 - lam1) * 4.0, rtol=1e-5)
        np.testing.assert_array_equal(s.mask, support.mask)
        np.testing.assert_array_equal(q.mask, query.mask)
        assert s.inputs["ids"].dtype == tf.int64
    assert seen_mixed
    s, q = interpolated_tasks(support, query, 0.0)
    np.testing.assert_array_equal(s.labels, support.labels)
    np.testing.assert_array_equal(q.labels, query.labels)


def test_task_interpolation_acts_in_training_only(monkeypatch):
    """``MetaConfig.task_interpolation``: in training the outer objective is that of the
    interpolated tasks; outside training the tasks are as they are."""
    from gmeta_tf.meta import meta_model
    batch = tiny.tasks(3, seed=37)
    calls = []

    def rolled_tasks(support, query, rate):
        # Each task's rows read the next task's inputs under its own labels.
        calls.append(rate)
        roll = lambda role: role._replace(  # noqa: E731
            inputs={k: tf.roll(v, 1, axis=0) for k, v in role.inputs.items()})
        return roll(support), roll(query)

    def run(rate):
        model = tiny.model(MetaConfig("maml", inner_steps=STEPS, inner_lr=LR,
                                      task_interpolation=rate))
        tiny.insert_ids(model, batch)
        *_, objective = model.meta_loss(batch)
        *_, untrained = model.meta_loss(batch, training=False)
        return objective.numpy(), untrained.numpy()

    monkeypatch.setattr(meta_model, "interpolated_tasks", rolled_tasks)
    objective_plain, untrained_plain = run(0.0)
    assert not calls
    objective, untrained = run(0.5)
    assert calls == [0.5]
    assert abs(objective - objective_plain) > 1e-4
    np.testing.assert_allclose(untrained, untrained_plain, rtol=1e-6)
