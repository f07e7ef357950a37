"""Dense layers as pure functions of their weights, so weights may carry a task axis.

A weight is either the tower's own variable (shared by every row) or a tensor with one
extra leading axis of size T: one copy per task (batched fast weights). Inputs are then
``[T, N, ...]``: task ``t``'s rows go through task ``t``'s copy, in one batched matmul.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import tensorflow as tf

Params = Mapping[str, tf.Tensor]


def dense(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """``x @ kernel + bias`` for shared or per-task weights.

    Args:
        x: ``[..., in]``; with per-task weights ``[T, N, in]``.
        kernel: ``[in, out]`` (shared) or ``[T, in, out]`` (per task).
        bias: ``[out]`` (shared) or ``[T, out]`` (per task).

    Returns:
        ``[..., out]``.
    """
    if kernel.shape.rank == 3:
        y = tf.matmul(x, kernel)
    else:
        y = tf.tensordot(x, kernel, axes=[[x.shape.rank - 1], [0]])
    if bias.shape.rank == 2:
        bias = bias[:, None, :]  # per-task bias over the task's N rows
    return y + bias


def layer_names(prefix: str, num_layers: int) -> list[tuple[str, str]]:
    """``(kernel, bias)`` parameter names of a stack: ``prefix/0/kernel`` etc."""
    return [(f"{prefix}/{i}/kernel", f"{prefix}/{i}/bias") for i in range(num_layers)]


def add_dense_stack(layer: tf.keras.layers.Layer, prefix: str, input_dim: int,
                    units: Sequence[int], seed: int) -> dict[str, tf.Variable]:
    """Creates the weights of a stack of dense layers on ``layer`` (Glorot-uniform kernels).

    Returns:
        Parameter name -> variable, in layer order.
    """
    out: dict[str, tf.Variable] = {}
    fan_in = input_dim
    for i, ((k, b), width) in enumerate(zip(layer_names(prefix, len(units)), units)):
        init = tf.keras.initializers.GlorotUniform(seed=seed * 1000 + i)
        out[k] = layer.add_weight(name=k, shape=[fan_in, width], initializer=init)
        out[b] = layer.add_weight(name=b, shape=[width], initializer="zeros")
        fan_in = width
    return out


def apply_dense_stack(params: Params, prefix: str, num_layers: int, x: tf.Tensor,
                      activation: Callable[[tf.Tensor], tf.Tensor] = tf.nn.relu,
                      activate_last: bool = True) -> tf.Tensor:
    """Runs ``x`` through the stack ``prefix`` of ``params`` (see ``dense``)."""
    for i, (k, b) in enumerate(layer_names(prefix, num_layers)):
        x = dense(x, params[k], params[b])
        if activate_last or i < num_layers - 1:
            x = activation(x)
    return x
