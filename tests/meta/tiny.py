"""Tiny tasks and models shared by the meta tests and their horovodrun workers."""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from gmeta_tf.embedding import SGD, Adagrad, FeatureConfig, ShardedHashEmbedding, TableConfig  # noqa: E402
from gmeta_tf.meta import MetaConfig, MetaModel  # noqa: E402
from gmeta_tf.models import MeLUTower, RatingHead, embedding_inputs  # noqa: E402

DIM = 3
HIDDEN = 5


def tasks(num_tasks: int, support: int = 6, query: int = 4, seed: int = 0,
          multi_hot: bool = False) -> dict:
    """Random tasks in the Meta-IO layout; task t's last support row is padding."""
    rng = np.random.default_rng(seed)

    def role(n):
        out = {"user_id": np.repeat(100 + np.arange(num_tasks)[:, None], n, 1).astype(np.int64),
               "item_id": rng.integers(0, 12, (num_tasks, n)).astype(np.int64),
               "rating": rng.integers(1, 6, (num_tasks, n)).astype(np.float32),
               "mask": np.ones((num_tasks, n), np.float32)}
        if multi_hot:
            out["genres"] = rng.integers(-1, 4, (num_tasks, n, 3)).astype(np.int64)
        return out

    batch = {"task_id": np.arange(num_tasks, dtype=np.int64), "support": role(support),
             "query": role(query)}
    pad = batch["support"]
    pad["mask"][:, -1] = 0.0
    pad["item_id"][:, -1] = -1
    pad["rating"][:, -1] = 0.0
    return batch


def task_slice(batch: dict, lo: int, hi: int) -> dict:
    """Tasks lo..hi-1 of a batch."""
    return {"task_id": batch["task_id"][lo:hi],
            **{r: {k: v[lo:hi] for k, v in batch[r].items()} for r in ("support", "query")}}


def embedding(sparse_lr: float = 1.0, optimizer: str = "sgd",
              multi_hot: bool = False) -> ShardedHashEmbedding:
    opt = SGD(sparse_lr) if optimizer == "sgd" else Adagrad(sparse_lr)
    features = [FeatureConfig("user_id", "user"), FeatureConfig("item_id", "item")]
    if multi_hot:
        features.append(FeatureConfig("genres", "item", combiner="mean"))
    return ShardedHashEmbedding([TableConfig("user", DIM, optimizer=opt),
                                 TableConfig("item", DIM, optimizer=opt)], features)


def model(config: MetaConfig, sparse_lr: float = 1.0, optimizer: str = "sgd",
          multi_hot: bool = False, item_factors: bool = False,
          embedding_l2: float = 0.0, ridge_scale: float = 1.0) -> MetaModel:
    items = ["item_id", "genres"] if multi_hot else ["item_id"]
    tower = MeLUTower(items, ["user_id"], DIM, hidden_units=(HIDDEN,), seed=3,
                      item_factors=item_factors)
    return MetaModel(embedding(sparse_lr, optimizer, multi_hot), tower,
                     RatingHead("rating", offset=3.0), config, embedding_l2=embedding_l2,
                     ridge_scale=ridge_scale)


def rows_of(model: MetaModel, ids: dict) -> dict:
    """Current embedding rows of ``ids`` (read without inserting)."""
    inputs = {k: tf.constant(v, tf.int64) for k, v in ids.items()}
    for f in model.embedding.feature_configs:  # the other features: no ids at all
        empty = tf.zeros([0], tf.int64)
        inputs.setdefault(f.name, empty if f.combiner is None
                          else tf.RaggedTensor.from_row_lengths(empty, empty))
    out = model.embedding(inputs, training=False)
    return {k: out[k].numpy() for k in ids}


def insert_ids(model: MetaModel, batch: dict) -> None:
    """Inserts the batch's ids into the tables (a training forward without backward)."""
    names = model.tower.sparse_features
    ids = {n: tf.constant(np.concatenate([batch[r][n][batch[r]["mask"] > 0]
                                          for r in ("support", "query")])) for n in names}
    model.embedding(embedding_inputs(ids, names), training=True)
