"""Towers: batched (per-task) weights equal a loop over tasks; plain Keras training works."""

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.embedding import Adagrad, FeatureConfig, ShardedHashEmbedding, TableConfig
from gmeta_tf.models import (BinaryHead, CTRModel, DLRMTower, MeLUTower, RatingHead,
                             embedding_inputs, make_head)
from gmeta_tf.models.dense_stack import apply_dense_stack
from gmeta_tf.models.embedding_inputs import dropped_embeddings, embedding_penalty

DIM = 4


def _towers():
    return [MeLUTower(["item_id", "genres"], ["age"], DIM, hidden_units=(6, 5), seed=1),
            MeLUTower(["item_id", "genres"], ["age"], DIM, hidden_units=(6,), seed=4,
                      context_dim=3),
            MeLUTower(["item_id", "genres"], ["age"], DIM, hidden_units=(6, 5), seed=5,
                      context_dim=2, item_factors=True),
            DLRMTower(["item_id", "genres", "age"], DIM, {"price": 1, "stats": 3},
                      bottom_units=(5,), top_units=(6,), seed=2),
            DLRMTower(["item_id", "genres", "age"], DIM, None, top_units=(6,), seed=3)]


def _features(rng, lead):
    return {"item_id": rng.normal(size=(*lead, DIM)).astype(np.float32),
            "genres": rng.normal(size=(*lead, DIM)).astype(np.float32),
            "age": rng.normal(size=(*lead, DIM)).astype(np.float32),
            "price": rng.normal(size=lead).astype(np.float32),
            "stats": rng.normal(size=(*lead, 3)).astype(np.float32)}


@pytest.mark.parametrize("tower", _towers(),
                         ids=["melu", "melu-context", "melu-item-factors", "dlrm", "deepfm"])
def test_per_task_weights_equal_a_loop_over_tasks(tower):
    rng = np.random.default_rng(0)
    num_tasks, rows = 3, 5
    feats = _features(rng, (num_tasks, rows))
    params = tower.params()
    batched = {n: tf.stack([v + 0.1 * t * tf.ones_like(v) for t in range(num_tasks)])
               for n, v in params.items()}
    out = tower.apply(batched, feats).numpy()
    assert out.shape == (num_tasks, rows)
    for t in range(num_tasks):
        one = {n: v[t] for n, v in batched.items()}
        expected = tower.apply(one, {k: v[t] for k, v in feats.items()}).numpy()
        np.testing.assert_allclose(out[t], expected, rtol=1e-5, atol=1e-6)
    # Shared weights with task-shaped inputs equal the plain Keras call on flat rows.
    flat = tower({k: v.reshape(num_tasks * rows, *v.shape[2:]) for k, v in feats.items()})
    np.testing.assert_allclose(tower.apply(params, feats).numpy().ravel(), flat.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_melu_context_is_an_input_of_the_first_layer_starting_at_zero():
    """CAVIA's context: a zero-initialised weight the MLP reads after the embeddings; one
    context per task moves only that task's outputs."""
    tower = MeLUTower(["item_id"], ["age"], DIM, hidden_units=(5,), seed=2, context_dim=3)
    params = tower.params()
    assert list(params)[0] == "context" and params["mlp/0/kernel"].shape == (2 * DIM + 3, 5)
    np.testing.assert_array_equal(params["context"].numpy(), np.zeros(3, np.float32))
    rng = np.random.default_rng(1)
    feats = {k: rng.normal(size=(2, 4, DIM)).astype(np.float32) for k in ("item_id", "age")}
    context = tf.constant([[0.0, 0.0, 0.0], [0.5, -1.0, 2.0]])
    out = tower.apply({**params, "context": context}, feats).numpy()
    x = np.concatenate([feats["item_id"], feats["age"],
                        np.broadcast_to(context.numpy()[:, None, :], (2, 4, 3))], axis=-1)
    expected = apply_dense_stack(params, "mlp", 2, tf.constant(x), activate_last=False)
    np.testing.assert_allclose(out, expected.numpy()[..., 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[0], tower.apply(params, {k: v[0] for k, v in feats.items()}),
                               rtol=1e-5, atol=1e-6)
    assert np.abs(out[1] - out[0]).max() > 1e-3
    with pytest.raises(ValueError, match="context_dim"):
        MeLUTower(["a"], ["b"], DIM, context_dim=-1)


def test_melu_linear_term_is_the_rows_last_column_summed_beside_the_mlp():
    """With ``linear`` each row has one more column, the id's weight: the MLP reads the
    first ``DIM`` columns as the tower without it does, the output adds the weights' sum,
    and the ridge solve's contract ``apply == hidden @ kernel + bias + linear_term`` holds."""
    plain = MeLUTower(["item_id"], ["age"], DIM, hidden_units=(5,), seed=2)
    linear = MeLUTower(["item_id"], ["age"], DIM, hidden_units=(5,), seed=2, linear=True)
    assert (plain.input_width, linear.input_width) == (DIM, DIM + 1)
    assert linear.get_config()["linear"] and plain.linear_term(plain.params(), {}) is None
    rng = np.random.default_rng(3)
    wide = {k: rng.normal(size=(2, 4, DIM + 1)).astype(np.float32) for k in ("item_id", "age")}
    narrow = {k: v[..., :DIM] for k, v in wide.items()}
    params = linear.params()
    for n, v in plain.params().items():
        np.testing.assert_array_equal(v.numpy(), params[n].numpy())
    out = linear.apply(params, wide).numpy()
    bias = wide["item_id"][..., DIM] + wide["age"][..., DIM]
    np.testing.assert_allclose(out, plain.apply(plain.params(), narrow).numpy() + bias,
                               rtol=1e-5, atol=1e-6)
    kernel, b = linear.output_layer
    via_hidden = (tf.squeeze(linear.hidden(params, wide) @ params[kernel], -1) + params[b]
                  + linear.linear_term(params, wide))
    np.testing.assert_allclose(out, via_hidden.numpy(), rtol=1e-5, atol=1e-6)


def test_melu_item_factors_are_read_by_the_output_layer_beside_the_mlp():
    """With ``item_factors`` the output layer's kernel has a row per item-embedding column
    after the last hidden layer's: ``out = h . w_h + e_item . w_e + b``, user features and
    the context reaching it only through the MLP; the MLP is the plain tower's."""
    plain = MeLUTower(["item_id", "genres"], ["age"], DIM, hidden_units=(5,), seed=2,
                      context_dim=3)
    factors = MeLUTower(["item_id", "genres"], ["age"], DIM, hidden_units=(5,), seed=2,
                        context_dim=3, item_factors=True)
    kernel, bias = factors.output_layer
    params = factors.params()
    assert params[kernel].shape == (5 + 2 * DIM, 1) and factors.get_config()["item_factors"]
    np.testing.assert_array_equal(params["mlp/0/kernel"].numpy(),
                                  plain.params()["mlp/0/kernel"].numpy())
    rng = np.random.default_rng(4)
    feats = {k: rng.normal(size=(2, 4, DIM)).astype(np.float32)
             for k in ("item_id", "genres", "age")}
    h = apply_dense_stack(params, "mlp", 1, tf.constant(np.concatenate(
        [feats["item_id"], feats["genres"], feats["age"], np.zeros((2, 4, 3), np.float32)],
        -1))).numpy()
    w = params[kernel].numpy()[:, 0]
    expected = (h @ w[:5] + feats["item_id"] @ w[5:5 + DIM] + feats["genres"] @ w[5 + DIM:]
                + params[bias].numpy()[0])
    np.testing.assert_allclose(factors.apply(params, feats).numpy(), expected, rtol=1e-5,
                               atol=1e-5)
    via_hidden = tf.squeeze(factors.hidden(params, feats) @ params[kernel], -1) + params[bias]
    np.testing.assert_allclose(factors.apply(params, feats).numpy(), via_hidden.numpy(),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="item_factors needs item_features"):
        MeLUTower([], ["age"], DIM, item_factors=True)


def test_embedding_penalty_is_the_mean_squared_norm_of_the_real_rows():
    rng = np.random.default_rng(5)
    rows = {"a": rng.normal(size=(2, 3, DIM)).astype(np.float32),
            "b": rng.normal(size=(2, 3, DIM)).astype(np.float32),
            "c": rng.normal(size=(2, 3, DIM)).astype(np.float32)}
    squares = (rows["a"] ** 2).sum(-1) + (rows["b"] ** 2).sum(-1)
    np.testing.assert_allclose(embedding_penalty(rows, ["a", "b"]).numpy(), squares.mean(),
                               rtol=1e-6)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    np.testing.assert_allclose(embedding_penalty(rows, ["a", "b"], mask).numpy(),
                               squares[mask > 0].mean(), rtol=1e-6)
    assert float(embedding_penalty(rows, ["a"], np.zeros((2, 3), np.float32))) == 0.0


def test_ctr_model_adds_the_embedding_penalty_in_training_only():
    emb = ShardedHashEmbedding([TableConfig("t", DIM, optimizer=Adagrad(0.1))],
                               [FeatureConfig("item_id", "t"), FeatureConfig("age", "t")])
    tower = MeLUTower(["item_id"], ["age"], DIM, hidden_units=(4,))
    model = CTRModel(emb, tower, RatingHead("rating", 3.0), embedding_l2=0.5)
    batch = {"item_id": tf.constant([1, 2, 3], tf.int64), "age": tf.constant([7, 7, 8], tf.int64),
             "rating": tf.constant([4.0, 2.0, 5.0])}
    inputs = model.tower_inputs(batch, training=True)  # inserts the ids
    plain = model._loss(batch, training=False).numpy()
    penalty = embedding_penalty(inputs, ["item_id", "age"]).numpy()
    assert penalty > 0
    np.testing.assert_allclose(model._loss(batch, training=True).numpy(), plain + 0.5 * penalty,
                               rtol=1e-5)


def test_dropped_embeddings_drop_only_the_named_rows_keeping_their_expectation():
    inputs = {"a": tf.fill([300, 400], 2.0), "b": tf.fill([300, 400], 2.0),
              "d": tf.fill([300, 3], 1.0)}
    out = dropped_embeddings(inputs, ["a"], 0.25)
    a = out["a"].numpy()
    np.testing.assert_allclose(a[a != 0.0], 2.0 / 0.75, rtol=1e-6)
    assert abs(np.mean(a == 0.0) - 0.25) < 0.01 and abs(a.mean() - 2.0) < 0.03
    assert out["b"] is inputs["b"] and out["d"] is inputs["d"]
    assert dropped_embeddings(inputs, ["a"], 0.0) == inputs


def test_ctr_model_drops_out_the_rows_its_tower_reads_in_training_only(monkeypatch):
    """``embedding_dropout``: the tower reads the dropped rows in training (here a "dropout"
    that zeroes them all, so the loss is that of zero rows), the penalty the whole ones,
    and outside training nothing is dropped."""
    from gmeta_tf.models import ctr_model
    emb = ShardedHashEmbedding([TableConfig("t", DIM, optimizer=Adagrad(0.1))],
                               [FeatureConfig("item_id", "t"), FeatureConfig("age", "t")])
    tower = MeLUTower(["item_id"], ["age"], DIM, hidden_units=(4,))
    model = CTRModel(emb, tower, RatingHead("rating", 3.0), embedding_l2=0.5,
                     embedding_dropout=0.3)
    batch = {"item_id": tf.constant([1, 2, 3], tf.int64), "age": tf.constant([7, 7, 8], tf.int64),
             "rating": tf.constant([4.0, 2.0, 5.0])}
    inputs = model.tower_inputs(batch, training=True)  # inserts the ids
    rates = []

    def zeroed(rows, names, rate):
        rates.append(rate)
        return {**rows, **{n: tf.zeros_like(rows[n]) for n in names}}

    monkeypatch.setattr(ctr_model, "dropped_embeddings", zeroed)
    labels = batch["rating"]
    zero_rows = {n: tf.zeros_like(v) for n, v in inputs.items()}
    expected = (tf.reduce_mean(model.head.row_loss(labels, tower(zero_rows))).numpy()
                + 0.5 * embedding_penalty(inputs, ["item_id", "age"]).numpy())
    np.testing.assert_allclose(model._loss(batch, training=True).numpy(), expected, rtol=1e-5)
    assert rates == [0.3]
    plain = tf.reduce_mean(model.head.row_loss(labels, tower(inputs))).numpy()
    np.testing.assert_allclose(model._loss(batch, training=False).numpy(), plain, rtol=1e-5)
    assert rates == [0.3]


@pytest.mark.parametrize("dense", [None, {"d": 3}], ids=["deepfm", "dlrm"])
def test_dlrm_interactions_are_pairwise_dots(dense):
    """With a linear top (no hidden layer) whose kernel picks one input, the logit is that
    input: each interaction input must be one pair's dot product, in (i < j) order, after
    the passthrough (the bottom vector, or every embedding without dense features)."""
    dim, names = 2, ["a", "b", "c"]
    tower = DLRMTower(names, dim, dense, bottom_units=(4,), top_units=(), seed=5)
    tower.build(None)
    rng = np.random.default_rng(0)
    feats = {n: rng.normal(size=(7, dim)).astype(np.float32) for n in names}
    feats["d"] = rng.normal(size=(7, 3)).astype(np.float32)
    params = dict(tower.params())
    if dense:
        bottom = apply_dense_stack(params, "bottom", 2, tf.constant(feats["d"])).numpy()
        vectors, passthrough = [bottom] + [feats[n] for n in names], bottom
    else:
        vectors = [feats[n] for n in names]
        passthrough = np.concatenate(vectors, axis=-1)
    pairs = [(i, j) for i in range(len(vectors)) for j in range(i + 1, len(vectors))]
    expected = np.concatenate(
        [passthrough, np.stack([(vectors[i] * vectors[j]).sum(-1) for i, j in pairs], -1)], -1)
    width = params["top/0/kernel"].shape[0]
    assert width == expected.shape[-1]
    for column in range(width):
        picked = np.zeros((width, 1), np.float32)
        picked[column, 0] = 1.0
        params.update({"top/0/kernel": tf.constant(picked), "top/0/bias": tf.zeros([1])})
        np.testing.assert_allclose(tower.apply(params, feats).numpy(), expected[:, column],
                                   rtol=1e-5, atol=1e-6, err_msg=f"top input {column}")


def test_tower_rejects_bad_config():
    with pytest.raises(ValueError, match="sparse_features is empty"):
        DLRMTower([], 4)
    with pytest.raises(ValueError, match="embedding_dim=0"):
        MeLUTower(["a"], ["b"], 0)
    with pytest.raises(ValueError, match="unknown head kind 'poisson'"):
        make_head("poisson", "y")


def test_heads_losses_and_predictions():
    labels, outputs = tf.constant([[1.0, 0.0]]), tf.constant([[2.0, -1.0]])
    mask = tf.constant([[1.0, 0.0]])
    binary = BinaryHead("y")
    np.testing.assert_allclose(binary.masked_loss(labels, outputs, mask).numpy(),
                               [np.log1p(np.exp(-2.0))], rtol=1e-6)
    rating = RatingHead("r", offset=3.0)
    np.testing.assert_allclose(rating.predict(outputs).numpy(), [[5.0, 2.0]])
    np.testing.assert_allclose(rating.masked_loss(tf.constant([[4.0, 1.0]]), outputs,
                                                  tf.ones([1, 2])).numpy(), [(1 + 1) / 2])


def test_embedding_inputs_drop_multi_hot_padding():
    out = embedding_inputs({"g": tf.constant([[3, 4, -1], [-1, -1, -1]], tf.int64),
                            "i": tf.constant([1, 2], tf.int64)}, ["g", "i"])
    assert out["g"].to_list() == [[3, 4], []]
    assert out["i"].numpy().tolist() == [1, 2]
    with pytest.raises(KeyError, match="'x' not in the batch"):
        embedding_inputs({"g": tf.constant([1])}, ["x"])


def test_ctr_model_trains_a_dlrm_tower_with_keras_fit():
    rng = np.random.default_rng(0)
    n = 2048
    item = rng.integers(0, 50, n)
    genres = np.where(rng.random((n, 3)) < 0.5, rng.integers(0, 10, (n, 3)), -1)
    price = rng.normal(size=n).astype(np.float32)
    label = ((item % 2 == 0) ^ (price > 0)).astype(np.float32)
    emb = ShardedHashEmbedding([TableConfig("t", 8, optimizer=Adagrad(0.1))],
                               [FeatureConfig("item_id", "t"),
                                FeatureConfig("genres", "t", combiner="mean")])
    model = CTRModel(emb, DLRMTower(["item_id", "genres"], 8, {"price": 1}, (8,), (16,)),
                     BinaryHead("label"))
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01))
    ds = tf.data.Dataset.from_tensor_slices({"item_id": item, "genres": genres, "price": price,
                                             "label": label}).batch(128)
    history = model.fit(ds, epochs=8, verbose=0)
    assert history.history["loss"][-1] < 0.6 * history.history["loss"][0]
    probs = model({"item_id": item[:256], "genres": genres[:256], "price": price[:256]})
    assert float(np.mean((probs.numpy() > 0.5) == label[:256])) > 0.9
