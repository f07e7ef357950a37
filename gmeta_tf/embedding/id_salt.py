"""Per-feature id salts: features that share a table never share a row by accident.

Two features looked up in one table (``device_type=1`` and ``banner_pos=1``) would read
and train the same row for equal ids. A feature with a salt has its ids mixed with it
before the lookup (``salt_ids``), so equal raw ids of different features land on
different rows; features that share an id space on purpose (``item_id`` and a
``clicked_items`` history) get the same salt, or none. The mix is stock TensorFlow ops
(xor, the SplitMix64 finalizer on uint64), so a SavedModel applies it without the op
library, and it is a bijection of int64: distinct ids of one feature stay distinct.
"""

from __future__ import annotations

import hashlib

import tensorflow as tf

_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def feature_salt(name: str) -> int:
    """A stable non-zero 63-bit salt for a feature name (the same in every process)."""
    salt = int.from_bytes(hashlib.sha256(f"gmeta-feature:{name}".encode()).digest()[:8], "little")
    return (salt & ((1 << 63) - 1)) or 1


def salt_ids(ids: tf.Tensor, salt: int) -> tf.Tensor:
    """int64 ids mixed with ``salt`` (0: unchanged)."""
    if not salt:
        return ids
    u = tf.bitcast(tf.cast(ids, tf.int64), tf.uint64)
    u = tf.bitwise.bitwise_xor(u, tf.constant(salt, tf.uint64))
    u = tf.bitwise.bitwise_xor(u, tf.bitwise.right_shift(u, tf.constant(30, tf.uint64)))
    u = u * tf.constant(_MIX1, tf.uint64)
    u = tf.bitwise.bitwise_xor(u, tf.bitwise.right_shift(u, tf.constant(27, tf.uint64)))
    u = u * tf.constant(_MIX2, tf.uint64)
    u = tf.bitwise.bitwise_xor(u, tf.bitwise.right_shift(u, tf.constant(31, tf.uint64)))
    return tf.bitcast(u, tf.int64)
