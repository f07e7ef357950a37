"""DLRM on the Criteo sample: hash embeddings against tf.keras.layers.Embedding.

    python -m benchmarks.criteo_dlrm [--quick] [--seeds 3] [--epochs 3]
    horovodrun -np 2 -H localhost:2 python -m benchmarks.criteo_dlrm   # sharded tables

Both contenders share everything but the embedding: features (13 log-transformed integer
columns through the bottom MLP, 26 categorical columns hashed to int64 ids), the
DLRMTower, the binary head, the dense optimizer (Adam 1e-3), batch size and epochs. They
train on ../shared/data/criteo/train.tsv and are scored on dev.tsv (AUC, log loss):

- gmeta: ShardedHashEmbedding, one table per column, no vocabulary, fused sparse Adam
  1e-3 (the peer's optimizer, so only the embedding differs; --sparse-optimizer adagrad
  for Adagrad 0.05), under horovodrun sharded over the ranks;
- keras: per column an IntegerLookup built on the train split (unknown ids -> OOV row)
  and a tf.keras.layers.Embedding trained by the same Adam as the tower.

The last line is JSON with each contender's mean and spread of dev AUC over the seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.data import hashing
from gmeta_tf.embedding import (
    Adagrad,
    Adam,
    FeatureConfig,
    ShardedHashEmbedding,
    TableConfig,
    dense_variables,
    embedding_triggers,
)
from gmeta_tf.meta.metrics import auc, log_loss
from gmeta_tf.models import BinaryHead, DLRMTower

CRITEO = Path(__file__).resolve().parents[1].parent / "shared/data/criteo"
INT_COLUMNS = [f"I{i}" for i in range(1, 14)]
CAT_COLUMNS = [f"C{i}" for i in range(1, 27)]
DIM = 16


def load_split(name: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(features, labels) of a raw Criteo TSV split: dense [N, 13] and 26 id columns."""
    path = CRITEO / f"{name}.tsv"
    names = ["label"] + INT_COLUMNS + CAT_COLUMNS
    types = {c: pa.float64() for c in INT_COLUMNS} | {c: pa.string() for c in CAT_COLUMNS}
    table = pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=names),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
    )
    ints = np.stack([table[c].to_numpy(zero_copy_only=False) for c in INT_COLUMNS], axis=1)
    features = {"dense": np.log1p(np.maximum(np.nan_to_num(ints, nan=0.0), 0.0)).astype(np.float32)}
    for c in CAT_COLUMNS:
        features[c] = hashing.to_ids(table[c], salt=c)
    return features, table["label"].to_numpy().astype(np.float32)


def batches(features, labels, batch_size, seed, rank=0, size=1):
    """Shuffled batches of an epoch; each rank takes its contiguous share of each batch."""
    order = np.random.default_rng(seed).permutation(len(labels))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        rows = order[start:start + batch_size]
        share = rows[rank * batch_size // size:(rank + 1) * batch_size // size]
        yield {k: v[share] for k, v in features.items()}, labels[share]


class HashDLRM(tf.keras.Model):
    def __init__(self, sparse_optimizer, seed):
        super().__init__()
        self.embedding = ShardedHashEmbedding(
            [TableConfig(c, DIM, optimizer=sparse_optimizer, seed=seed) for c in CAT_COLUMNS],
            [FeatureConfig(c, c) for c in CAT_COLUMNS])
        self.tower = DLRMTower(CAT_COLUMNS, DIM, {"dense": 13}, seed=seed)

    def call(self, features, training=False):
        emb = self.embedding({c: features[c] for c in CAT_COLUMNS}, training=training)
        return self.tower({**emb, "dense": features["dense"]})


class KerasDLRM(tf.keras.Model):
    def __init__(self, train_features, seed):
        super().__init__()
        self.lookups = {c: tf.keras.layers.IntegerLookup(vocabulary=np.unique(train_features[c]),
                                                         num_oov_indices=1)
                        for c in CAT_COLUMNS}
        init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
        self.embeddings = {c: tf.keras.layers.Embedding(self.lookups[c].vocabulary_size(), DIM,
                                                        embeddings_initializer=init)
                           for c in CAT_COLUMNS}
        self.tower = DLRMTower(CAT_COLUMNS, DIM, {"dense": 13}, seed=seed)

    def call(self, features, training=False):
        emb = {c: self.embeddings[c](self.lookups[c](features[c])) for c in CAT_COLUMNS}
        return self.tower({**emb, "dense": features["dense"]})


def train_and_score(model, train, dev, epochs, batch_size, seed) -> dict[str, float]:
    head = BinaryHead("label")
    optimizer = tf.keras.optimizers.Adam(1e-3)
    rank, size = distributed.rank(), distributed.size()

    @tf.function(reduce_retracing=True)
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(head.row_loss(labels, model(features, training=True)))
        dense = dense_variables(model)
        triggers = embedding_triggers(model)
        grads = tape.gradient(loss, dense + triggers)
        dense_grads = distributed.allreduce_gradients(grads[:len(dense)])
        optimizer.apply_gradients(zip(dense_grads, dense))
        return loss

    first = next(batches(*train, batch_size, seed, rank, size))[0]
    model(first, training=False)
    distributed.broadcast_variables(dense_variables(model))
    for epoch in range(epochs):
        for features, labels in batches(*train, batch_size, seed * 1000 + epoch, rank, size):
            step(features, labels)
    scores = head.predict(model(dev[0], training=False)).numpy()
    return {"auc": auc(dev[1], scores), "log_loss": log_loss(dev[1], scores)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 1 epoch")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sparse-optimizer", choices=["adagrad", "adam"], default="adam")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs = 1, 1
    distributed.init()
    train, dev = load_split("train"), load_split("dev")
    sparse = Adagrad(0.05) if args.sparse_optimizer == "adagrad" else Adam(1e-3)
    results: dict[str, list[dict]] = {"gmeta": [], "keras": []}
    for seed in range(args.seeds):
        tf.keras.utils.set_random_seed(seed)
        results["gmeta"].append(train_and_score(HashDLRM(sparse, seed), train, dev,
                                                args.epochs, args.batch_size, seed))
        if distributed.size() == 1:  # the peer is a single-process model
            tf.keras.utils.set_random_seed(seed)
            results["keras"].append(train_and_score(KerasDLRM(train[0], seed), train, dev,
                                                    args.epochs, args.batch_size, seed))
    report = {"benchmark": "criteo_dlrm", "ranks": distributed.size(), "seeds": args.seeds,
              "epochs": args.epochs, "batch_size": args.batch_size, "dim": DIM,
              "sparse_optimizer": args.sparse_optimizer,
              "train_rows": len(train[1]), "dev_rows": len(dev[1])}
    for name, runs in results.items():
        if not runs:
            continue
        aucs = [r["auc"] for r in runs]
        report[f"dev_auc_{name}"] = round(statistics.mean(aucs), 4)
        report[f"dev_auc_{name}_spread"] = round(max(aucs) - min(aucs), 4)
        report[f"dev_logloss_{name}"] = round(statistics.mean(r["log_loss"] for r in runs), 4)
    if results["keras"]:
        report["auc_gmeta_minus_keras"] = round(report["dev_auc_gmeta"] - report["dev_auc_keras"], 4)
    if distributed.is_chief():
        print(json.dumps(report))


if __name__ == "__main__":
    main()
