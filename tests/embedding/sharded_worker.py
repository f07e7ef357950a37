"""A rank of the sharded-embedding tests: run under horovodrun or as a plain process.

    python -m tests.embedding.sharded_worker train OUT_ROOT SCENARIO... [--save CKPT_ROOT]
    python -m tests.embedding.sharded_worker restore OUT_DIR CKPT_ROOT

A scenario is ``sgd`` or ``adagrad`` (the optimizer of the tables and the dense tower) or
``skew`` (adagrad on ids that rank 0 of 2 owns alone). One launch trains every scenario
named, each a new model from the same seed with the collective counts reset, so a test
file starts the ranks once rather than once per case. Every rank draws the same global
batches and trains on its contiguous share; it writes its shard of the tables, the dense
weights, the collective counts and its predictions on one batch to
OUT_ROOT/SCENARIO/rank<r>.npz for the test to compare with a single process. ``--save``
checkpoints the adagrad scenario's model; ``restore`` reads such a checkpoint into a new
model (in a new process, on any number of ranks) and writes the same file to OUT_DIR.
"""

import argparse
import os
import sys

import numpy as np
import tensorflow as tf

from gmeta_tf import checkpoint, distributed, ops
from gmeta_tf.embedding import (
    SGD,
    Adagrad,
    FeatureConfig,
    ShardedHashEmbedding,
    TableConfig,
    dense_variables,
)

GLOBAL_BATCH = 32
STEPS = 5


class TinyCtrModel(tf.keras.Model):
    def __init__(self, sparse_optimizer):
        super().__init__()
        self.embedding = ShardedHashEmbedding(
            tables=[TableConfig("a", 4, optimizer=sparse_optimizer),
                    TableConfig("b", 3, optimizer=sparse_optimizer)],
            features=[FeatureConfig("f1", "a"), FeatureConfig("f2", "a"),
                      FeatureConfig("g", "b", combiner="mean")],
        )
        self.hidden = tf.keras.layers.Dense(8, activation="relu")
        self.out = tf.keras.layers.Dense(1)

    def call(self, features, training=None):
        e = self.embedding(features, training=training)
        x = tf.concat([e["f1"], tf.reshape(e["f2"], [-1, 8]), e["g"]], axis=1)
        return tf.squeeze(self.out(self.hidden(x)), -1)


def global_batches(seed: int, skew: bool):
    """The same batches on every rank. With skew, every id is owned by rank 0 of 2, so
    rank 1 receives no ids from anyone (empty splits)."""
    rng = np.random.default_rng(seed)
    pool = np.arange(-300, 300, dtype=np.int64)
    if skew:
        pool = pool[ops.partition_of(tf.constant(pool), 2).numpy() == 0]
    for _ in range(STEPS):
        lengths = rng.integers(0, 4, GLOBAL_BATCH)
        g = tf.RaggedTensor.from_row_lengths(rng.choice(pool, int(lengths.sum())), lengths)
        yield {
            "f1": rng.choice(pool, GLOBAL_BATCH),
            "f2": rng.choice(pool, (GLOBAL_BATCH, 2)),
            "g": g,
        }, rng.normal(size=GLOBAL_BATCH).astype(np.float32)


def local_share(features, labels):
    size, rank = distributed.size(), distributed.rank()
    lo, hi = rank * GLOBAL_BATCH // size, (rank + 1) * GLOBAL_BATCH // size
    return {k: v[lo:hi] for k, v in features.items()}, labels[lo:hi]


def make_model(optimizer_name: str):
    sparse = SGD(0.1) if optimizer_name == "sgd" else Adagrad(0.1)
    dense_opt = (tf.keras.optimizers.SGD(0.1) if optimizer_name == "sgd"
                 else tf.keras.optimizers.Adagrad(0.1))
    return TinyCtrModel(sparse), dense_opt


def train(model, dense_opt, seed: int, skew: bool):
    @tf.function(reduce_retracing=True)
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features, training=True) - labels))
        dense = dense_variables(model)
        grads = tape.gradient(loss, dense + model.embedding.trainable_variables)
        dense_grads = distributed.allreduce_gradients(grads[: len(dense)])
        dense_opt.apply_gradients(zip(dense_grads, dense))
        return loss

    first = True
    for features, labels in global_batches(seed, skew):
        features, labels = local_share(features, labels)
        if first:  # build, then start every rank from rank 0's dense weights
            model(features, training=False)
            distributed.broadcast_variables(dense_variables(model))
            first = False
        step(features, labels)


def eval_batch():
    rng = np.random.default_rng(99)
    lengths = rng.integers(0, 4, 16)
    return {
        "f1": rng.integers(-350, 350, 16),
        "f2": rng.integers(-350, 350, (16, 2)),
        "g": tf.RaggedTensor.from_row_lengths(rng.integers(-350, 350, int(lengths.sum())),
                                              lengths),
    }


def write_result(out_dir: str, model, **extra):
    arrays = {f"dense/{i}": v.numpy() for i, v in enumerate(dense_variables(model))}
    for table, snap in model.embedding.export_shards().items():
        for field, value in snap.items():
            arrays[f"table/{table}/{field}"] = value
    for name, value in distributed.collective_counts().items():
        arrays[f"count/{name}"] = np.array(value)
    for name, value in extra.items():
        arrays[name] = value
    np.savez(os.path.join(out_dir, f"rank{distributed.rank()}.npz"), **arrays)


SCENARIOS = {"sgd": ("sgd", False), "adagrad": ("adagrad", False), "skew": ("adagrad", True)}


def main(argv):
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="mode", required=True)
    train_args = commands.add_parser("train")
    train_args.add_argument("out_root")
    train_args.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    train_args.add_argument("--save", metavar="CKPT_ROOT")
    restore_args = commands.add_parser("restore")
    restore_args.add_argument("out_dir")
    restore_args.add_argument("ckpt_root")
    args = parser.parse_args(argv)
    distributed.init()
    if args.mode == "restore":
        tf.keras.utils.set_random_seed(0)
        model, _ = make_model("adagrad")
        model(eval_batch(), training=False)
        checkpoint.restore(checkpoint.latest(args.ckpt_root), model)
        write_result(args.out_dir, model, predictions=model(eval_batch(), training=False).numpy())
        return
    for scenario in args.scenarios:
        optimizer, skew = SCENARIOS[scenario]
        distributed.reset_collective_counts()
        tf.keras.backend.clear_session()  # layer names as a new process gives them
        tf.keras.utils.set_random_seed(0)
        model, dense_opt = make_model(optimizer)
        train(model, dense_opt, seed=1, skew=skew)
        if args.save and scenario == "adagrad":
            checkpoint.save(args.save, model, step=STEPS, optimizer=dense_opt)
        out_dir = os.path.join(args.out_root, scenario)
        os.makedirs(out_dir, exist_ok=True)
        write_result(out_dir, model, predictions=model(eval_batch(), training=False).numpy())


if __name__ == "__main__":
    main(sys.argv[1:])
