"""Bad input gives a clear error naming file, column, task and value, or a counted skip."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from gmeta_tf import data
from gmeta_tf.data.manifest import sha256_of
from tests.data.conftest import convert_small

# Errors found while batches are produced cross tf.data's generator boundary and arrive
# as tf.errors.OpError carrying the DataError message; errors found at open are DataError.
DATA_ERRORS = (data.DataError, tf.errors.OpError)


@pytest.fixture
def copy(parquet_dataset, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(parquet_dataset, dst)
    return dst


def first_file(ds) -> tuple[str, int]:
    m = json.loads((ds / "manifest.json").read_text())
    return m["files"][0]["path"], 0


def rewrite(ds, transform) -> str:
    """Rewrites the first data file through ``transform`` and fixes the manifest to match,
    so only the content is wrong. Returns the file's path."""
    rel, i = first_file(ds)
    path = str(ds / rel)
    table = transform(pq.read_table(path))
    pq.write_table(table, path, row_group_size=table.num_rows)
    m = json.loads((ds / "manifest.json").read_text())
    m["files"][i].update(bytes=os.path.getsize(path), sha256=sha256_of(path),
                         rows=table.num_rows, blocks=[[table.num_rows, m["files"][i]["tasks"]]])
    (ds / "manifest.json").write_text(json.dumps(m))
    return path


def consume(ds, **kwargs) -> int:
    return sum(int(b["task_id"].shape[0]) for b in data.read_tasks(str(ds), 8, split=None, **kwargs))


def test_missing_file(copy):
    rel, _ = first_file(copy)
    os.remove(copy / rel)
    with pytest.raises(data.DataError, match=f"{rel}: data file listed in the manifest is missing"):
        data.read_tasks(str(copy), 8, split=None)


def test_missing_manifest(tmp_path):
    with pytest.raises(data.DataError, match="no manifest"):
        data.read_tasks(str(tmp_path), 8)


def test_corrupt_file_fails_its_checksum(copy):
    rel, _ = first_file(copy)
    with open(copy / rel, "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(data.DataError, match=f"{rel}: checksum mismatch"):
        data.read_tasks(str(copy), 8, split=None)


def test_truncated_file_is_caught_without_checksum(copy):
    rel, _ = first_file(copy)
    size = os.path.getsize(copy / rel)
    with open(copy / rel, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(data.DataError, match="file size differs from the manifest"):
        data.read_tasks(str(copy), 8, split=None, verify="size")


def test_schema_that_does_not_match_the_manifest(copy):
    path = rewrite(copy, lambda t: t.set_column(t.schema.get_field_index("price"), "price",
                                                 t["price"].cast(pa.float64())))
    with pytest.raises(data.DataError, match=f"{path}: column 'price': column type differs from "
                                             r"the manifest \(got 'double', expected float\)"):
        data.read_tasks(str(copy), 8, split=None)


def test_missing_column(copy):
    path = rewrite(copy, lambda t: t.drop_columns(["genres__2"]))
    with pytest.raises(data.DataError, match=f"{path}: column 'genres__2': column missing"):
        data.read_tasks(str(copy), 8, split=None)


def nan_label_of_first_task(t: pa.Table) -> pa.Table:
    label = t["label"].to_numpy().copy()
    label[1] = np.nan
    return t.set_column(t.schema.get_field_index("label"), "label", pa.array(label))


def test_nan_label_in_a_dataset_names_file_column_task_and_value(copy):
    path = rewrite(copy, nan_label_of_first_task)
    task = pq.read_table(path)["task_id"][0].as_py()
    with pytest.raises(DATA_ERRORS, match=f"{path}: column 'label': task {task}: NaN or "
                                          r"out-of-range label \(got nan"):
        consume(copy)


def test_nan_label_task_can_be_skipped_with_a_count(copy, caplog):
    rewrite(copy, nan_label_of_first_task)
    with caplog.at_level(logging.WARNING):
        kept = consume(copy, on_bad_task="skip")
    assert kept == 300 - 1
    assert "skipped bad label tasks: 1" in caplog.text


def test_task_rows_not_contiguous(copy):
    path = rewrite(copy, lambda t: t.take(pc.sort_indices(t, [("item_id", "ascending")])))
    with pytest.raises(DATA_ERRORS, match=f"{path}: column 'task_id': task .*not contiguous"):
        consume(copy)


def test_task_too_short_for_support_plus_query(parquet_dataset, caplog):
    with pytest.raises(DATA_ERRORS, match=r"task \d+: task has too few rows for its support and "
                                          r"query sets \(got \{'support': \d+, 'query': 5\}"):
        consume(parquet_dataset, min_support=25)
    with caplog.at_level(logging.WARNING):
        kept = consume(parquet_dataset, min_support=12, on_bad_task="skip")
    assert 0 < kept < 300
    assert f"skipped short tasks: {300 - kept}" in caplog.text


def test_rows_cut_alike_every_epoch_are_logged_once(parquet_dataset, caplog):
    """A task's rows beyond its slots are cut the same way every epoch: the count is
    logged for the first epoch, not again until it changes."""
    with caplog.at_level(logging.INFO, logger="gmeta_tf.data.task_dataset"):
        kept = consume(parquet_dataset, support=4, query=5, epochs=3)
    assert kept == 3 * 300
    lines = [r.getMessage() for r in caplog.records if "rows cut beyond slots" in r.getMessage()]
    assert len(lines) == 1 and " epoch 0: " in lines[0], lines


def write_csv(path, lines):
    path.write_text("\n".join(["user_id,item_id,label"] + lines) + "\n")
    return path


GOOD = [f"{u},{i},{(u + i) % 2}" for u in range(1, 6) for i in range(20)]
MAPPING = {"task": "user_id", "label": "label", "label_range": [0, 1], "sparse": ["item_id"]}
SPLIT = data.SplitConfig(query_size=3, min_rows=5)


MISSING_LABEL = "missing label: the cell is empty, NA or NaN"


@pytest.mark.parametrize("value, problem", [("", MISSING_LABEL),
                                            ("nan", MISSING_LABEL),
                                            ("7", "label out of range")])
def test_converter_rejects_bad_labels(tmp_path, value, problem):
    src = write_csv(tmp_path / "in.csv", GOOD[:50] + [f"4,99,{value}"] + GOOD[50:])
    with pytest.raises(data.DataError,
                       match=f"{src}: column 'label': task '4': line 52: {problem}"):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["in.csv"]  # no temporary left behind


@pytest.mark.parametrize("mapping, value, expected", [
    ({"label": "rating", "label_threshold": 4}, "nan",
     MISSING_LABEL + r" \(got 'nan', expected a number; --bad-rows skip"),
    ({"label": "rating", "label_threshold": 4, "label_range": [0.5, 5]}, "7",
     r"label out of range \(got '7', expected a number in \[0.5, 5\], the range the mapping "
     r"key 'label_range' \(gmeta data csv --label-range\) sets; --bad-rows skip"),
    ({"label": "rating"}, "NA", MISSING_LABEL + r" \(got 'NA', expected a number"),
])
def test_a_bad_label_is_named_as_the_file_names_it(tmp_path, mapping, value, expected):
    """A label the converter derives (rating >= 4) or stores under another name ('label')
    is reported by the file's own column, task value and text, not the stored ones; a
    value out of range names the key that set the range."""
    src = tmp_path / "in.csv"
    src.write_text("\n".join(["user_id,item_id,rating"] + [f"u{u},{i},{1 + (u + i) % 5}" for u in
                   range(1, 6) for i in range(20)][:50] + [f"u4,99,{value}"]) + "\n")
    with pytest.raises(data.DataError,
                       match=f"{src}: column 'rating': task 'u4': line 52: {expected}"):
        data.convert_csv(str(src), str(tmp_path / "out"),
                         {"task": "user_id", "sparse": ["item_id"], **mapping}, split=SPLIT)
    assert not (tmp_path / "out").exists()


def test_converter_skips_bad_labels_with_a_count(tmp_path, caplog):
    src = write_csv(tmp_path / "in.csv", GOOD + ["4,99,nan", "5,98,2"])
    with caplog.at_level(logging.WARNING):
        m = data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT,
                             output=data.OutputConfig(bad_rows="skip"))
    assert m.split["rows_skipped_bad_label"] == 2 and sum(f.rows for f in m.files) == 100
    assert "skipped 2 rows with a NaN or out-of-range label" in caplog.text


def test_failed_conversion_leaves_an_existing_dataset_untouched(tmp_path, raw_csv):
    out = tmp_path / "out"
    before = convert_small(raw_csv, out)
    src = write_csv(tmp_path / "bad.csv", GOOD + ["4,99,nan"])
    with pytest.raises(data.DataError):
        data.convert_csv(str(src), str(out), MAPPING, split=SPLIT,
                         output=data.OutputConfig(overwrite=True))
    assert data.Manifest.load(str(out)).files == before.files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "out"]


def test_converter_names_a_missing_input_column(tmp_path):
    src = write_csv(tmp_path / "in.csv", GOOD)
    with pytest.raises(data.DataError, match=f"{src}: .*'price'"):
        data.convert_csv(str(src), str(tmp_path / "out"), {**MAPPING, "dense": ["price"]}, split=SPLIT)


@pytest.mark.parametrize("column, value, expected", [
    ("label", "x", "a number in [0, 1]"),
    ("price", "cheap", "a number, or an empty cell, NA or NaN for a missing value (read as 0)"),
    ("ts", "yesterday", "seconds, or an ISO-8601 date-time")])
def test_a_value_that_is_not_a_number_is_named_with_what_its_column_takes(
        tmp_path, column, value, expected):
    rows = {"label": "1", "price": "2.5", "ts": "2026-12-06T10:00:00"}
    lines = [f"{g},2.5,{n}" for n, g in enumerate(GOOD)]
    lines.insert(7, ",".join(["4", "99", *(value if c == column else rows[c]
                                          for c in ("label", "price", "ts"))]))
    src = tmp_path / "in.csv"
    src.write_text("\n".join(["user_id,item_id,label,price,ts"] + lines) + "\n")
    mapping = {**MAPPING, "dense": ["price"], "order_by": "ts"}
    with pytest.raises(data.DataError) as raised:
        data.convert_csv(str(src), str(tmp_path / "out"), mapping, split=SPLIT)
    assert str(raised.value).startswith(f"{src}: column '{column}': line 9: not a number")
    assert f"(got '{value}', expected {expected}" in str(raised.value)
    assert "--bad-rows skip" in str(raised.value) and not (tmp_path / "out").exists()


def test_converter_refuses_to_overwrite_by_default(tmp_path, raw_csv):
    convert_small(raw_csv, tmp_path / "out")
    with pytest.raises(data.DataError, match="output exists"):
        convert_small(raw_csv, tmp_path / "out")


def _tree(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("what", ["a directory of other files", "a dataset beside a note",
                                  "a file"])
def test_overwrite_replaces_a_dataset_and_nothing_else(tmp_path, what):
    """--overwrite never deletes what is not a dataset: a directory holding the very CSV
    being converted (a pipeline whose data.path is the raw file's directory), a dataset
    directory a user also put a note in, a file. Each is refused, named, and left whole."""
    if what == "a directory of other files":
        out = tmp_path / "mydata"
        out.mkdir()
        src = write_csv(out / "in.csv", GOOD)
        (out / "notes.txt").write_text("keep me")
        problem = r"output holds no dataset \(manifest.json missing\) but 'in.csv', 'notes.txt'"
    else:
        src = write_csv(tmp_path / "in.csv", GOOD)
        out = tmp_path / "out"
        if what == "a file":
            out.write_text("precious")
            problem = "output is not a directory"
        else:
            data.convert_csv(str(src), str(out), MAPPING, split=SPLIT)
            (out / "notes.txt").write_text("keep me")
            problem = "the dataset directory also holds 'notes.txt', which its manifest does not list"
    before = _tree(tmp_path)
    with pytest.raises(data.DataError, match=f"{out}: {problem}.*--overwrite replaces a dataset"):
        data.convert_csv(str(src), str(out), MAPPING, split=SPLIT,
                         output=data.OutputConfig(overwrite=True))
    assert _tree(tmp_path) == before
    assert not [p for p in tmp_path.rglob(".*tmp-*")]  # no temporary left behind


def test_overwrite_replaces_a_dataset_or_an_empty_directory(tmp_path):
    src = write_csv(tmp_path / "in.csv", GOOD)
    for out in (tmp_path / "empty", tmp_path / "ds"):
        out.mkdir()
        data.convert_csv(str(src), str(out), MAPPING, split=SPLIT,
                         output=data.OutputConfig(overwrite=True))
        again = data.convert_csv(str(src), str(out), MAPPING, split=SPLIT,
                                 output=data.OutputConfig(overwrite=True))
        assert data.Manifest.load(str(out)).files == again.files


_KILLED_CONVERSION = """
import os, sys
from gmeta_tf import data
from gmeta_tf import atomic_file
renames = []
def replace(src, dst):
    renames.append(dst)
    if len(renames) == {kill_at}:
        os._exit(9)  # killed here: no clean-up runs
    os.replace(src, dst)
atomic_file.os = type("os", (), {{**vars(os), "replace": staticmethod(replace)}})
src, out, overwrite = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
data.convert_csv(src, out, {mapping!r}, split=data.SplitConfig(query_size=3, min_rows=5),
                 output=data.OutputConfig(overwrite=overwrite))
"""


@pytest.mark.parametrize("kill_at", [1, 2])
def test_a_conversion_killed_while_replacing_a_dataset_loses_nothing(tmp_path, kill_at):
    """A conversion killed between commit's two renames (the old dataset set aside, the
    new one not yet in place) or just before its first leaves the old dataset whole: the
    next conversion into the same place puts it back and removes the killed one's
    temporary directory; one killed while its own process still runs is not touched."""
    import subprocess
    import sys

    src = write_csv(tmp_path / "in.csv", GOOD)
    out = tmp_path / "out"
    first = data.convert_csv(str(src), str(out), MAPPING, split=SPLIT)
    before = _tree(out)
    bigger = write_csv(tmp_path / "more.csv", GOOD + [f"9,{i},1" for i in range(20)])
    script = _KILLED_CONVERSION.format(kill_at=kill_at, mapping=MAPPING)
    done = subprocess.run([sys.executable, "-c", script, str(bigger), str(out), "1"],
                          capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-"))
    # the new dataset staged, the old one set aside, and the killed writer's lock file
    assert len(left) == kill_at + 1 and sum(n.endswith(".lock") for n in left) == 1
    assert out.exists() == (kill_at == 1)
    # a conversion of another process that still runs is left alone
    live = tmp_path / f".out.tmp-{os.getppid()}@{__import__('socket').gethostname()}.live"
    live.mkdir()
    with pytest.raises(data.DataError, match="output exists"):
        data.convert_csv(str(src), str(out), MAPPING, split=SPLIT)
    assert _tree(out) == before  # put back whole, refused without --overwrite
    assert data.Manifest.load(str(out)).files == first.files
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp-" in p.name) == [live.name]


@pytest.mark.parametrize("line, column", [('4,99,"1', "column 'label': "),  # a value
                                          ('4,"99', "")])  # a row of too few fields
@pytest.mark.parametrize("policy", ["skip", "error"])
def test_a_quote_never_closed_is_refused_under_either_policy(tmp_path, line, column, policy):
    """A stray quote makes the parser read every later line into one field: skipped as
    one bad row, it would drop them all while counting one. It is refused, naming its line
    and how many lines it swallowed, and nothing is written."""
    src = write_csv(tmp_path / "in.csv", GOOD[:50] + [line] + GOOD[50:])
    with pytest.raises(data.DataError, match=rf"{src}: {column}line 52: a quote that is never "
                                             rf"closed: the field it opens runs over the next "
                                             rf"{len(GOOD) - 50} lines"):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT,
                         output=data.OutputConfig(bad_rows=policy))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("final_newline", [True, False])
@pytest.mark.parametrize("at, spanned", [(50, len(GOOD) - 50), (len(GOOD), 0)])
def test_a_quote_never_closed_is_refused_with_or_without_a_last_line_break(
        tmp_path, final_newline, at, spanned):
    """A quote never closed is refused under skip too, whether the file ends with a line
    break or not (the lenient reader closes a field left open at the end of the file as if
    it were closed), and when it opens on the last line."""
    src = tmp_path / "in.csv"
    lines = ["user_id,item_id,label"] + GOOD[:at] + ['4,99,1,"x'] + GOOD[at:]
    src.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    where = (f"over the next {spanned} lines \\(to the end of the file\\)" if spanned
             else "to the end of the file; close or remove the quote")
    with pytest.raises(data.DataError, match=rf"{src}: line {at + 2}: a quote that is never "
                                             rf"closed: the field it opens runs {where}"):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT,
                         output=data.OutputConfig(bad_rows="skip"))
    assert not (tmp_path / "out").exists()


def test_a_closed_quote_over_two_lines_in_a_row_of_the_wrong_width_follows_the_policy(
        tmp_path):
    """Quotes closed, a row of the wrong width that spans two lines is a malformed row as
    any other: skipped and counted under skip, not called an unclosed quote."""
    src = write_csv(tmp_path / "in.csv", GOOD[:50] + ['4,99,"1\n0",extra'] + GOOD[50:])
    m = data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT,
                         output=data.OutputConfig(bad_rows="skip"))
    assert m.split["lines_skipped_malformed"] == 1
    assert sum(f.rows for f in m.files) == len(GOOD)  # every other row kept


@pytest.mark.parametrize("policy", ["skip", "error"])
def test_a_literal_quote_in_a_row_over_two_lines_is_not_called_a_quote_never_closed(
        tmp_path, policy):
    """An odd number of quotes in a row over two lines whose quotes are closed (one of
    them a literal quote inside an unquoted field) is a row of the wrong width as any
    other: the policy decides, and no message calls its quote never closed."""
    src = write_csv(tmp_path / "in.csv", GOOD[:50] + ['4,99,"1\n0",ab"c'] + GOOD[50:])
    convert = functools.partial(data.convert_csv, str(src), str(tmp_path / "out"), MAPPING,
                                split=SPLIT, output=data.OutputConfig(bad_rows=policy))
    if policy == "error":
        with pytest.raises(data.DataError, match=rf"{src}: line 52: malformed line with 4 "
                                                 rf"columns, expected 3"):
            convert()
        return
    m = convert()
    assert m.split["lines_skipped_malformed"] == 1
    assert sum(f.rows for f in m.files) == len(GOOD)


def test_a_mapped_value_between_two_stray_quotes_is_refused_as_such(tmp_path):
    """A stray quote in a mapped column, closed by a stray quote on a later line, makes
    one value of the lines between (an id never spans lines): refused under either policy,
    naming the column, its line and how many lines it swallowed, and saying the quote is
    closed later, not never."""
    src = write_csv(tmp_path / "in.csv", GOOD[:50] + ['4,"99', '5",1'] + GOOD[50:])
    for policy in ("skip", "error"):
        with pytest.raises(data.DataError, match=rf"{src}: column 'item_id': line 52: a "
                                                 rf"quote closed only by a later line's "
                                                 rf"quote: the field it opens runs over the "
                                                 rf"next line \(a value of a mapped column "
                                                 rf"never spans lines\)"):
            data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT,
                             output=data.OutputConfig(bad_rows=policy))
        assert not (tmp_path / "out").exists()


def test_lines_inside_a_quoted_value_of_an_unread_column_are_counted_and_warned(
        tmp_path, caplog):
    """A quote opened in a column the mapping does not read, closed three lines later,
    makes those lines one row (legitimate in a free-text column, a loss of rows when the
    quote was a slip): the rows that span lines are warned, naming the file, the line
    the longest starts on and how many it spans."""
    lines = ["user_id,item_id,label,note"] + [f"{g},x" for g in GOOD]
    lines[51] = lines[51][:-1] + '"oops'
    lines[54] = lines[54][:-1] + 'z"'
    src = tmp_path / "in.csv"
    src.write_text("\n".join(lines) + "\n")
    with caplog.at_level("WARNING"):
        m = data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT)
    assert (f"{src}: {len(lines)} lines hold {len(lines) - 3} rows (header and malformed "
            f"lines included): 1 row spans several lines, the longest 4 lines from line 52 "
            f"on") in caplog.text
    assert "records read" not in caplog.text  # the two parsers counted the same records
    assert sum(f.rows for f in m.files) == len(GOOD) - 3
    caplog.clear()
    clean = tmp_path / "clean.csv"
    clean.write_text("\r\n".join(["user_id,item_id,label,note"]
                                  + [f'{g},"a, b"' for g in GOOD]))
    with caplog.at_level("WARNING"):
        data.convert_csv(str(clean), str(tmp_path / "clean_out"), MAPPING, split=SPLIT)
    assert "lines hold" not in caplog.text and "records read" not in caplog.text


NOTE = ["user_id,item_id,label,note"] + [f'{g},"line one\nline two"' if n % 7 == 0 else
                                         f"{g},plain" for n, g in enumerate(GOOD)]


@pytest.mark.parametrize("bad, message", [
    ("4,99,x,plain", "column 'label': line {line}: not a number"),
    ("4,99,7,plain", "column 'label': task '4': line {line}: label out of range"),
    ("4,99", "line {line}: malformed line with 2 columns, expected 4")])
def test_errors_after_values_over_several_lines_name_the_files_own_line(tmp_path, bad,
                                                                         message):
    """A free-text column whose quoted values hold line breaks puts every later row
    further down the file than its count: an error names the line an editor shows."""
    at = 80
    rows = NOTE[:at] + [bad] + NOTE[at:]
    src = tmp_path / "in.csv"
    src.write_text("\n".join(rows) + "\n")
    line = 1 + "\n".join(rows[:at]).count("\n") + 1
    assert src.read_text().splitlines()[line - 1] == bad
    with pytest.raises(data.DataError, match=f"{src}: " + message.format(line=line)):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT)


@pytest.mark.parametrize("block_bytes", [1000, 16 << 20])
def test_values_over_several_lines_are_read_across_parse_blocks(tmp_path, block_bytes):
    """A quoted value holding line breaks that crosses the parser's block boundary is read
    as any other (every row kept, each error on its own line), and a quote never closed in
    a file of many blocks is still named as such."""
    src = tmp_path / "in.csv"
    src.write_text("\n".join(NOTE[:1] + NOTE[1:] * 4) + "\n")
    m = data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT,
                         block_bytes=block_bytes)
    assert sum(f.rows for f in m.files) == 4 * len(GOOD)
    lines = src.read_text().splitlines()
    clean = list(lines)
    # a stray quote pairs with the next value's opening quote: the first row read wrong
    # is named by its line
    at = next(i for i in range(300, len(lines)) if lines[i].endswith(",plain"))
    lines[at] = lines[at].replace(",plain", ',"plain')
    broken = tmp_path / "broken.csv"
    broken.write_text("\n".join(lines) + "\n")
    after = next(i for i in range(at + 1, len(lines)) if lines[i] == "line two\"")
    with pytest.raises(data.DataError, match=f"{broken}: line {after + 1}: malformed line"):
        data.convert_csv(str(broken), str(tmp_path / "out2"), MAPPING, split=SPLIT,
                         block_bytes=block_bytes)
    # with no later quote it is never closed
    plain = [line.replace('"line one', "plain") for line in clean if line != 'line two"']
    at = 300
    plain[at] = plain[at].replace(",plain", ',"plain')
    unclosed = tmp_path / "unclosed.csv"
    unclosed.write_text("\n".join(plain) + "\n")
    with pytest.raises(data.DataError, match=f"{unclosed}: column 'note': line {at + 1}: a "
                                             f"quote that is never closed: the field it opens "
                                             f"runs over the next 100 lines \\(to the end of "
                                             f"the file\\)"):
        data.convert_csv(str(unclosed), str(tmp_path / "out3"), MAPPING, split=SPLIT,
                         block_bytes=block_bytes)


def test_a_quoted_value_longer_than_the_pass_reads_is_refused_as_a_quote_never_closed(
        tmp_path, monkeypatch):
    """The pass that finds values over several lines holds a value of up to
    ``_FIELD_CHARACTERS``; a longer one (a quote never closed in a large file) is refused
    naming the line it starts on, not held whole in memory."""
    from gmeta_tf.data.converters import csv_lines
    monkeypatch.setattr(csv_lines, "_FIELD_CHARACTERS", 300)
    rows = [f"{g},plain" for g in GOOD]
    rows[40] = rows[40].replace(",plain", ',"plain')
    src = tmp_path / "in.csv"
    src.write_text("\n".join(["user_id,item_id,label,note"] + rows) + "\n")
    with pytest.raises(data.DataError, match=f"{src}: line 42: a quoted value runs over more "
                                             f"than 300 characters: a quote that is never "
                                             f"closed"):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT)
    assert not (tmp_path / "out").exists()


def test_a_byte_order_mark_before_a_quoted_first_field_keeps_the_line_numbers(tmp_path):
    """pyarrow drops a UTF-8 byte-order mark; the pass that finds values over several
    lines drops it too, so a file whose first field is quoted counts its lines right."""
    src = tmp_path / "in.csv"
    body = ['"a\nb",1,1,0'] + [f"x,{u},{i},{(u + i) % 2}" for u in range(1, 6)
                                for i in range(20)]
    body.insert(40, "x,1,2")
    src.write_bytes(b"\xef\xbb\xbf" + ("\n".join(body) + "\n").encode())
    line = 1 + src.read_text(encoding="utf-8-sig").split("\n").index("x,1,2")
    with pytest.raises(data.DataError, match=f"{src}: line {line}: malformed line"):
        data.convert_csv(str(src), str(tmp_path / "out"),
                         {**MAPPING, "header": False,
                          "columns": ["note", "user_id", "item_id", "label"]}, split=SPLIT)


@pytest.mark.parametrize("multi_hot", ["genres", [3], {3: 2}])
def test_a_multi_hot_mapping_of_the_wrong_type_is_named(multi_hot):
    with pytest.raises(data.DataError, match="multi"):
        data.CsvMapping.from_dict({**MAPPING, "multi_hot": multi_hot})


def test_a_directory_as_input_or_an_output_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(data.DataError, match=f"{tmp_path / 'folder'}: input is a directory"):
        data.convert_csv(str(tmp_path / "folder"), str(tmp_path / "out"), MAPPING, split=SPLIT)
    src = write_csv(tmp_path / "in.csv", GOOD)
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "a_file" / "out"
    with pytest.raises(data.DataError, match=f"{out}: cannot write beside the output"):
        data.convert_csv(str(src), str(out), MAPPING, split=SPLIT)
    assert (tmp_path / "a_file").read_text() == "x"


def test_a_compressed_csv_is_named_as_compressed(tmp_path):
    import gzip

    src = tmp_path / "in.csv"
    src.write_bytes(gzip.compress(("\n".join(["user_id,item_id,label"] + GOOD) + "\n").encode()))
    with pytest.raises(data.DataError, match=f"{src}: the file is gzip-compressed.*gunzip"):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT)
    assert not (tmp_path / "out").exists()


def test_a_mapped_column_named_twice_in_the_header_is_refused(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("\n".join(["user_id,item_id,label,label"] + [f"{g},0" for g in GOOD]) + "\n")
    with pytest.raises(data.DataError, match=f"{src}: column 'label': mapped column 'label' "
                       r"names 2 columns of this file \(columns 3, 4 of line 1\)"):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT)


def test_a_file_of_another_delimiter_is_named_with_the_key_that_reads_it(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("\n".join(["user_id;item_id;label"] + [g.replace(",", ";") for g in GOOD])
                   + "\n")
    with pytest.raises(data.DataError, match=r"holds ';': if that is the file's delimiter, say "
                       r"so \(mapping key 'delimiter', gmeta data csv --delimiter ';'\)"):
        data.convert_csv(str(src), str(tmp_path / "out"), MAPPING, split=SPLIT)
    data.convert_csv(str(src), str(tmp_path / "out"), {**MAPPING, "delimiter": ";"},
                     split=SPLIT)


def test_a_malformed_criteo_tsv_names_the_file_and_row(tmp_path):
    """pyarrow parses the first block while opening: that error is a DataError too."""
    from gmeta_tf import data

    bad = tmp_path / "bad.tsv"
    bad.write_text("1\t2\t3\n0\tx\n")
    with pytest.raises(data.DataError, match=r"bad Criteo TSV near row 0.*Expected 40 columns"):
        data.convert_criteo(str(bad), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_first_bad_row_of_any_kind_is_the_one_named(tmp_path, caplog):
    """Bad labels (out of range, missing) and values that are not numbers are found in one
    pass: the error names the file's earliest bad line whatever its kind, and under skip
    the first rows dropped are named, each kind counted where the manifest counts it."""
    rows = [f"u{u},{i},{1 + (u * i) % 5},2024-05-01T10:{i:02d}:00" for u in range(1, 9)
            for i in range(40)]
    bad = {12: "7", 52: "-1", 102: "", 202: "n/a", 302: "inf"}
    for line, value in bad.items():
        user, item, _, when = rows[line - 2].split(",")
        rows[line - 2] = ",".join([user, item, value, when])
    src = tmp_path / "in.csv"
    src.write_text("\n".join(["user_id,item_id,rating,timestamp"] + rows) + "\n")
    mapping = {"task": "user_id", "label": "rating", "label_threshold": 4,
               "label_range": [0.5, 5], "sparse": ["item_id"], "order_by": "timestamp"}
    with pytest.raises(data.DataError, match=r"column 'rating': task 'u1': line 12: label out "
                                             r"of range \(got '7'"):
        data.convert_csv(str(src), str(tmp_path / "out"), mapping, split=SPLIT)
    with caplog.at_level("WARNING"):
        m = data.convert_csv(str(src), str(tmp_path / "out"), mapping, split=SPLIT,
                             output=data.OutputConfig(bad_rows="skip"))
    named = [line for line in caplog.text.splitlines() if "row skipped" in line]
    assert [n.split(": line ")[1].split(":")[0] for n in named] == ["12", "52", "102"]
    assert m.split["rows_skipped_bad_label"] == 4 and m.split["rows_skipped_bad_value"] == 1
    assert m.split["rows_in"] == len(rows) - len(bad)


def test_date_times_are_read_each_on_its_own(tmp_path):
    """ISO-8601 forms with an offset, a Z or fractions of a second order a task's rows;
    one date-time that is not one is named by its own line, and skipped alone."""
    forms = ["2024-05-01T10:{:02d}:00", "2024-05-01T10:{:02d}:00Z", "2024-05-01T12:{:02d}:00+02:00",
             "2024-05-01 10:{:02d}:00.250", "2024-05-01T10:{:02d}"]
    rows = [f"u{u},{i},{1 + (u * i) % 5},{forms[(u + i) % len(forms)].format(i)}"
            for u in range(1, 9) for i in range(40)]
    src = tmp_path / "in.csv"
    src.write_text("\n".join(["user_id,item_id,rating,timestamp"] + rows) + "\n")
    mapping = {"task": "user_id", "label": "rating", "sparse": ["item_id"],
               "order_by": "timestamp"}
    split = data.SplitConfig(query_size=3, min_rows=5, query_selection="last")
    m = data.convert_csv(str(src), str(tmp_path / "ok"), mapping, split=split)
    assert m.split["rows_in"] == len(rows)
    cold = pq.read_table(tmp_path / "ok" / m.files_of("cold")[0].path)
    query = cold.filter(pc.equal(cold.column("is_query"), 1))
    assert sorted(set(query.column("item_id").to_pylist())) == [37, 38, 39]  # the latest
    rows[100] = rows[100].rsplit(",", 1)[0] + ",2024-13-45T10:00:00"
    src.write_text("\n".join(["user_id,item_id,rating,timestamp"] + rows) + "\n")
    with pytest.raises(data.DataError, match=r"column 'timestamp': line 102: not a number or an "
                                             r"ISO date-time \(got '2024-13-45T10:00:00'"):
        data.convert_csv(str(src), str(tmp_path / "bad"), mapping, split=split)
    m = data.convert_csv(str(src), str(tmp_path / "skip"), mapping, split=split,
                         output=data.OutputConfig(bad_rows="skip"))
    assert m.split["rows_skipped_bad_value"] == 1 and m.split["rows_in"] == len(rows) - 1


def test_a_mapped_column_empty_in_every_row_is_warned_of(tmp_path, caplog):
    src = tmp_path / "in.csv"
    src.write_text("user_id,item_id,label,site,price,tags\n"
                   + "".join(f"{g},, ,\n" for g in GOOD))
    mapping = {**MAPPING, "sparse": ["item_id", "site"], "dense": ["price"],
               "multi_hot": {"tags": 2}}
    with caplog.at_level("WARNING"):
        data.convert_csv(str(src), str(tmp_path / "out"), mapping, split=SPLIT)
    assert f"{src}: columns site, tags, price empty in every row read" in caplog.text
    assert "item_id" not in caplog.text.split("empty in every row")[0].split(": columns")[-1]


def test_rows_held_twice_are_kept_and_counted_and_copied_answers_warned_of(tmp_path, caplog):
    """A row written twice (every column the same, its time too) counts as repeated; one
    differing in a multi-hot cell only does not. A query row of a scored split whose item
    and label a support row of its task repeats (another time) is counted per split."""
    rows = [f"{u},{i},{(u + i) % 2},a|b,{100 * u + i}" for u in range(1, 9) for i in range(12)]
    rows += [rows[0], rows[0], rows[13]]  # three copies, whole
    rows += [rows[1].replace("a|b", "b|a")]  # the same but for the tags' order: not a copy
    # each user's item 0 again, later, with its label: a copy but for the time
    rows += [f"{u},0,{u % 2},a|b,{100 * u + 50}" for u in range(1, 9)]
    src = tmp_path / "in.csv"
    src.write_text("user_id,item_id,label,tags,time\n" + "\n".join(rows) + "\n")
    mapping = {**MAPPING, "multi_hot": {"tags": 2}, "order_by": "time"}
    split = data.SplitConfig(query_size=6, min_rows=7, warm_fraction=0.5, valid_fraction=0.0)
    with caplog.at_level("WARNING"):
        data.convert_csv(str(src), str(tmp_path / "out"), mapping, split=split)
    manifest = data.Manifest.load(str(tmp_path / "out"))
    counts = manifest.split
    assert counts["rows_in"] == len(rows)  # every row kept
    assert counts["repeated_rows"] == 3
    assert "3 rows repeat another row of their task in every stored column" in caplog.text
    # the cold split's copies, counted here from the rows written
    cold = pa.concat_tables([pq.read_table(os.path.join(str(tmp_path / "out"), f.path))
                             for f in manifest.files if f.split == "cold"]).to_pylist()
    def columns(row):  # every stored column (the task's among them) but is_query
        return tuple(v for k, v in sorted(row.items()) if k != "is_query")

    shown = {columns(r) for r in cold if not r["is_query"]}
    expected = sum(columns(r) in shown for r in cold if r["is_query"])
    assert expected > 0, "the split put no copy of a support row among the query rows"
    assert counts["cold_query_rows_in_support"] == expected
    assert f"{expected} query rows of the cold split are copies of a support row" \
        in caplog.text
    assert counts.get("valid_query_rows_in_support", 0) == 0


def test_the_generators_repeated_impressions_are_logged_with_their_reason_not_warned_of(
        tmp_path, caplog):
    """The generated data (``make demo``'s) shows a user an item again by design: the
    conversion counts those rows as it counts a log's, records why they are events of their
    own, and says so at INFO, where a user's log would be warned of."""
    from gmeta_tf.data import synthetic

    with caplog.at_level("INFO"):
        manifest = synthetic.generate(str(tmp_path / "out"), 300, 24, seed=3)
    counts = manifest.split
    assert counts["repeats_are_events"] == synthetic.REPEATS_ARE_EVENTS
    # every stored column of a generated row is a function of its user, item and label
    rows = next(synthetic.iter_rows(300, 24, seed=3))
    keys = np.stack([rows["user_id"], rows["item_id"], rows["label"].astype(np.int64)], 1)
    expected = len(keys) - len(np.unique(keys, axis=0))
    assert counts["rows_in"] == len(keys) and counts["repeated_rows"] == expected > 0
    said = [r for r in caplog.records if "repeat" in r.getMessage()]
    assert said and all(r.levelno == logging.INFO for r in said), \
        [(r.levelname, r.getMessage()) for r in said]
    assert f"{expected} rows repeat another row of their task" in said[0].getMessage()
    assert synthetic.REPEATS_ARE_EVENTS in said[0].getMessage()


def test_repeated_rows_compare_list_cells_by_their_values_in_order():
    """A list column (a converter's variable-length ids) as the conversion counts it: equal
    lists are the same, the same ids in another order or another length are not, also
    in a slice of a table (offsets not starting at 0)."""
    from gmeta_tf.data.converters.pipeline import RepeatedRows

    table = pa.table({"task_id": pa.array([7, 7, 7, 7, 7, 7, 7], pa.int64()),
                      "ids": pa.array([[9], [1, 2], [2, 1], [], [1, 2], [], [1, 2, 0]],
                                      pa.list_(pa.int64())),
                      "label": pa.array([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])})
    for part, repeated in ((table, 2), (table.slice(1), 2), (table.slice(2), 1)):
        counter = RepeatedRows()
        counter.count(part)
        assert counter.counts["repeated_rows"] == repeated
