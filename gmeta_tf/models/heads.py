"""Heads: how a tower's raw output becomes a prediction and a loss, for each label type."""

from __future__ import annotations

import tensorflow as tf

HEAD_KINDS = ("binary", "rating")


class Head:
    """Base head: per-row loss and prediction of a tower's raw output.

    Args:
        label: Name of the label feature in a batch.
    """

    kind: str = ""

    def __init__(self, label: str) -> None:
        self.label = label

    def row_loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        """Loss of every row, same shape as ``outputs``."""
        raise NotImplementedError

    def predict(self, outputs: tf.Tensor) -> tf.Tensor:
        """The prediction of every row (a probability or a rating)."""
        raise NotImplementedError

    def masked_loss(self, labels: tf.Tensor, outputs: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        """Mean loss of the real rows of every task: ``[T, N]`` -> ``[T]``.

        Padding rows (mask 0) count for nothing; a task without real rows has loss 0.
        """
        mask = tf.cast(mask, tf.float32)
        total = tf.reduce_sum(self.row_loss(tf.cast(labels, tf.float32), outputs) * mask, axis=-1)
        return total / tf.maximum(tf.reduce_sum(mask, axis=-1), 1.0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(label={self.label!r})"


class BinaryHead(Head):
    """Binary labels (click, rating >= 4): sigmoid of a logit, log loss."""

    kind = "binary"

    def row_loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=outputs)

    def predict(self, outputs: tf.Tensor) -> tf.Tensor:
        return tf.sigmoid(outputs)


class RatingHead(Head):
    """Ratings: the output plus a constant offset (e.g. the mean rating), squared error.

    Args:
        label: Name of the rating label.
        offset: Added to the tower's output, so a fresh tower predicts about the mean.
    """

    kind = "rating"

    def __init__(self, label: str, offset: float = 0.0) -> None:
        super().__init__(label)
        self.offset = float(offset)

    def row_loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        return tf.square(self.predict(outputs) - labels)

    def predict(self, outputs: tf.Tensor) -> tf.Tensor:
        return outputs + self.offset

    def within_task_loss(self, labels: tf.Tensor, outputs: tf.Tensor,
                         mask: tf.Tensor) -> tf.Tensor:
        """Each task's within-task squared error over its real rows, ``[T, N]`` -> ``[T]``:
        predictions and labels each centred on their mean over the task's real rows, so a
        task's level does not count, only its rows' order and spacing. A task's squared
        error (``masked_loss``) is its level error squared plus this. Padding rows count
        for nothing; a task with fewer than two real rows has loss 0."""
        mask = tf.cast(mask, tf.float32)
        count = tf.maximum(tf.reduce_sum(mask, axis=-1, keepdims=True), 1.0)
        error = self.predict(outputs) - tf.cast(labels, tf.float32)
        centred = (error - tf.reduce_sum(error * mask, axis=-1, keepdims=True) / count) * mask
        return tf.reduce_sum(tf.square(centred), axis=-1) / count[..., 0]

    def within_task_row_loss(self, labels: tf.Tensor, outputs: tf.Tensor,
                             tasks: tf.Tensor) -> tf.Tensor:
        """``within_task_loss`` of a row batch, each row's task in ``tasks`` ``[B]``: every
        row's error centred on its task's mean error in the batch, squared, ``[B]``."""
        error = self.predict(outputs) - tf.cast(labels, tf.float32)
        distinct, task = tf.unique(tf.reshape(tasks, [-1]))
        n = tf.size(distinct)
        count = tf.math.unsorted_segment_sum(tf.ones_like(error), task, n)
        mean = tf.math.unsorted_segment_sum(error, task, n) / tf.maximum(count, 1.0)
        return tf.square(error - tf.gather(mean, task))


def make_head(kind: str, label: str, **kwargs) -> Head:
    """A head by kind name ("binary" or "rating").

    Raises:
        ValueError: Unknown kind.
    """
    if kind == "binary":
        return BinaryHead(label, **kwargs)
    if kind == "rating":
        return RatingHead(label, **kwargs)
    raise ValueError(f"unknown head kind {kind!r}, expected one of {HEAD_KINDS}")
