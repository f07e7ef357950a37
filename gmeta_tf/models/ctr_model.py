"""CTRModel: embeddings + tower + head trained on plain rows (no meta-learning)."""

from __future__ import annotations

from typing import Mapping

import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.data.schema import TASK_COLUMN
from gmeta_tf.models.embedding_inputs import embedding_inputs
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

    Example::

        model = CTRModel(embedding, DLRMTower(names, 16, {"dense": 13}), BinaryHead("label"))
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))
        model.fit(rows_dataset, epochs=1)
    """

    def __init__(self, embedding: tf.keras.layers.Layer, tower: Tower, head: Head, **kwargs):
        super().__init__(**kwargs)
        self.embedding, self.tower, self.head = embedding, tower, head
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
        outputs = self.tower(self.tower_inputs(batch, training))
        labels = tf.cast(batch[self.head.label], tf.float32)
        return tf.reduce_mean(self.head.row_loss(labels, outputs))

    def train_step(self, batch):
        dense_vars = self.tower.trainable_variables
        with tf.GradientTape() as tape:
            loss = self._loss(batch, training=True)
        grads = tape.gradient(loss, dense_vars + self.embedding.trainable_variables)
        dense_grads = distributed.allreduce_gradients(grads[: len(dense_vars)])
        self.optimizer.apply_gradients(zip(dense_grads, dense_vars))
        return {"loss": loss}

    def test_step(self, batch):
        return {"loss": self._loss(batch, training=False)}
