"""Files as older tools write them, read unedited: a delimiter of several characters
(MovieLens 1M's ``ratings.dat``: ``user::item::rating::time``, no header line), a side file
without a header line, and text in an encoding other than UTF-8."""

from __future__ import annotations

import io
import random

import pyarrow.parquet as pq
import pytest

from gmeta_tf import data
from gmeta_tf.data import cli
from gmeta_tf.data.converters.csv_lines import _DelimiterStream
from gmeta_tf.data.converters.csv_mapping import recorded_mapping

SPLIT = data.SplitConfig(query_size=2, min_rows=3)
RATINGS = [(f"u{u}", i, 1 + (u + i) % 5, 100 * u + i) for u in range(1, 9) for i in range(1, 8)]
MOVIES = [(1, "Amélie (2001)", "Comedy|Romance"), (2, "Nausicaä (1984)", "Animation"),
          (3, "Star Wars: Episode IV (1977)", "Action|Sci-Fi"), (4, '"Great" Films (1990)', ""),
          (5, "Léon (1994)", "Crime|Drama|Thriller"), (6, "Ran (1985)", "Drama|War"),
          (7, "Zoë (2000)", "Drama")]
MAPPING = {"task": "user_id", "label": "rating", "label_range": [1, 5], "sparse": ["item_id"],
           "multi_hot": {"genres": 2}, "order_by": "timestamp"}


def as_written_then(tmp_path):
    """The same ratings and movies twice: as MovieLens 1M writes them ('::', no header
    lines, latin-1 movie titles) and as a UTF-8 CSV with header lines."""
    (tmp_path / "ratings.dat").write_bytes(
        "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in RATINGS).encode("latin-1"))
    (tmp_path / "movies.dat").write_bytes(
        "".join(f"{i}::{title}::{g}\n" for i, title, g in MOVIES).encode("latin-1"))
    (tmp_path / "ratings.csv").write_text(
        "user_id,item_id,rating,timestamp\n"
        + "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in RATINGS), encoding="utf-8")
    (tmp_path / "movies.csv").write_text(
        "item_id,genres\n" + "".join(f"{i},{g}\n" for i, _, g in MOVIES), encoding="utf-8")
    dat = {**MAPPING, "delimiter": "::", "header": False,
           "columns": ["user_id", "item_id", "rating", "timestamp"],
           "join": [{"path": str(tmp_path / "movies.dat"), "key": "item_id", "header": False,
                     "names": ["item_id", "title", "genres"], "columns": ["genres"],
                     "encoding": "latin-1"}]}
    csv = {**MAPPING, "join": [{"path": str(tmp_path / "movies.csv"), "key": "item_id"}]}
    return dat, csv


def tables(out) -> dict:
    return {f.path: pq.read_table(out / f.path) for f in data.Manifest.load(str(out)).files}


def test_a_movielens_1m_shaped_log_converts_to_the_dataset_of_the_same_rows_as_csv(tmp_path):
    dat, csv = as_written_then(tmp_path)
    data.convert_csv(str(tmp_path / "ratings.dat"), str(tmp_path / "dat"), dat, split=SPLIT)
    data.convert_csv(str(tmp_path / "ratings.csv"), str(tmp_path / "csv"), csv, split=SPLIT)
    got, want = tables(tmp_path / "dat"), tables(tmp_path / "csv")
    assert list(got) == list(want) and all(got[f].equals(want[f]) for f in got)
    assert sum(t.num_rows for t in got.values()) == len(RATINGS)
    genres = [c for c in next(iter(got.values())).column_names if c.startswith("genres__")]
    assert genres and any(any(t.column(c).to_pylist()) for t in got.values() for c in genres)
    # the command line reads it too
    assert cli.main(["csv", str(tmp_path / "ratings.dat"), str(tmp_path / "cli"), "--task",
                     "user_id", "--label", "rating", "--sparse", "item_id", "--delimiter", "::",
                     "--no-header", "user_id,item_id,rating,timestamp", "--min-rows", "3",
                     "--query-size", "2", "--encoding", "latin-1"]) == 0
    assert data.Manifest.load(str(tmp_path / "cli")).split["rows_in"] == len(RATINGS)


@pytest.mark.parametrize("delimiter", ["::", "||", "<->"])
def test_a_delimiter_of_several_characters_is_replaced_across_every_chunk_boundary(
        tmp_path, delimiter):
    rng = random.Random(len(delimiter))
    alphabet = ["a", "b", "\n", *delimiter, delimiter, delimiter[0] * 3]
    text = "".join(rng.choice(alphabet) for _ in range(3000)).encode()
    path = tmp_path / "f"
    path.write_bytes(text)
    want = text.replace(delimiter.encode(), b"\x1f")  # left to right, as str.replace
    for chunk in (1, 2, 3, 5, 64, 1 << 20):
        stream = io.BufferedReader(_DelimiterStream(str(path), delimiter.encode(), chunk))
        assert stream.read() == want, chunk


def test_problems_in_such_files_name_the_file_the_line_and_the_fix(tmp_path):
    dat, _ = as_written_then(tmp_path)
    lines = (tmp_path / "ratings.dat").read_text(encoding="latin-1").splitlines()

    def convert(name, text, mapping=dat):
        (tmp_path / name).write_text("\n".join(text) + "\n", encoding="latin-1")
        data.convert_csv(str(tmp_path / name), str(tmp_path / "out"), mapping, split=SPLIT)

    with pytest.raises(data.DataError, match=r"short.dat: line 4: malformed line with 3 "
                                             r"columns, expected 4.*\(got 'u1::4::5'\)"):
        convert("short.dat", lines[:3] + ["u1::4::5"] + lines[3:])
    with pytest.raises(data.DataError, match=r"five.dat: column 'rating': line 3: not a number "
                                             r"\(got 'five', expected a number in \[1, 5\], "
                                             r"the range the mapping key 'label_range'.*sets; "
                                             r"--bad-rows skip"):
        convert("five.dat", lines[:2] + ["u1::4::five::7"] + lines[2:])
    with pytest.raises(data.DataError, match=r"us.dat: line 5: the file holds the byte 0x1F"):
        convert("us.dat", lines[:4] + ["u1::4\x1f::5::7"] + lines[4:])
    # the side file read as UTF-8: its first title that is not names its line
    utf8 = {**dat, "join": [{**dat["join"][0], "columns": ["title", "genres"],
                             "encoding": None}], "sparse": ["item_id", "title"]}
    with pytest.raises(data.DataError, match=r"movies.dat: line 1: not utf-8 text .*the "
                                             r"mapping key 'encoding'.*e.g. latin-1 "
                                             r"\(got '1::Am\ufffdlie"):
        data.convert_csv(str(tmp_path / "ratings.dat"), str(tmp_path / "out"), utf8,
                         split=SPLIT)
    (tmp_path / "h.csv").write_bytes("usér,item_id,rating\n".encode("latin-1"))
    with pytest.raises(data.DataError, match=r"h.csv: line 1: the header line is not utf-8 "
                                             r"text.*'encoding'"):
        data.convert_csv(str(tmp_path / "h.csv"), str(tmp_path / "out"),
                         {"task": "usér", "label": "rating"}, split=SPLIT)
    assert not (tmp_path / "out").exists()


def test_bad_dialect_keys_are_named(tmp_path):
    dat, _ = as_written_then(tmp_path)
    for key, value, message in (
            ("encoding", "klingon", r"mapping key 'encoding' is not allowed: unknown encoding "
                                    r"\(got 'klingon', expected a Python codec name"),
            ("encoding", "utf-16", r"mapping key 'encoding' is not allowed.*writes ASCII as "
                                   r"itself"),
            ("delimiter", "", r"mapping key 'delimiter' is not allowed.*non-empty string"),
            ("delimiter", ":\n", r"mapping key 'delimiter' is not allowed.*line break")):
        with pytest.raises(data.DataError, match=message):
            data.CsvMapping.from_dict({**dat, key: value})
    side = dat["join"][0]
    with pytest.raises(data.DataError, match=r"'join\[0\].encoding' is not allowed: unknown"):
        data.CsvMapping.from_dict({**dat, "join": [{**side, "encoding": "klingon"}]})
    with pytest.raises(data.DataError, match=r"'join\[0\].names' is missing: header: false"):
        data.CsvMapping.from_dict({**dat, "join": [{**side, "names": None}]})
    with pytest.raises(data.DataError, match=r"'join\[0\].header' is not allowed.*true or "
                                             r"false"):
        data.CsvMapping.from_dict({**dat, "join": [{**side, "header": "no"}]})


def test_a_mapping_recorded_before_the_dialect_keys_still_fits():
    before = {"label": "rating", "task": "user_id", "label_threshold": None,
              "label_range": [1.0, 5.0], "sparse": ["item_id"], "multi_hot": {},
              "dense": [], "order_by": None, "separator": "|", "delimiter": ",",
              "header": True, "columns": None,
              "join": [{"path": "items.csv", "key": "item_id", "on": None, "columns": None,
                        "delimiter": None}]}
    now = recorded_mapping(before)
    assert now["encoding"] == "utf-8" and now["join"][0]["header"] is True
    assert now == recorded_mapping(now)
    assert {k: v for k, v in now.items() if k in before and k != "join"} == {
        k: v for k, v in before.items() if k != "join"}


def test_a_header_with_spaces_around_its_names_and_a_tab_named_in_words_read_as_written(
        tmp_path):
    """Header names are read without the spaces around them (``user_id, item_id``, as
    spreadsheets and hand edits write them), and a mapping's delimiter ``tab`` or ``\\t``
    (backslash, t: what a shell's --set leaves) is the tab, as for gmeta data csv."""
    rows = [f"{u},{i},{r},{t}" for u, i, r, t in RATINGS]
    (tmp_path / "plain.csv").write_text("\n".join(["user_id,item_id,rating,timestamp", *rows])
                                        + "\n")
    (tmp_path / "spaced.csv").write_text(
        "\r\n".join([" user_id, item_id,rating ,\ttimestamp", *rows]) + "\r\n",
        encoding="utf-8-sig")
    (tmp_path / "tabs.tsv").write_text("\n".join(["user_id\titem_id\trating\ttimestamp",
                                                  *(r.replace(",", "\t") for r in rows)])
                                       + "\n")
    mapping = {k: v for k, v in MAPPING.items() if k != "multi_hot"}
    data.convert_csv(str(tmp_path / "plain.csv"), str(tmp_path / "plain"), mapping, split=SPLIT)
    want = tables(tmp_path / "plain")
    outputs = [("spaced.csv", "spaced", mapping)]
    for n, name in enumerate(["tab", "\\t", "\t"]):
        outputs.append(("tabs.tsv", f"tabs{n}", {**mapping, "delimiter": name}))
    for src, out, m in outputs:
        data.convert_csv(str(tmp_path / src), str(tmp_path / out), m, split=SPLIT)
        got = tables(tmp_path / out)
        assert list(got) == list(want) and all(got[f].equals(want[f]) for f in got), out
    assert data.CsvMapping.from_dict({**mapping, "delimiter": "tab"}).delimiter == "\t"
    side = {"path": "items.csv", "key": "item_id", "delimiter": "\\t"}
    assert data.CsvMapping.from_dict({**mapping, "join": [side]}).join[0].delimiter == "\t"
