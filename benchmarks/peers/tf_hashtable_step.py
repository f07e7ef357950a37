"""Contender: TensorFlow's own parts, put together as a competent user would.

`tf.lookup.experimental.MutableHashTable` maps id -> row; rows and the Adagrad accumulator
are two resource variables that grow by doubling. One `tf.function` per step:
deduplicate the batch (`tf.unique`), look up, insert unseen ids at the end, initialise
their rows, gather the unique rows once, expand them with a gather, take the gradient
with respect to the unique rows only (the gather's gradient folds duplicates), and apply
TensorFlow's fused sparse kernel `ResourceSparseApplyAdagradV2` to exactly those rows.
Adagrad math as Keras: accumulator starts at 0.1, acc += g^2, w -= lr * g / (sqrt(acc) + 1e-7).

Run by `python -m benchmarks.embedding_step`; alone: `python -m benchmarks.peers.tf_hashtable_step
--batch-size 4096 --features 26 --dim 16 --learning-rate 0.05 --seed 0 --steps 5`.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

from benchmarks.peers.step_worker import StepConfig, worker_main

INITIAL_ACCUMULATOR = 0.1  # Keras Adagrad's initial_accumulator_value
EPSILON = 1e-7  # Keras Adagrad's epsilon
INIT_STDDEV = 0.05  # Keras RandomNormal's default, which TFRA's layer uses for new ids
INITIAL_CAPACITY = 1 << 20


class HashTableEmbedding(tf.Module):
    """An id -> row MutableHashTable in front of growable row and accumulator variables."""

    def __init__(self, dim: int, learning_rate: float, seed: int) -> None:
        super().__init__(name="tf_hashtable_embedding")
        self.dim = dim
        self.learning_rate = learning_rate
        self.table = tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.int64, value_dtype=tf.int64, default_value=-1
        )
        # Shape [None, dim]: the variables can be reassigned larger inside the step.
        self.rows = tf.Variable(
            tf.zeros([INITIAL_CAPACITY, dim]), shape=tf.TensorShape([None, dim]), name="rows"
        )
        self.accumulator = tf.Variable(
            tf.fill([INITIAL_CAPACITY, dim], INITIAL_ACCUMULATOR),
            shape=tf.TensorShape([None, dim]),
            name="accumulator",
        )
        self.used = tf.Variable(0, dtype=tf.int64, name="used")
        self.rng = tf.random.Generator.from_seed(seed)

    def _reserve(self, needed: tf.Tensor) -> None:
        """Doubles both variables until `needed` rows fit (rare: amortised O(1) per id)."""
        capacity = tf.shape(self.rows, out_type=tf.int64)[0]

        def grow() -> tf.Tensor:
            new_capacity = tf.maximum(2 * capacity, needed)
            extra = new_capacity - capacity
            self.rows.assign(tf.concat([self.rows, tf.zeros([extra, self.dim])], axis=0))
            self.accumulator.assign(
                tf.concat([self.accumulator, tf.fill([extra, self.dim], INITIAL_ACCUMULATOR)], 0)
            )
            return new_capacity

        tf.cond(needed > capacity, grow, lambda: capacity)

    def _lookup_or_insert(self, unique_ids: tf.Tensor) -> tf.Tensor:
        """Row index of every unique id; unseen ids get fresh, initialised rows."""
        found = tf.reshape(self.table.lookup(unique_ids), [-1])
        is_new = found < 0
        new_ids = tf.boolean_mask(unique_ids, is_new)
        first = self.used.read_value()
        count = tf.size(new_ids, out_type=tf.int64)
        new_rows = first + tf.range(count, dtype=tf.int64)
        self.table.insert(new_ids, new_rows)
        self.used.assign_add(count)
        self._reserve(first + count)
        self.rows.scatter_update(
            tf.IndexedSlices(self.rng.normal([count, self.dim], stddev=INIT_STDDEV), new_rows)
        )
        rank_among_new = tf.cumsum(tf.cast(is_new, tf.int64)) - 1
        return tf.where(is_new, first + rank_among_new, found)

    @tf.function(jit_compile=False)
    def step(self, ids: tf.Tensor) -> tf.Tensor:
        unique_ids, position = tf.unique(tf.reshape(ids, [-1]))
        rows = self._lookup_or_insert(unique_ids)
        unique_emb = tf.gather(self.rows, rows)
        with tf.GradientTape() as tape:
            tape.watch(unique_emb)
            emb = tf.reshape(tf.gather(unique_emb, position), tf.concat([tf.shape(ids), [-1]], 0))
            loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, axis=[1, 2]) - 1.0))
        grad = tape.gradient(loss, unique_emb)
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=self.rows.handle,
            accum=self.accumulator.handle,
            lr=tf.constant(self.learning_rate, tf.float32),
            epsilon=tf.constant(EPSILON, tf.float32),
            grad=tf.convert_to_tensor(grad),
            indices=rows,
        )
        return loss

    def table_size(self) -> int:
        return int(self.table.size())


def build(config: StepConfig) -> tuple[HashTableEmbedding, dict]:
    layer = HashTableEmbedding(config.dim, config.learning_rate, config.seed)
    return layer, {"tensorflow": tf.__version__}


if __name__ == "__main__":
    sys.exit(worker_main("tf_hashtable", build))
