"""CTRModel: embeddings + tower + head trained on plain rows (no meta-learning)."""

from __future__ import annotations

from typing import Mapping

import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.data.schema import TASK_COLUMN
from gmeta_tf.models.embedding_inputs import (dropped_embeddings, embedding_inputs,
                                              embedding_penalty)
from gmeta_tf.models.ensemble_tower import EnsembleTower
from gmeta_tf.models.heads import Head
from gmeta_tf.models.tower import Tower


class CTRModel(tf.keras.Model):
    """Plain CTR / rating model: one embedding call, the tower, a head.

    ``train_step`` takes a batch of rows ``{feature: [B] or [B, W], label: [B]}``, computes
    the gradient once for the dense weights and the embedding's update trigger (which
    applies the fused sparse optimizer on the owners of the rows), all-reduces only the
    dense gradients and applies them with the compiled Keras optimizer. ``call`` returns
    predictions (lookups without inserting).

    Args:
        embedding: A layer mapping ``{name: ids}`` to ``{name: [B, dim]}`` in one call
            (``ShardedHashEmbedding``); its gradient must go through ``trainable_variables``.
        tower: The dense tower.
        head: The head (label name, loss, prediction).
        embedding_l2: In training, this weight times the mean squared norm of the embedding
            rows a batch reads is added to the loss (``embedding_penalty``; 0: none).
        embedding_dropout: In training, the embedded rows the tower reads are dropped out
            at this rate (``dropped_embeddings``; the penalty reads them whole; 0: none).

    Example::

        model = CTRModel(embedding, DLRMTower(names, 16, {"dense": 13}), BinaryHead("label"))
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))
        model.fit(rows_dataset, epochs=1)
    """

    def __init__(self, embedding: tf.keras.layers.Layer, tower: Tower, head: Head,
                 embedding_l2: float = 0.0, within_task_loss: float = 0.0,
                 embedding_dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.embedding, self.tower, self.head = embedding, tower, head
        self.embedding_l2 = float(embedding_l2)
        self.embedding_dropout = float(embedding_dropout)
        self.within_task_loss = float(within_task_loss)
        self.tower.build(None)

    def tower_inputs(self, features: Mapping[str, tf.Tensor], training: bool) -> dict:
        """Embedded sparse features plus the raw dense features, as the tower reads them
        (training rows, which carry their ``task_id``, read out-of-fold priors)."""
        emb = self.embedding(embedding_inputs(features, self.tower.sparse_features),
                             training=training)
        tasks = features[TASK_COLUMN] if training and self.tower.out_of_fold else None
        return {**emb, **self.tower.raw_inputs(features, tasks)}

    def call(self, features: Mapping[str, tf.Tensor], training: bool = False) -> tf.Tensor:
        return self.head.predict(self.tower(self.tower_inputs(features, training)))

    def _loss(self, batch: Mapping[str, tf.Tensor], training: bool) -> tf.Tensor:
        inputs = self.tower_inputs(batch, training)
        labels = tf.cast(batch[self.head.label], tf.float32)
        tasks = batch[TASK_COLUMN] if training and self.within_task_loss else None
        return self.rows_loss(inputs, labels, training, tasks)

    def rows_loss(self, inputs: Mapping[str, tf.Tensor], labels: tf.Tensor,
                  training: bool, tasks: tf.Tensor | None = None) -> tf.Tensor:
        """The mean loss of rows given the tower's inputs, plus in training the embedding
        penalty (``embedding_l2``) and, given each row's task, ``within_task_loss`` times
        the rows' mean within-task squared error (``RatingHead.within_task_row_loss``).
        An ensemble tower's loss is the sum of its members' (each member's gradient is the
        one it would get alone; ``EnsembleTower``)."""
        read = (dropped_embeddings(inputs, self.tower.sparse_features, self.embedding_dropout)
                if training else inputs)
        if isinstance(self.tower, EnsembleTower):
            members = self.tower.member_outputs(self.tower.params(), read)
            loss = tf.add_n([tf.reduce_mean(self.head.row_loss(labels, members[..., m]))
                             for m in range(self.tower.num_members)])
        else:
            outputs = self.tower(read)
            loss = tf.reduce_mean(self.head.row_loss(labels, outputs))
            if training and self.within_task_loss and tasks is not None:
                loss += self.within_task_loss * tf.reduce_mean(
                    self.head.within_task_row_loss(labels, outputs, tasks))
        if training and self.embedding_l2:
            loss += self.embedding_l2 * embedding_penalty(inputs, self.tower.sparse_features)
        return loss

    @property
    def members(self) -> int:
        """Towers trained at once: an ensemble's members, else 1. The loss reported is
        ``rows_loss`` over this (a member's mean loss)."""
        return self.tower.num_members if isinstance(self.tower, EnsembleTower) else 1

    def train_step(self, batch):
        dense_vars = self.tower.trainable_variables
        with tf.GradientTape() as tape:
            loss = self._loss(batch, training=True)
        grads = tape.gradient(loss, dense_vars + self.embedding.trainable_variables)
        dense_grads = distributed.allreduce_gradients(grads[: len(dense_vars)])
        self.optimizer.apply_gradients(zip(dense_grads, dense_vars))
        return {"loss": loss / self.members}

    def test_step(self, batch):
        return {"loss": self._loss(batch, training=False) / self.members}
