"""A batch of T tasks (Meta-IO layout) -> tower inputs, with ONE embedding call for it all.

Meta-IO batches (``gmeta_tf.data``) hold, per role ("support", "query"), every feature
with a leading task axis ``[T, N, ...]`` and a 0/1 ``mask`` ``[T, N]`` of real rows.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import tensorflow as tf

from gmeta_tf.data.schema import TASK_COLUMN
from gmeta_tf.models.embedding_inputs import embedding_inputs
from gmeta_tf.models.tower import Tower

ROLES = ("support", "query")


class RoleBatch(NamedTuple):
    """One role (support or query) of a task batch, ready for the tower.

    Attributes:
        inputs: Tower inputs ``{name: [T, N, ...]}``: embedded sparse features (zero rows
            at padding) and the raw dense features.
        labels: ``[T, N]`` float labels.
        mask: ``[T, N]`` 1.0 for a real row, 0.0 for padding.
        pairs: For adapted embedding features, ``{name: [T, N]}``: the index of each row's
            (task, id) pair among the batch's distinct pairs (see ``task_id_pairs``).
    """

    inputs: dict
    labels: tf.Tensor
    mask: tf.Tensor
    pairs: dict


def _real_rows(mask: tf.Tensor) -> tf.Tensor:
    """Flat indices ``[n]`` of the real rows of a ``[T, N]`` mask."""
    return tf.where(tf.reshape(mask, [-1]) > 0)[:, 0]


def _flat_rows(x: tf.Tensor) -> tf.Tensor:
    """``[T, N, ...]`` -> ``[T * N, ...]``."""
    return tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], axis=0))


def embed_tasks(embedding: tf.keras.layers.Layer, support: Mapping[str, tf.Tensor],
                query: Mapping[str, tf.Tensor], names: Sequence[str],
                training: bool) -> tuple[dict, dict]:
    """Embeds the sparse features of all support and query rows in ONE embedding call.

    Only real rows are looked up (padding rows never reach the table); the result is
    scattered back to ``[T, S, dim]`` and ``[T, Q, dim]`` with zero rows at padding, so
    the one call means one deduplication, two all-to-alls forward (ids out, rows back)
    and, in training, one back.

    Args:
        embedding: Layer mapping ``{name: ids [n] or ragged [n, None]}`` to ``{name: [n, dim]}``.
        support: The support role of a task batch (features and ``mask``).
        query: The query role.
        names: The sparse features to embed.
        training: Passed to the embedding (True inserts missing ids and trains).

    Returns:
        ``(support_embeddings, query_embeddings)``, dicts of ``[T, N, dim]``.
    """
    rows = {role: _real_rows(batch["mask"]) for role, batch in zip(ROLES, (support, query))}
    ids = {n: tf.concat([tf.gather(_flat_rows(support[n]), rows["support"]),
                         tf.gather(_flat_rows(query[n]), rows["query"])], axis=0) for n in names}
    out = embedding(embedding_inputs(ids, names), training=training)
    n_support = tf.shape(rows["support"])[0]
    result: tuple[dict, dict] = ({}, {})
    for name in names:
        parts = (out[name][:n_support], out[name][n_support:])
        for i, (role, batch) in enumerate(zip(ROLES, (support, query))):
            result[i][name] = _scatter_rows(parts[i], rows[role], tf.shape(batch["mask"]))
    return result


def _scatter_rows(values: tf.Tensor, rows: tf.Tensor, task_shape: tf.Tensor) -> tf.Tensor:
    """Rows ``[n, dim]`` at flat indices ``rows`` of a zero ``[T, N, dim]`` tensor."""
    total = task_shape[0] * task_shape[1]
    flat = tf.scatter_nd(rows[:, None], values, tf.stack([tf.cast(total, tf.int64),
                                                          tf.shape(values, tf.int64)[1]]))
    return tf.reshape(flat, tf.concat([task_shape, tf.shape(values)[1:]], axis=0))


def task_id_pairs(support_ids: tf.Tensor, query_ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor,
                                                                          tf.Tensor]:
    """Indexes the distinct (task, id) pairs of one single-valued feature.

    Args:
        support_ids: ``[T, S]`` ids.
        query_ids: ``[T, Q]`` ids.

    Returns:
        ``(support_index [T, S], query_index [T, Q], num_pairs)``: rows of the same task
        with the same id share an index, rows of different tasks never do.
    """
    def keyed(ids):
        task = tf.broadcast_to(tf.range(tf.shape(ids, tf.int64)[0])[:, None], tf.shape(ids))
        return tf.stack([tf.reshape(task, [-1]), tf.reshape(tf.cast(ids, tf.int64), [-1])], 1)

    keys = tf.concat([keyed(support_ids), keyed(query_ids)], axis=0)
    unique, index = tf.raw_ops.UniqueV2(x=keys, axis=[0], out_idx=tf.int32)
    n_support = tf.size(support_ids)
    return (tf.reshape(index[:n_support], tf.shape(support_ids)),
            tf.reshape(index[n_support:], tf.shape(query_ids)), tf.shape(unique)[0])


def role_batches(embedding: tf.keras.layers.Layer, tower: Tower, label: str,
                 batch: Mapping[str, Mapping[str, tf.Tensor]], training: bool,
                 adapted_embeddings: Sequence[str] = ()) -> tuple[RoleBatch, RoleBatch, dict]:
    """Support and query ``RoleBatch`` of a task batch (one embedding call).

    Returns:
        ``(support, query, num_pairs)``, ``num_pairs`` mapping each adapted embedding
        feature to its number of distinct (task, id) pairs.
    """
    support, query = batch["support"], batch["query"]
    for role in ROLES:
        missing = [k for k in (*tower.feature_names, label, "mask") if k not in batch[role]]
        if missing:
            raise KeyError(f"task batch role {role!r} lacks {missing}; it has "
                           f"{sorted(batch[role])}")
    emb = embed_tasks(embedding, support, query, tower.sparse_features, training)
    pairs: tuple[dict, dict] = ({}, {})
    num_pairs = {}
    for name in adapted_embeddings:
        pairs[0][name], pairs[1][name], num_pairs[name] = task_id_pairs(support[name], query[name])
    # Training tasks' rows read out-of-fold priors; evaluation tasks' the whole one.
    tasks = (tf.convert_to_tensor(batch[TASK_COLUMN])[:, None]
             if training and tower.out_of_fold else None)
    out = []
    for i, role_batch in enumerate((support, query)):
        inputs = {**emb[i], **tower.raw_inputs(role_batch, tasks)}
        out.append(RoleBatch(inputs, tf.cast(role_batch[label], tf.float32),
                             tf.cast(role_batch["mask"], tf.float32), pairs[i]))
    return out[0], out[1], num_pairs


def task_rows(batch: Mapping[str, Mapping[str, tf.Tensor]]) -> dict:
    """The real rows of a task batch, support and query alike, as one row batch.

    ``{name: [T, N, ...]}`` per role -> ``{name: [n, ...]}`` (what ``CTRModel`` trains on):
    how the non-meta baseline sees the same warm data.
    """
    support, query = batch["support"], batch["query"]
    rows = {role: _real_rows(batch[role]["mask"]) for role in ROLES}
    names = [k for k in support if k != "mask"]
    out = {n: tf.concat([tf.gather(_flat_rows(support[n]), rows["support"]),
                         tf.gather(_flat_rows(query[n]), rows["query"])], axis=0) for n in names}
    if TASK_COLUMN in batch:  # each row's task, as plain row batches carry it
        tasks = tf.convert_to_tensor(batch[TASK_COLUMN])
        out[TASK_COLUMN] = tf.concat(
            [tf.gather(tf.repeat(tasks, tf.shape(batch[role]["mask"])[1]), rows[role])
             for role in ROLES], axis=0)
    return out
