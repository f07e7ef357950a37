"""CSV conversion of a user's own files: line numbers, bad rows, side-file joins, block
sizes, refusals that keep a good dataset, and ``info`` verifying checksums."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from gmeta_tf import data
from gmeta_tf.data import cli, hashing

SPLIT = data.SplitConfig(query_size=2, min_rows=3)
MAPPING = {"task": "user_id", "label": "rating", "label_range": [1, 5],
           "sparse": ["item_id"]}


def ratings(path, lines):
    path.write_text("\n".join(["user_id,item_id,rating,timestamp"] + lines) + "\n")
    return path


GOOD = [f"u{u},{i},{1 + (u + i) % 5},{100 * u + i}" for u in range(1, 7) for i in range(1, 9)]


def rows_of(out) -> int:
    return sum(f.rows for f in data.Manifest.load(str(out)).files)


def test_a_bad_value_is_reported_by_its_line_and_column_name(tmp_path):
    # line 1 header, 2..11 good, 12 blank, 13 malformed (skipped), 14 good, 15 bad number
    lines = GOOD[:10] + ["", "u1,7", GOOD[10], "u2,3,five,7"] + GOOD[11:]
    src = ratings(tmp_path / "r.csv", lines)
    with pytest.raises(data.DataError, match=r"r.csv: line 13: malformed line with 2 columns, "
                                             r"expected 4 \(user_id, item_id, rating, "
                                             r"timestamp\).*\(got 'u1,7'\)"):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT)
    lines = GOOD[:10] + ["", GOOD[10], "u2,3,five,7"] + GOOD[11:]
    src = ratings(tmp_path / "r2.csv", lines)
    with pytest.raises(data.DataError, match=r"r2.csv: column 'rating': line 14: not a number "
                                             r"\(got 'five', expected a number in \[1, 5\]"):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT)
    assert not (tmp_path / "out").exists()


def test_columns_name_a_header_files_columns_in_place_of_its_header_line(tmp_path):
    # a log whose header says userId/movieId, read by the names the mapping uses
    (tmp_path / "r.csv").write_text("\n".join(["userId,movieId,rating,timestamp"] + GOOD)
                                    + "\n")
    with pytest.raises(data.DataError, match=r"r.csv: column 'user_id': mapped column "
                                             r"'user_id' is not a column of this file.*"
                                             r"'userId', 'movieId'.*the mapping key 'columns'"):
        data.convert_csv(str(tmp_path / "r.csv"), str(tmp_path / "out"), MAPPING, split=SPLIT)
    renamed = {**MAPPING, "columns": ["user_id", "item_id", "rating", "timestamp"]}
    data.convert_csv(str(tmp_path / "r.csv"), str(tmp_path / "out"), renamed, split=SPLIT)
    data.convert_csv(str(ratings(tmp_path / "same.csv", GOOD)), str(tmp_path / "same"), MAPPING,
                     split=SPLIT)
    got, want = ({f.path: pq.read_table(tmp_path / d / f.path)
                  for f in data.Manifest.load(str(tmp_path / d)).files} for d in ("out", "same"))
    assert list(got) == list(want) and all(got[f].equals(want[f]) for f in got)
    # the header line still counts as line 1: a bad value keeps its line number
    (tmp_path / "bad.csv").write_text("\n".join(["userId,movieId,rating,timestamp"] + GOOD[:5]
                                                 + ["u2,3,five,7"]) + "\n")
    with pytest.raises(data.DataError, match=r"bad.csv: column 'rating': line 7: not a number"):
        data.convert_csv(str(tmp_path / "bad.csv"), str(tmp_path / "bad"), renamed, split=SPLIT)
    # a renamed column's problem is named as the header line names it
    for value, problem in (("five", r"line 7: not a number"),
                           ("", r"task 'u2': line 7: missing label: the cell is empty")):
        (tmp_path / "bad.csv").write_text("\n".join(["userId,movieId,stars,ts"] + GOOD[:5]
                                                     + [f"u2,3,{value},7"]) + "\n")
        with pytest.raises(data.DataError, match=rf"bad.csv: column 'stars': {problem}"):
            data.convert_csv(str(tmp_path / "bad.csv"), str(tmp_path / "bad"), renamed,
                             split=SPLIT)
    with pytest.raises(data.DataError, match=r"r.csv: mapping key 'columns' names 3 columns but "
                                             r"the header line \(line 1\) has 4.*'userId'"):
        data.convert_csv(str(tmp_path / "r.csv"), str(tmp_path / "out3"),
                         {**MAPPING, "columns": ["user_id", "item_id", "rating"]}, split=SPLIT)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "out3").exists()
    # the command line's --rename is the same key
    assert cli.main(["csv", str(tmp_path / "r.csv"), str(tmp_path / "by_flag"), "--task",
                     "user_id", "--label", "rating", "--label-range", "1", "5", "--sparse",
                     "item_id", "--rename", "user_id,item_id,rating,timestamp",
                     "--query-size", "2", "--min-rows", "3"]) == 0
    by_flag = {f.path: pq.read_table(tmp_path / "by_flag" / f.path)
               for f in data.Manifest.load(str(tmp_path / "by_flag")).files}
    assert list(by_flag) == list(want) and all(by_flag[f].equals(want[f]) for f in by_flag)


def test_bad_rows_skip_drops_malformed_lines_and_bad_values_and_counts_them(tmp_path, caplog):
    lines = GOOD[:10] + ["", "u1,7", "u2,3,five,7", ",4,3,9", "u3,4,9,9", "u4,1,2,3,4"] + GOOD[10:]
    lines.insert(len(lines) - 3, "   \t ")  # spaces alone: a blank line, not a malformed one
    src = ratings(tmp_path / "r.csv", lines)
    with caplog.at_level("WARNING"):
        m = data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT,
                             output=data.OutputConfig(bad_rows="skip"))
    # each skipped value is named: the file, column, line and value
    assert (f"{src}: column 'rating': line 14: not a number (got 'five', expected a number "
            "in [1, 5], the range the mapping key 'label_range'" in caplog.text)
    assert "sets): row skipped" in caplog.text
    assert "line 15: empty task value" in caplog.text
    assert rows_of(tmp_path / "out") == len(GOOD)
    counts = {k: m.split[k] for k in ("lines_skipped_malformed", "rows_skipped_bad_value",
                                      "rows_skipped_bad_label", "blank_lines", "rows_in")}
    assert counts == {"lines_skipped_malformed": 2, "rows_skipped_bad_value": 2,
                      "rows_skipped_bad_label": 1, "blank_lines": 2,
                      "rows_in": len(GOOD)}


def test_header_only_input_is_refused_and_the_good_dataset_stays(tmp_path, capsys):
    out = tmp_path / "out"
    data.convert_csv(str(ratings(tmp_path / "good.csv", GOOD)), str(out), MAPPING, split=SPLIT)
    before = data.Manifest.load(str(out)).files
    empty = ratings(tmp_path / "empty.csv", [])
    code = cli.main(["csv", str(empty), str(out), "--task", "user_id", "--label", "rating",
                     "--sparse", "item_id", "--overwrite"])
    assert code == 2
    assert "empty.csv: no data rows in the input" in capsys.readouterr().err
    assert data.Manifest.load(str(out)).files == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.csv", "good.csv", "out"]


def test_an_input_whose_every_task_is_dropped_is_refused(tmp_path):
    src = ratings(tmp_path / "r.csv", GOOD)
    with pytest.raises(data.DataError, match="no task left to write") as refused:
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING,
                         split=data.SplitConfig(query_size=2, min_rows=50))
    assert "no 'task'" not in str(refused.value)
    # a click log without a task under the cold-start defaults: told how to keep its rows
    no_task = {k: v for k, v in MAPPING.items() if k != "task"}
    with pytest.raises(data.DataError, match=r"the mapping has no 'task', so every row is its "
                       r"own task of one row: .*--min-rows 1 --query-size 0"):
        data.convert_csv(str(src), str(tmp_path / "out"), no_task)


def test_an_overwrite_with_fewer_rows_is_logged_as_a_warning(tmp_path, caplog):
    out = tmp_path / "out"
    data.convert_csv(str(ratings(tmp_path / "a.csv", GOOD)), str(out), MAPPING, split=SPLIT)
    with caplog.at_level("WARNING"):
        data.convert_csv(str(ratings(tmp_path / "b.csv", GOOD[:24])), str(out), MAPPING,
                         split=SPLIT, output=data.OutputConfig(overwrite=True))
    assert f"replacing dataset {out} ({len(GOOD)} rows" in caplog.text
    assert "the new dataset is SMALLER" in caplog.text


def test_side_files_join_on_a_key(tmp_path):
    items = tmp_path / "items.csv"
    items.write_text("item_id,genres,year\n1,Comedy|Drama,1990\n2,Horror,\n3,,2001\n"
                     "4,Action|Comedy|Drama|Horror,1999\n5,Drama,1980\n6,Comedy,1970\n"
                     "7,Drama,1960\n")  # no item 8
    mapping = {**MAPPING, "sparse": ["item_id", "year"], "multi_hot": {"genres": 3},
               "join": [{"path": str(items), "key": "item_id"}]}
    m = data.convert_csv(str(ratings(tmp_path / "r.csv", GOOD)), str(tmp_path / "out"),
                         mapping, split=SPLIT)
    assert m.split["rows_without_join_match"] == 6  # item 8 of six users
    assert m.split["truncated_multi_hot_rows"] == 6  # item 4 has four genres
    table = pq.read_table(tmp_path / "out" / m.files[0].path)
    genres, _ = hashing.to_slots(__import__("pyarrow").array(
        ["Comedy|Drama", "Horror", "", "Action|Comedy|Drama|Horror", "Drama", "Comedy",
         "Drama", ""]), "genres", "|", 3)
    item = table.column("item_id").to_numpy()
    got = np.stack([table.column(f"genres__{i}").to_numpy() for i in range(3)], axis=1)
    np.testing.assert_array_equal(got, genres[item - 1])
    years = {1: 1990, 2: 0, 3: 2001, 4: 1999, 5: 1980, 6: 1970, 7: 1960, 8: 0}
    assert table.column("year").to_pylist() == [years[i] for i in item]


def test_a_side_file_with_a_repeated_key_is_refused_by_line(tmp_path):
    items = tmp_path / "items.csv"
    items.write_text("item_id,year\n1,1990\n2,1991\n1,1992\n")
    mapping = {**MAPPING, "sparse": ["item_id", "year"],
               "join": [{"path": str(items), "key": "item_id"}]}
    with pytest.raises(data.DataError, match=r"items.csv: column 'item_id': line 4: key "
                                             r"repeated \(first on line 2\)"):
        data.convert_csv(str(ratings(tmp_path / "r.csv", GOOD)), str(tmp_path / "out"),
                         mapping, split=SPLIT)


def test_default_blocks_give_every_split_16_blocks_and_rows_per_file_is_honoured(tmp_path):
    lines = [f"u{u},{i},{1 + (u + i) % 5},{i}" for u in range(200) for i in range(5)]
    src = ratings(tmp_path / "r.csv", lines)
    m = data.convert_csv(str(src), str(tmp_path / "a"), MAPPING, split=SPLIT)
    for split in ("warm", "cold"):
        assert sum(len(f.blocks) for f in m.files_of(split)) >= 16
    m = data.convert_csv(str(src), str(tmp_path / "b"), MAPPING, split=SPLIT,
                         output=data.OutputConfig(rows_per_file=100))
    assert all(f.rows <= 104 for f in m.files) and len(m.files_of("warm")) >= 7


def test_info_verifies_every_checksum(tmp_path, capsys):
    out = tmp_path / "out"
    m = data.convert_csv(str(ratings(tmp_path / "r.csv", GOOD)), str(out), MAPPING, split=SPLIT)
    assert cli.main(["info", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["verified"] == "size and sha256 of every file"
    path = out / m.files[-1].path
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, different bytes
    path.write_bytes(bytes(raw))
    assert cli.main(["info", str(out)]) == 2
    assert f"{path}: checksum mismatch" in capsys.readouterr().err


def test_csv_help_describes_every_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["csv", "--help"])
    text = capsys.readouterr().out
    parser = cli._parser()
    csv = parser._subparsers._group_actions[0].choices["csv"]
    for action in csv._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{action.option_strings} has no help"
            assert action.option_strings[0] in text


def test_without_a_task_column_every_row_is_its_own_task(tmp_path):
    # two input files with the same line numbers: their rows still get distinct tasks
    first = ratings(tmp_path / "a.csv", GOOD[:20])
    second = ratings(tmp_path / "b.csv", GOOD[20:40])
    mapping = {"label": "rating", "label_range": [1, 5], "sparse": ["user_id", "item_id"]}
    split = data.SplitConfig(warm_fraction=1.0, valid_fraction=0.25, query_size=0,
                             min_rows=1)
    m = data.convert_csv([str(first), str(second)], str(tmp_path / "out"), mapping,
                         split=split)
    assert m.split["source"]["mapping"]["task"] is None
    tables = [pq.read_table(tmp_path / "out" / f.path) for f in m.files]
    tasks = np.concatenate([t.column("task_id").to_numpy() for t in tables])
    assert len(tasks) == 40 and len(np.unique(tasks)) == 40
    # a task id is the file's index and the row's line: line 2 (the first row) of each file
    assert {int(t) for t in tasks if t & ((1 << 40) - 1) == 2} == {2, (1 << 40) + 2}
    per_split = {f.split: f.rows for f in m.files}
    assert per_split == {"warm": m.split["warm_tasks"], "valid": m.split["valid_tasks"]}
    assert 4 <= per_split["valid"] <= 16  # a quarter of the rows, not of some column's values


def test_a_mapping_needs_a_label_but_not_a_task(tmp_path, capsys):
    with pytest.raises(data.DataError, match="mapping key 'label' is missing"):
        data.CsvMapping.from_dict({"task": "user_id", "sparse": ["item_id"]})
    assert data.CsvMapping.from_dict({"label": "rating"}).task is None
    with pytest.raises(data.DataError, match="mapping key 'task' is not allowed.*got ''"):
        data.CsvMapping.from_dict({"task": "", "label": "rating"})
    src = ratings(tmp_path / "r.csv", GOOD)
    assert cli.main(["csv", str(src), str(tmp_path / "out"), "--sparse", "item_id"]) == 2
    assert "csv needs --label" in capsys.readouterr().err
    assert cli.main(["csv", str(src), str(tmp_path / "out"), "--label", "rating",
                     "--query-size", "0", "--min-rows", "1"]) == 0
    assert rows_of(tmp_path / "out") == len(GOOD)


def test_columns_left_out_of_the_mapping_are_named_and_an_order_without_tasks_warned(
        tmp_path, caplog):
    """A click log's columns the mapping gives no role (an id, an hour) are named in the
    log, so a column left out by mistake is seen; ``order_by`` without a task (every row
    its own task) orders nothing, and says so."""
    src = tmp_path / "clicks.csv"
    src.write_text("\n".join(["id,click,hour,site,app"] + [
        f"{i},{int(i % 4 == 0)},1410210{i % 10},s{i % 7},a{i % 3}" for i in range(60)]) + "\n")
    with caplog.at_level("INFO"):
        data.convert_csv(str(src), str(tmp_path / "out"),
                         {"label": "click", "label_range": [0, 1], "sparse": ["site", "app"],
                          "order_by": "hour"},
                         split=data.SplitConfig(warm_fraction=1.0, query_size=0, min_rows=1))
    err = caplog.text
    assert f"{src}: columns the mapping does not read (no role: " in err
    assert "dense or order_by): id\n" in err  # hour is read, as the order
    assert "mapping key 'order_by' (hour) orders each task's rows, and the mapping has no " \
           "'task'" in err
