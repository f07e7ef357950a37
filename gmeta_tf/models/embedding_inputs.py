"""Batch features -> inputs of an embedding layer: multi-hot padding removed."""

from __future__ import annotations

from typing import Mapping, Sequence

import tensorflow as tf

PAD_ID = -1  # gmeta_tf.data.PAD_ID: unused multi-hot slots and padding rows


def embedding_inputs(features: Mapping[str, tf.Tensor], names: Sequence[str]) -> dict:
    """The id tensors of ``names`` as an embedding layer takes them.

    A single-valued feature ``[N]`` passes unchanged; a multi-hot feature ``[N, W]`` whose
    unused slots hold ``PAD_ID`` becomes a ``tf.RaggedTensor`` ``[N, None]`` of its real
    ids, so padding is never looked up (nor inserted) and a mean combiner averages only
    real ids.

    Raises:
        KeyError: A name is not in ``features``.
        ValueError: A feature has rank other than 1 or 2.
    """
    out = {}
    for name in names:
        if name not in features:
            raise KeyError(f"feature {name!r} not in the batch; it has {sorted(features)}")
        ids = features[name]
        if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
            out[name] = ids
            continue
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank == 1:
            out[name] = ids
        elif ids.shape.rank == 2:
            out[name] = _drop_padding(ids)
        else:
            raise ValueError(f"feature {name!r} has shape {ids.shape}, expected [N] or [N, W]")
    return out


def _drop_padding(ids: tf.Tensor) -> tf.RaggedTensor:
    real = tf.not_equal(ids, PAD_ID)
    return tf.RaggedTensor.from_row_lengths(
        tf.boolean_mask(ids, real), tf.reduce_sum(tf.cast(real, tf.int64), axis=1))


def embedding_penalty(inputs: Mapping[str, tf.Tensor], names: Sequence[str],
                      mask: tf.Tensor | None = None) -> tf.Tensor:
    """The mean over rows of the summed squared embedding rows of ``names``: an L2 penalty
    on the rows a batch reads, so an id's row is pulled toward zero in proportion to how
    often it is read (mini-batch aware regularisation, Zhou et al. KDD 2018, "Deep Interest
    Network"): a rare item's row, trained on a few ratings, stays near zero until they
    agree.

    Args:
        inputs: Embedded features ``{name: [..., dim]}`` (``names`` among them).
        names: The embedded features penalised.
        mask: ``[...]`` 1.0 for a real row and 0.0 for padding (None: every row is real).
    """
    squares = tf.add_n([tf.reduce_sum(tf.square(inputs[n]), axis=-1) for n in names])
    if mask is None:
        return tf.reduce_mean(squares)
    mask = tf.cast(mask, squares.dtype)
    return tf.reduce_sum(squares * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)


def dropped_embeddings(inputs: Mapping[str, tf.Tensor], names: Sequence[str],
                       rate: float) -> dict:
    """``inputs`` with every element of the embedded features ``names`` zeroed with
    probability ``rate`` and the rest scaled by ``1 / (1 - rate)`` (dropout, Srivastava et
    al. JMLR 2014, on the rows the tower reads); other inputs as they are. ``rate`` 0:
    ``inputs`` unchanged."""
    if not rate:
        return dict(inputs)
    return {**inputs, **{n: tf.nn.dropout(inputs[n], rate) for n in names}}
