"""Turning raw categorical values into int64 sparse ids, the same way in every converter.

* Spaces around a value are dropped (``" 42 "`` is ``"42"``), in conversion and in
  serving alike.
* A value that is a non-negative decimal integer (``"42"``) keeps its value, so numeric
  ids stay readable; leading zeros do not count (``"007"`` is 7, the id of ``"7"``).
* Any other value is hashed: farmhash Fingerprint64 (``tf.strings.to_hash_bucket_fast``)
  of ``"<salt>=<value>"`` modulo 2**63 - 1, a stable non-negative int64. The salt (usually
  the column name) keeps equal strings of different columns apart. A negative integer
  (``"-1"``, as Avazu's ``C20`` writes an unknown) is hashed too: negative ids mark
  padding (``PAD_ID``: unused multi-hot slots, padding rows), which multi-hot lookups
  drop and the linear reference weighs 0, where a single-valued feature's -1 would still
  be embedded by the model.
* A missing value (null, empty, or NaN in a column of floats, as pandas reads a column of
  ids with gaps) is id 0.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MISSING_ID = 0
_INT_PATTERN = r"^[0-9]{1,18}$"


def _fingerprint(values: list[str], salt: str) -> np.ndarray:
    if not values:  # a column of integer ids: nothing to hash, no TensorFlow to import
        return np.zeros(0, np.int64)
    import tensorflow as tf

    salted = tf.constant([f"{salt}={v}" for v in values])
    return tf.strings.to_hash_bucket_fast(salted, 2**63 - 1).numpy()


def to_ids(values, salt: str) -> np.ndarray:
    """Maps a column of raw categorical values to int64 ids (see module docstring).

    Args:
        values: Integer or string values, nulls (None) allowed: a pyarrow array, or any
            sequence pyarrow reads as one (a list, a NumPy array), e.g. the values of one
            CSV column for a serving request.
        salt: Mixed into hashes: the column's name, as the conversion used it.

    Returns:
        int64 array of the same length.

    Raises:
        TypeError: ``values`` mixes strings and numbers, or is not a sequence of values.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    elif not isinstance(values, pa.Array):
        try:
            values = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
            raise TypeError(f"to_ids: expected one column's values, all strings or all "
                            f"integers (None for a missing one), got {values!r:.200} ({err})"
                            ) from err
    if pa.types.is_floating(values.type):  # pandas' column of ids with a gap: NaN is missing
        values = pc.if_else(pc.is_nan(values), pa.scalar(None, values.type), values)
    if pa.types.is_null(values.type) or values.null_count == len(values):  # every one missing
        return np.full(len(values), MISSING_ID, np.int64)
    if pa.types.is_integer(values.type):
        ids = values.cast(pa.int64()).fill_null(MISSING_ID).to_numpy(zero_copy_only=False)
        negative = ids < 0
        if not negative.any():
            return ids
        ids = ids.copy()
        words, at = np.unique(ids[negative], return_inverse=True)
        ids[negative] = _fingerprint([str(w) for w in words], salt)[at]
        return ids
    values = pc.utf8_trim_whitespace(values.cast(pa.string()))
    encoded = pc.dictionary_encode(values)
    words = encoded.dictionary
    is_int = pc.match_substring_regex(words, _INT_PATTERN).to_numpy(zero_copy_only=False)
    word_ids = np.zeros(len(words), np.int64)
    if is_int.any():
        word_ids[is_int] = pc.cast(words.filter(pa.array(is_int)), pa.int64()).to_numpy()
    others = np.flatnonzero(~is_int)
    word_ids[others] = _fingerprint([words[int(i)].as_py() for i in others], salt)
    word_ids[np.flatnonzero(pc.equal(words, "").to_numpy(zero_copy_only=False))] = MISSING_ID
    indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    return np.where(indices >= 0, word_ids[np.maximum(indices, 0)], MISSING_ID).astype(np.int64)


def to_slots(values: pa.Array | pa.ChunkedArray, salt: str, separator: str,
             width: int) -> tuple[np.ndarray, int]:
    """Splits a multi-valued string column (``"a|b|c"``) into fixed-width id slots.

    Args:
        values: Strings of ``separator``-joined values; null or empty means no value.
        salt: Mixed into hashes (use the column name).
        separator: The value separator.
        width: Number of slots; rows with more values keep the first ``width``.

    Returns:
        ``(slots, truncated)``: int64 ``[rows, width]`` padded with ``PAD_ID`` (-1), and the
        number of rows that had more than ``width`` values.
    """
    from gmeta_tf.data.schema import PAD_ID

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    values = values.cast(pa.string()).fill_null("")
    lists = pc.split_pattern(values, separator)
    flat = pc.utf8_trim_whitespace(pc.list_flatten(lists))
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    ids = to_ids(flat, salt)
    keep = pc.not_equal(flat, "").to_numpy(zero_copy_only=False)
    row = np.repeat(np.arange(len(values)), lengths)[keep]
    ids = ids[keep]
    starts = np.searchsorted(row, np.arange(len(values)))
    pos = np.arange(len(row)) - starts[row]
    slots = np.full((len(values), width), PAD_ID, np.int64)
    fits = pos < width
    slots[row[fits], pos[fits]] = ids[fits]
    truncated = int(np.unique(row[~fits]).size)
    return slots, truncated
