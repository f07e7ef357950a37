"""``hashing.to_ids``: raw categorical values -> int64 ids, alike in every converter."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from gmeta_tf.data import PAD_ID, hashing


def test_non_negative_integers_keep_their_value_and_the_rest_is_hashed_alike():
    """A non-negative integer keeps its value; a negative one (Avazu's C20 writes an
    unknown as -1) is hashed as text is, never left negative, where it would read as
    padding (``PAD_ID``); the same value as text or as an integer column gets the same id;
    an empty cell is id 0."""
    text = hashing.to_ids(pa.array(["-1", "5", "", "abc", "-1", None, "100084"]), "C20")
    assert text[1] == 5 and text[6] == 100084 and text[2] == text[5] == hashing.MISSING_ID
    assert (text >= 0).all() and text[0] == text[4] and text[0] not in (1, PAD_ID, -1)
    assert text[3] not in (text[0], 0)
    ints = hashing.to_ids(pa.array([-1, 5, None, 100084, -2], pa.int64()), "C20")
    np.testing.assert_array_equal(ints[:4], [text[0], 5, 0, 100084])
    assert ints[4] >= 0 and ints[4] != ints[0]
    # salted with the column: the same value of two columns is two ids
    assert hashing.to_ids(pa.array(["-1"]), "C19")[0] != text[0]


def test_a_plain_list_or_array_is_hashed_as_the_column_it_came_from():
    """A serving client holds a request's values as a list: the ids are the conversion's."""
    column = ["s1a2", "12", "", None, "-1"]
    np.testing.assert_array_equal(hashing.to_ids(column, "site_id"),
                                  hashing.to_ids(pa.array(column), "site_id"))
    np.testing.assert_array_equal(hashing.to_ids(np.array([3, 7]), "c1"), [3, 7])
    np.testing.assert_array_equal(hashing.to_ids([None, None], "c1"), [0, 0])
    with pytest.raises(TypeError, match="to_ids: expected one column's values"):
        hashing.to_ids(["a", 1], "c1")


def test_spaces_around_a_value_and_leading_zeros_read_as_the_conversion_reads_them():
    """A serving client's raw values give the ids the converter stored: spaces around a
    value dropped (the converter trims every cell), an integer with leading zeros its
    value; a multi-hot cell's values trimmed the same way."""
    np.testing.assert_array_equal(hashing.to_ids([" 7", "7 ", "007", "7"], "item_id"),
                                  [7, 7, 7, 7])
    spaced = hashing.to_ids([" u186 ", "u186", "  "], "user_id")
    assert spaced[0] == spaced[1] != 0 and spaced[2] == hashing.MISSING_ID
    slots, _ = hashing.to_slots(pa.array(["Comedy | Drama", "Comedy|Drama", " | "]), "genres",
                                "|", 2)
    np.testing.assert_array_equal(slots[0], slots[1])
    assert (slots[2] == -1).all()


def test_a_column_of_float_ids_with_gaps_reads_as_the_csv_it_came_from():
    """pandas reads a column of integer ids with empty cells as floats with NaN: a whole
    float is its integer's id and NaN the missing id, as the CSV's text converts."""
    from_csv = hashing.to_ids(pa.array(["0", "1", "", "42"]), "banner_pos")
    np.testing.assert_array_equal(hashing.to_ids([0.0, 1.0, float("nan"), 42.0], "banner_pos"),
                                  from_csv)
    np.testing.assert_array_equal(hashing.to_ids(np.array([np.nan, np.nan]), "c"), [0, 0])
