"""A rank of the hybrid-training and MixCache tests: run under horovodrun or in-process.

    python -m tests.embedding.hybrid_worker OUT_DIR

Trains the same small CTR model (two sharded tables, a dense tower, Adagrad both sides)
on the same batches five ways, each from the same initial state:

    sync   the plain layer (forward exchange in the call, fused update in the backward)
    h0     HybridTrainer, staleness 0
    h2     HybridTrainer, staleness 2, recording every batch
    h2c    as h2, with a MixCache in front of both tables
    h2w    as h2, with a cache too small to matter (capacity 1): the cold path

Each run writes its tables, dense weights, losses, collective counts, staleness metrics
and (h2, h2c, h2w) per-batch records to OUT_DIR/rank<r>.npz under the run's prefix.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.embedding import (
    Adagrad,
    FeatureConfig,
    MixCacheConfig,
    ShardedHashEmbedding,
    TableConfig,
)
from gmeta_tf.training.hybrid import HybridTrainer

GLOBAL_BATCH = 32
STEPS = 9
SPLIT_AT = 5  # h2* runs fit twice (rebalancing the caches in between): same schedule for all
RUNS = ("sync", "h0", "h2", "h2c", "h2w")
CACHES = {
    "h2c": {"a": MixCacheConfig(capacity=8, min_count=1, rebalance_every=3),
            "b": MixCacheConfig(capacity=4)},
    "h2w": {"a": MixCacheConfig(capacity=1), "b": MixCacheConfig(capacity=1)},
}


class Tower(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = tf.keras.layers.Dense(8, activation="relu")
        self.out = tf.keras.layers.Dense(1)

    def call(self, e):
        x = tf.concat([e["f1"], tf.reshape(e["f2"], [-1, 8]), e["g"]], axis=1)
        return tf.squeeze(self.out(self.hidden(x)), -1)


def global_batches(seed: int = 1) -> list[dict]:
    """The same skewed batches on every rank (Zipf ids, so some are hot)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        lengths = rng.integers(0, 4, GLOBAL_BATCH)
        out.append({
            "f1": rng.zipf(1.3, GLOBAL_BATCH).astype(np.int64) % 200,
            "f2": rng.zipf(1.3, (GLOBAL_BATCH, 2)).astype(np.int64) % 300 - 100,
            "g_values": rng.zipf(1.5, int(lengths.sum())).astype(np.int64) % 100,
            "g_lengths": lengths,
            "label": rng.normal(size=GLOBAL_BATCH).astype(np.float32),
        })
    return out


def local_share(batch: dict) -> dict:
    size, rank = distributed.size(), distributed.rank()
    lo, hi = rank * GLOBAL_BATCH // size, (rank + 1) * GLOBAL_BATCH // size
    lengths = batch["g_lengths"]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return {
        "f1": tf.constant(batch["f1"][lo:hi]),
        "f2": tf.constant(batch["f2"][lo:hi]),
        "g": tf.RaggedTensor.from_row_lengths(batch["g_values"][starts[lo]:starts[hi]],
                                              lengths[lo:hi]),
        "label": tf.constant(batch["label"][lo:hi]),
    }


def make_model(name: str, caches=None):
    tf.keras.utils.set_random_seed(0)
    emb = ShardedHashEmbedding(
        tables=[TableConfig("a", 4, optimizer=Adagrad(0.1)),
                TableConfig("b", 3, optimizer=Adagrad(0.1))],
        features=[FeatureConfig("f1", "a"), FeatureConfig("f2", "a"),
                  FeatureConfig("g", "b", combiner="mean")],
        caches=caches, name=name)
    emb.build(None)
    tower = Tower(name=f"{name}_tower")
    tower({"f1": tf.zeros([1, 4]), "f2": tf.zeros([1, 2, 4]), "g": tf.zeros([1, 3])})
    distributed.broadcast_variables(tower.trainable_variables)
    optimizer = tf.keras.optimizers.Adagrad(0.1)

    def loss_fn(embedded, batch):
        return tf.reduce_mean(tf.square(tower(embedded) - batch["label"]))

    return emb, tower, optimizer, loss_fn


def train_sync(emb, tower, optimizer, loss_fn, batches) -> list[float]:
    dense = tower.trainable_variables

    @tf.function(reduce_retracing=True)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(emb(batch, training=True), batch)
        grads = tape.gradient(loss, dense + emb.trainable_variables)
        optimizer.apply_gradients(zip(distributed.allreduce_gradients(grads[:len(dense)]), dense))
        return loss

    return [float(step(b)) for b in batches]


def run(name: str, batches: list[dict]) -> dict[str, np.ndarray]:
    emb, tower, optimizer, loss_fn = make_model(name, CACHES.get(name))
    distributed.reset_collective_counts()
    out: dict[str, np.ndarray] = {}
    if name == "sync":
        losses = train_sync(emb, tower, optimizer, loss_fn, batches)
    else:
        staleness = 0 if name == "h0" else 2
        trainer = HybridTrainer(emb, loss_fn, tower.trainable_variables, optimizer,
                                staleness=staleness, record=name != "h0")
        if name == "h0":
            trainer.fit(batches)
        else:
            trainer.fit(batches[:SPLIT_AT])
            for shard in emb.shards.values():
                if shard.cache is not None:
                    shard.rebalance()
            trainer.fit(batches[SPLIT_AT:])
        metrics = trainer.metrics()
        losses = trainer.losses
        out["staleness_hist"] = np.array(metrics["staleness_hist"])
        out["staleness_max"] = np.array(metrics["staleness_max"])
        for b, rec in enumerate(trainer.records):
            out[f"rec/{b}/applied"] = np.array(rec.applied_before_pull)
            for t, table in enumerate(("a", "b")):
                out[f"rec/{b}/{table}/ids"] = rec.unique_ids[t]
                out[f"rec/{b}/{table}/rows"] = rec.unique_rows[t]
                out[f"rec/{b}/{table}/grads"] = rec.row_grads[t]
        for table, stats in emb.cache_stats().items():
            for key, value in stats.items():
                out[f"cache/{table}/{key}"] = np.array(value)
    counts = distributed.collective_counts()
    out.update({f"count/{k}": np.array(v) for k, v in counts.items()})
    out["losses"] = np.array(losses)
    for i, v in enumerate(tower.trainable_variables):
        out[f"dense/{i}"] = v.numpy()
    for table, snap in emb.export_shards().items():
        for field, value in snap.items():
            out[f"table/{table}/{field}"] = value
    return out


def main(argv: list[str]) -> None:
    out_dir = argv[0]
    distributed.init()
    batches = [local_share(b) for b in global_batches()]
    arrays = {}
    for name in RUNS:
        arrays.update({f"{name}/{k}": v for k, v in run(name, batches).items()})
    np.savez(os.path.join(out_dir, f"rank{distributed.rank()}.npz"), **arrays)


if __name__ == "__main__":
    main(sys.argv[1:])
