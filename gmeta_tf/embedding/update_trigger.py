"""The update trigger of the hash embedding layers, in one place.

A layer's only trainable variable is its ``update_trigger``: the loss gradient with
respect to it is always zero, and computing that gradient applies the fused sparse
optimizer to the rows the forward pass looked up. Dense optimizers and all-reduce must
not see it; :func:`dense_variables` and :func:`embedding_triggers` split a model's
trainable variables accordingly.
"""

from __future__ import annotations

import tensorflow as tf

_MARK = "_gmeta_update_trigger"


def add_update_weights(layer: tf.keras.layers.Layer) -> None:
    """Creates ``layer.update_trigger`` (marked as such) and ``layer.step`` (int64 calls)."""
    layer.update_trigger = layer.add_weight(
        name="update_trigger", shape=[], initializer="zeros", trainable=True
    )
    setattr(layer.update_trigger, _MARK, True)
    layer.step = layer.add_weight(
        name="step", shape=[], dtype=tf.int64, initializer="zeros", trainable=False
    )


def is_update_trigger(variable: tf.Variable) -> bool:
    return getattr(variable, _MARK, False)


def dense_variables(model: tf.keras.layers.Layer) -> list[tf.Variable]:
    """The model's trainable variables that a dense optimizer and all-reduce should see."""
    return [v for v in model.trainable_variables if not is_update_trigger(v)]


def embedding_triggers(model: tf.keras.layers.Layer) -> list[tf.Variable]:
    """The update triggers of the model's hash embeddings (gradient = fused update)."""
    return [v for v in model.trainable_variables if is_update_trigger(v)]
