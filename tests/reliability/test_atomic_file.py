"""The one atomic write every small file of a run goes through (BEST.json, tuned.yaml,
config.yaml, train_summary.json, a checkpoint's manifest, eval results): a write that fails
part-way leaves the file as it was and no temporary file beside it."""

from __future__ import annotations

import pytest

from gmeta_tf.atomic_file import write_atomically, write_text_atomically


def test_a_text_write_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "BEST.json"
    path.write_text("old")
    write_text_atomically(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["BEST.json"]


def test_a_write_that_fails_part_way_leaves_the_old_file(tmp_path):
    path = tmp_path / "tuned.yaml"
    path.write_text("chosen: old\n")

    def half_then_crash(tmp):
        tmp.write_text("chosen: ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, half_then_crash)
    assert path.read_text() == "chosen: old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["tuned.yaml"]


def test_a_first_write_that_fails_leaves_no_file(tmp_path):
    def crash(tmp):
        tmp.write_text("{")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "train_summary.json", crash)
    assert list(tmp_path.iterdir()) == []
