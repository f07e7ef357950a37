"""HashEmbedding trains with GradientTape (eager and tf.function) like a dense embedding."""

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.embedding import Adagrad, HashEmbedding
from tests.embedding.reference import initial_row


def _batches(steps, batch=32, features=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(-40, 40, size=(batch, features)).astype(np.int64) for _ in range(steps)]


def _loss(emb):
    return tf.reduce_mean(tf.square(tf.reduce_sum(emb, axis=[1, 2]) - 1.0))


def _dense_reference(batches, dim, lr):
    """The same training on a dense tf.Variable holding the same initial rows, with Keras
    Adagrad: what HashEmbedding must reproduce."""
    vocab = np.unique(np.concatenate([b.ravel() for b in batches]))
    table = tf.Variable(np.stack([initial_row(int(k), dim) for k in vocab]))
    opt = tf.keras.optimizers.Adagrad(lr, initial_accumulator_value=0.1, epsilon=1e-7)
    for b in batches:
        with tf.GradientTape() as tape:
            loss = _loss(tf.gather(table, np.searchsorted(vocab, b)))
        opt.apply_gradients([(tape.gradient(loss, table), table)])
    return vocab, table.numpy()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_training_matches_a_dense_embedding_with_keras_adagrad(compiled):
    batches, dim, lr = _batches(6), 4, 0.05
    layer = HashEmbedding(dim, optimizer=Adagrad(lr))

    def step(ids):
        with tf.GradientTape() as tape:
            loss = _loss(layer(ids))
        grads = tape.gradient(loss, layer.trainable_variables)
        return loss, grads

    step = tf.function(step) if compiled else step
    for b in batches:
        _, grads = step(tf.constant(b))
        assert all(float(tf.reduce_sum(tf.abs(g))) == 0.0 for g in grads)
    vocab, expected = _dense_reference(batches, dim, lr)
    snap = layer.table.export()
    np.testing.assert_array_equal(snap.ids.numpy(), vocab)
    np.testing.assert_allclose(snap.values.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_keras_fit_trains_the_table_and_a_dense_head():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 200, size=(2048, 2)).astype(np.int64)
    labels = (ids[:, 0] % 2 == 0).astype(np.float32)
    model = tf.keras.Sequential([
        HashEmbedding(8, optimizer=Adagrad(0.2)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="binary_crossentropy",
                  metrics=["accuracy"])
    history = model.fit(ids, labels, batch_size=128, epochs=6, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert history.history["accuracy"][-1] > 0.95
    assert int(model.layers[0].table_size()) == len(np.unique(ids))


def test_inference_reads_without_inserting():
    layer = HashEmbedding(3)
    layer(tf.constant([[1, 2]], tf.int64))
    out = layer(tf.constant([[1, 99]], tf.int64), training=False).numpy()
    np.testing.assert_array_equal(out[0, 0], initial_row(1, 3))
    np.testing.assert_array_equal(out[0, 1], np.zeros(3))
    assert int(layer.table_size()) == 2


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_multi_hot_combiners_for_ragged_sparse_and_dense_inputs(combiner):
    rows = [[1, 2, 3], [4], [], [2, 2]]
    layer = HashEmbedding(5, combiner=combiner)
    ragged = layer(tf.ragged.constant(rows, dtype=tf.int64)).numpy()
    sparse = layer(tf.ragged.constant(rows, dtype=tf.int64).to_sparse()).numpy()
    reduce = np.sum if combiner == "sum" else np.mean
    expected = np.stack([
        reduce([initial_row(k, 5) for k in r], axis=0) if r else np.zeros(5, np.float32)
        for r in rows
    ])
    np.testing.assert_allclose(ragged, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(sparse, expected, rtol=1e-6, atol=1e-7)
    dense = layer(tf.constant([[1, 2, 3]], tf.int64)).numpy()
    np.testing.assert_allclose(dense[0], expected[0], rtol=1e-6, atol=1e-7)


def test_ragged_input_needs_a_combiner():
    with pytest.raises(ValueError, match="combiner"):
        HashEmbedding(2)(tf.ragged.constant([[1], [2, 3]], dtype=tf.int64))


def test_checkpoint_round_trip_restores_rows_slots_and_counters(tmp_path):
    layer = HashEmbedding(4, optimizer=Adagrad(0.1))
    for b in _batches(3):
        with tf.GradientTape() as tape:
            loss = _loss(layer(tf.constant(b)))
        tape.gradient(loss, layer.trainable_variables)
    path = tf.train.Checkpoint(embedding=layer).save(str(tmp_path / "ckpt"))

    restored = HashEmbedding(4, optimizer=Adagrad(0.1))
    restored(tf.constant([[1000]], tf.int64))  # builds it; this row must disappear
    tf.train.Checkpoint(embedding=restored).restore(path).assert_consumed()
    for a, b in zip(layer.table.export(), restored.table.export()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(restored.step) == int(layer.step) == 3
