"""Reading CSV files as text columns with every row's line number, and parsing numbers.

pyarrow parses the file; this module keeps what an error message needs: the physical line
of every row (malformed lines are taken out by pyarrow's invalid-row handler, blank lines
are kept as rows so that counting stays exact), the column by name, and the raw text of a
value that is not a number. Policy "error" stops at the first bad line; "skip" drops it
and counts it (``CsvCounts``).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from gmeta_tf.data.converters.pipeline import record_batches
from gmeta_tf.data.errors import DataError

#: Raw values read as a missing number (pyarrow's defaults, as the CSV reader knows them).
MISSING_NUMBER_TEXT = ("", "NA", "N/A", "n/a", "NaN", "nan", "-NaN", "-nan", "NULL", "null",
                       "None", "#N/A", "#NA")
_NUMBER = r"^\s*[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"


@dataclasses.dataclass
class CsvCounts:
    """What a conversion dropped or repaired, recorded in the manifest and logged."""

    lines_skipped_malformed: int = 0
    rows_skipped_bad_value: int = 0
    blank_lines: int = 0
    truncated_multi_hot_rows: int = 0
    missing_dense_values: int = 0
    rows_without_join_match: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class _LineNumbers:
    """Physical line numbers (1-based) of the rows a pyarrow CSV reader yields.

    Lines pyarrow rejects (wrong column count) are recorded by its invalid-row handler, in
    file order (the reader runs on one thread); every other line is a row.
    """

    def __init__(self, path: str, names: list[str], header_lines: int) -> None:
        self.path, self.names, self.first = path, names, header_lines + 1
        self.rejected: list[int] = []
        self.pending: list[tuple[int, int, str]] = []  # (line, columns found, text)

    def handler(self, row) -> str:
        self.rejected.append(int(row.number))
        self.pending.append((int(row.number), int(row.actual_columns), row.text or ""))
        return "skip"

    def of(self, first_row: int, n: int) -> np.ndarray:
        """Line numbers of rows ``first_row .. first_row + n - 1`` of the file."""
        k = first_row + np.arange(n, dtype=np.int64)
        rejected = np.asarray(self.rejected, np.int64)
        rows_before = rejected - self.first - np.arange(len(rejected))
        return k + self.first + np.searchsorted(rows_before, k, side="right")

    def take_malformed(self, policy: str, counts: CsvCounts) -> None:
        """Raises for (policy "error") or counts (policy "skip") the lines just rejected."""
        if self.pending and policy == "error":
            line, found, text = self.pending[0]
            raise DataError(f"line {line}: malformed line with {found} columns, expected "
                            f"{len(self.names)} ({', '.join(self.names)}); --bad-rows skip "
                            f"drops such lines", file=self.path, value=text[:200])
        counts.lines_skipped_malformed += len(self.pending)
        self.pending.clear()


def header_of(path: str, delimiter: str) -> list[str]:
    """The column names on the first line of a CSV file."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            first = next(csv.reader(f, delimiter=delimiter), None)
    except FileNotFoundError as e:
        raise DataError("input file not found", file=path) from e
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"cannot read the header line: {e}", file=path) from e
    if not first or not any(c.strip() for c in first):
        raise DataError("empty file: no header line and no data rows", file=path)
    return [c.strip() for c in first]


def file_columns(path: str, delimiter: str, header: bool, names: list[str] | None) -> list[str]:
    """The names a CSV file's columns are read by: its header line's; ``names`` for a file
    without one; with both, ``names`` in place of the header line's, one for each of them
    (a file whose columns are named otherwise than a pipeline expects, read unedited)."""
    if not header:
        return list(names or [])
    in_file = header_of(path, delimiter)
    if not names:
        return in_file
    if len(names) != len(in_file):
        raise DataError(f"mapping key 'columns' names {len(names)} columns but the header line "
                        f"(line 1) has {len(in_file)}", file=path, value=list(names),
                        expected=f"{len(in_file)} names, one in place of each of {in_file}")
    return list(names)


def check_columns(path: str, wanted: list[str], available: list[str], what: str,
                  hint: str = "") -> None:
    """Names the first wanted column the file does not have (``hint``: how else to name it)."""
    for name in wanted:
        if name not in available:
            raise DataError(f"{what} {name!r} is not a column of this file", file=path,
                            column=name, expected=f"one of {available}{hint}")


def text_batches(path: str, columns: list[str], *, delimiter: str, header: bool,
                 names: list[str] | None, policy: str, counts: CsvCounts,
                 block_bytes: int, missing_hint: str = ""
                 ) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Batches of ``columns`` as strings, each with the line numbers of its rows, the
    file's columns named as ``file_columns`` gives them (``missing_hint`` ends the error
    naming a column it lacks).

    Blank lines are dropped (counted); malformed lines raise or are skipped per ``policy``.
    """
    all_names = file_columns(path, delimiter, header, names)
    check_columns(path, columns, all_names, "mapped column", missing_hint)
    lines = _LineNumbers(path, all_names, 1 if header else 0)
    read = pacsv.ReadOptions(block_size=block_bytes, use_threads=False,
                             column_names=all_names if names else None,
                             skip_rows=1 if header and names else 0)
    parse = pacsv.ParseOptions(delimiter=delimiter, ignore_empty_lines=False,
                               invalid_row_handler=lines.handler)
    convert = pacsv.ConvertOptions(include_columns=columns,
                                   column_types={c: pa.string() for c in columns},
                                   strings_can_be_null=False, quoted_strings_can_be_null=False)
    opener = functools.partial(pacsv.open_csv, path, read_options=read, parse_options=parse,
                               convert_options=convert)
    for batch, first_row in record_batches(opener, path, "CSV"):
        line_numbers = lines.of(first_row, batch.num_rows)
        batch, line_numbers = _without_blank_lines(batch, line_numbers, counts)
        if lines.pending and policy == "error":  # rows before the bad line go first, so
            before = line_numbers < lines.pending[0][0]  # the earliest problem is reported
            yield batch.filter(pa.array(before)), line_numbers[before]
        lines.take_malformed(policy, counts)
        yield batch, line_numbers
    lines.take_malformed(policy, counts)


def _without_blank_lines(batch: pa.RecordBatch, line_numbers: np.ndarray,
                         counts: CsvCounts) -> tuple[pa.RecordBatch, np.ndarray]:
    blank = np.ones(batch.num_rows, bool)
    for column in batch.columns:
        blank &= pc.equal(pc.utf8_trim_whitespace(column), "").to_numpy(zero_copy_only=False)
    if not blank.any():
        return batch, line_numbers
    counts.blank_lines += int(blank.sum())
    return batch.filter(pa.array(~blank)), line_numbers[~blank]


def numbers(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Text -> float64; missing values are NaN.

    Returns:
        ``(values, bad)``: the numbers, and True where the text is neither a number nor a
        missing marker (``MISSING_NUMBER_TEXT``).
    """
    text = pc.utf8_trim_whitespace(values)
    missing = pc.is_in(text, value_set=pa.array(MISSING_NUMBER_TEXT)).to_numpy(
        zero_copy_only=False)
    good = pc.match_substring_regex(text, _NUMBER).to_numpy(zero_copy_only=False)
    out = np.full(len(text), np.nan)
    if good.any():
        out[good] = pc.cast(text.filter(pa.array(good)), pa.float64()).to_numpy()
    return out, ~(good | missing)


def timestamps(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Text -> float64 for an order column: numbers, or ISO-8601 date-times (seconds)."""
    out, bad = numbers(values)
    if bad.any():
        text = pc.utf8_trim_whitespace(values.filter(pa.array(bad)))
        try:
            seconds = pc.cast(pc.cast(text, pa.timestamp("s")), pa.int64()).to_numpy(
                zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return out, bad
        out[bad] = seconds.astype(np.float64)
        bad = np.zeros_like(bad)
    return out, bad
