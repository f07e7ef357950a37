"""Starts a plain model at the linear model (``model.start_from_linear``).

On a small click log a deep CTR model's standing against a logistic regression on the
same features is decided by its initial weights and batch order as much as by its design
(``docs/measured.md``). Started from the logistic regression itself, it begins level with
it and, validated before its first step, keeps that checkpoint unless training improves on
it: the wide part of Wide & Deep, fitted first.

The linear model is the one ``gmeta eval`` reports as the "logistic regression"
reference (``references.fit_linear``: the same rows in the same order, the same seed, its
L2 penalty and epoch count chosen on the validation rows). Every rank fits it on the
whole training split (rows, not tables: for logs that fit in one process's memory) and
then:

- puts each training id's weight in the linear column of its row (``Tower.linear_term``
  reads column ``embedding_dim``); the row's embedding columns are the table's own
  initial values for that id (a function of the table seed and the id), so only the
  linear column differs from a run started without it. Each rank keeps the ids it owns.
  Ids two features share (a table with ``shared_ids``) get the mean of their weights;
- sets the dense inputs' linear weights (DLRM's ``linear/dense``) and the output bias;
- zeroes the kernel of the deep part's last layer (``Tower.final_layer``): the deep part
  then adds nothing until training moves it, and the model's logit is the linear model's.

The dense weights are broadcast from rank 0 with the others before the first step.

An id the training rows never had weighs nothing in either: the model reads its table's
default row (0), and the reference gives no weight to an id outside its vocabulary (it
used to read the weight of any training id sharing the id's hashed column; on an
Avazu-shaped log 57 of 746 validation rows then differed). So the started model scores
every row as the reference does, up to float32 rounding, but in a table whose features
share ids (``shared_ids``): there an id holds the mean of its features' weights, and an id
one feature never had reads another feature's weight.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

from gmeta_tf import data as meta_io
from gmeta_tf import distributed
from gmeta_tf.config import PipelineConfig
from gmeta_tf.embedding import table_ops
from gmeta_tf.embedding.id_salt import salt_ids
from gmeta_tf.models.ctr_model import CTRModel
from gmeta_tf.training.evaluation import ROWS_PER_READ, reference_data, split_dataset
from gmeta_tf.training.model_builder import Models
from gmeta_tf.training.references import LinearModel, fit_linear, rows_of

log = logging.getLogger(__name__)


def _rows(config: PipelineConfig, split: str, names: list[str]) -> dict:
    """Every row of a split (not this rank's shard), in file order (as ``gmeta eval`` reads
    it for the references: the order of the rows does not depend on the rows per read)."""
    dataset = split_dataset(config, split, features=names, whole=True)
    return rows_of(dataset.rows(ROWS_PER_READ), names)


def fit_start(models: Models, config: PipelineConfig) -> tuple[LinearModel, dict, dict]:
    """The linear model the run starts from, its chosen settings, and the training rows
    it was fitted on."""
    data = reference_data(config, models)
    names = sorted({data.label, *data.sparse, *data.dense})
    train = _rows(config, "warm", names)
    valid = _rows(config, config.train.validation_split, names)
    if not len(train[data.label]) or not len(valid[data.label]):
        raise meta_io.DataError(
            f"{config.data.path}: model.start_from_linear needs training and validation "
            f"rows to fit the linear model on (warm: {len(train[data.label])} rows, "
            f"{config.train.validation_split}: {len(valid[data.label])})")
    linear, chosen = fit_linear(data, train, valid, seed=config.model.seed)
    return linear, chosen, train


def start_from_linear(models: Models, config: PipelineConfig) -> dict:
    """Puts the fitted linear model into ``models.model`` (a fresh plain model); returns
    the linear model's chosen settings."""
    model = models.model
    if not isinstance(model, CTRModel):
        raise TypeError(f"start_from_linear needs a plain CTRModel, got {type(model).__name__}")
    linear, chosen, train = fit_start(models, config)
    tower, embedding = model.tower, model.embedding
    column = tower.embedding_dim
    by_table: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for feature in embedding.feature_configs:
        if feature.name not in tower.sparse_features:
            continue
        ids = np.asarray(train[feature.name]).astype(np.int64).reshape(-1)
        ids = np.unique(ids[ids >= 0])  # the linear model's present ids (padding is < 0)
        keys = salt_ids(tf.constant(ids, tf.int64), feature.id_salt).numpy()
        by_table.setdefault(feature.table, []).append((keys, linear.id_weights(feature.name,
                                                                                ids)))
    rows = 0
    for table, parts in by_table.items():
        keys = np.concatenate([k for k, _ in parts])
        weights = np.concatenate([w for _, w in parts])
        keys, inverse = np.unique(keys, return_inverse=True)
        weights = (np.bincount(inverse, weights=weights, minlength=len(keys))
                   / np.bincount(inverse, minlength=len(keys)))  # shared ids: the mean
        rows += _set_linear_column(embedding.shards[table], keys, weights, column)
    params = tower.params()
    if "linear/dense" in params:
        params["linear/dense"].assign(linear.dense_weights.astype(np.float32))
    kernel, bias = tower.final_layer
    params[kernel].assign(tf.zeros_like(params[kernel]))
    params[bias].assign(tf.fill(tf.shape(params[bias]), tf.constant(linear.bias, tf.float32)))
    log.info("start_from_linear: the model starts at the linear model (%s), fitted on %d "
             "training rows; %d rows of the tables on this rank hold its id weights",
             ", ".join(f"{k} {v:g}" for k, v in chosen.items()), len(train[linear.data.label]),
             rows)
    return chosen


def _set_linear_column(shard, keys: np.ndarray, weights: np.ndarray, column: int) -> int:
    """Inserts ``keys`` into a fresh shard with the table's initial rows and ``weights`` in
    their linear column, keeping the keys this rank owns; returns how many it keeps."""
    shard.lookup_or_insert(tf.constant(keys, tf.int64))  # the table's own initial rows
    snapshot = shard.export()
    ids = snapshot.ids.numpy()
    order = np.argsort(ids)
    at = order[np.minimum(np.searchsorted(ids[order], keys), len(ids) - 1)]
    if not np.array_equal(ids[at], keys):
        raise RuntimeError(f"table {shard.name}: {int((ids[at] != keys).sum())} of the "
                           f"linear model's ids got no row")
    values = snapshot.values.numpy().copy()
    values[at, column] = weights
    shard.import_(table_ops.TableSnapshot(**{**snapshot._asdict(),
                                             "values": tf.constant(values)}),
                  clear_first=True, shard_index=distributed.rank(),
                  num_shards=distributed.size())
    return int(shard.num_rows())
