"""Reading CSV files as text columns with every row's line number, and parsing numbers.

pyarrow parses the file; this module keeps what an error message needs: the physical line
of every row (malformed lines are taken out by pyarrow's invalid-row handler, blank lines
are kept as rows so that counting stays exact), the column by name, and the raw text of a
value that is not a number. Policy "error" stops at the first bad line; "skip" drops it
and counts it (``CsvCounts``).

A file's text format is a ``CsvDialect``: its field delimiter, which may be several
characters (MovieLens 1M's ``::``), and its character encoding (``latin-1`` for files
written by older tools).
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import datetime
import functools
import io
import itertools
import logging
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from gmeta_tf.data.converters.pipeline import record_batches
from gmeta_tf.data.errors import DataError

log = logging.getLogger(__name__)

#: Raw values read as a missing number (pyarrow's defaults, as the CSV reader knows them).
MISSING_NUMBER_TEXT = ("", "NA", "N/A", "n/a", "NaN", "nan", "-NaN", "-nan", "NULL", "null",
                       "None", "#N/A", "#NA")
#: The byte a delimiter of several characters becomes before pyarrow (which parses one-byte
#: delimiters) reads the file: the ASCII unit separator, which text files do not hold.
_UNIT_SEPARATOR = b"\x1f"
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

    pyarrow numbers records (a header, a row, a line it rejects); lines it rejects (wrong
    column count) are recorded by its invalid-row handler, in file order (the reader runs
    on one thread), and every other record is a row. A record's line is where it starts in
    the file (``RecordLines``: after a quoted value holding line breaks, further down than
    its count).
    """

    def __init__(self, path: str, names: list[str], header_lines: int,
                 dialect: "CsvDialect", record_lines: "RecordLines") -> None:
        self.path, self.names, self.first, self.dialect = path, names, header_lines + 1, dialect
        self.record_lines = record_lines
        self.rejected: list[int] = []  # record numbers
        self.pending: list[tuple[int, int, str]] = []  # (line, columns found, text)

    def handler(self, row) -> str:
        self.rejected.append(int(row.number))
        line = int(self.record_lines(np.array([int(row.number)]))[0])
        self.pending.append((line, int(row.actual_columns), row.text or ""))
        return "skip"

    def of(self, first_row: int, n: int) -> np.ndarray:
        """Line numbers of rows ``first_row .. first_row + n - 1`` of the file."""
        k = first_row + np.arange(n, dtype=np.int64)
        rejected = np.asarray(self.rejected, np.int64)
        rows_before = rejected - self.first - np.arange(len(rejected))
        return self.record_lines(k + self.first + np.searchsorted(rows_before, k, side="right"))

    def take_malformed(self, policy: str, counts: CsvCounts) -> None:
        """Raises for (policy "error") or counts (policy "skip") the lines just rejected.

        A rejected row spanning several lines with an odd number of quotes, in a file the
        ``RecordLines`` pass could not tell closed (a quote it found never closed is
        refused before parsing), may be a quote never closed, the parser reading the lines
        after it into the quoted field: it raises under either policy, as to skip it would
        drop every line it swallowed while counting one. Where the pass found every quote
        closed (an odd count then holds a literal quote inside a field), the row is a row
        of the wrong width as any other. A line of spaces alone is a blank line (counted
        as one), not a malformed one."""
        blank = [p for p in self.pending if not p[2].strip()]
        counts.blank_lines += len(blank)
        self.pending = [p for p in self.pending if p[2].strip()]
        for line, found, text in self.pending:
            spanned = text.rstrip("\r\n").count("\n")
            if (spanned and not self.dialect.several and text.count('"') % 2
                    and self.record_lines.quotes_closed is not True):
                raise _quote_over_lines(
                    self.path, self.dialect, line, text,
                    f"read as one malformed row of {found} columns, {len(self.names)} "
                    f"expected", closed=None)
        if self.pending and policy == "error":
            line, found, text = self.pending[0]
            raise DataError(f"line {line}: malformed line with {found} columns, expected "
                            f"{len(self.names)} ({', '.join(self.names)}); --bad-rows skip "
                            f"(data.bad_rows: skip) drops such lines", file=self.path,
                            value=self.dialect.as_written(text)[:200])
        counts.lines_skipped_malformed += len(self.pending)
        self.pending.clear()


class RecordLines:
    """The physical line each record of a CSV file starts on, by its number (1-based, the
    header line included).

    A record is one line unless a quoted value in it holds line breaks, as a free-text
    column's may; the records after such a value start further down than their count.
    Python's csv reader, which splits records as pyarrow does, finds them in one pass over
    a file that holds a quote character (about 100 MB/s). A file without one, or read with
    a delimiter of several characters (which has no quoting), has one line a record and is
    not read for this.
    """

    def __init__(self, spanning: list[int] | None = None, extra: list[int] | None = None,
                 records: int | None = None) -> None:
        #: The records over several lines, in file order, and the lines each spans beyond
        #: its first.
        self.spanning = np.asarray(spanning or [], np.int64)
        self.extra = np.asarray(extra or [], np.int64)
        self._before = np.concatenate([[0], np.cumsum(self.extra)]).astype(np.int64)
        #: The records the pass counted (None: the file was not read for this).
        self.records = records
        #: A quote never closed: the line of its row, the field it opens (0-based) and the
        #: row as read (its field running to the end of the file).
        self.unclosed: tuple[int, int, str] | None = None
        #: Whether every quote of the file is closed: True (or the file has no quoting),
        #: False (``unclosed``), None (not known: the pass stopped before the end).
        self.quotes_closed: bool | None = True

    def __call__(self, records: np.ndarray) -> np.ndarray:
        if not self.spanning.size:
            return records
        return records + self._before[np.searchsorted(self.spanning, records, side="left")]

    @classmethod
    def of_file(cls, path: str, dialect: "CsvDialect",
                chunk_bytes: int = 1 << 22) -> "RecordLines":
        if dialect.several or not _holds_byte(path, b'"', chunk_bytes):
            return cls()
        spanning, extra = [], []
        limit = csv.field_size_limit()
        # a free-text value may be long (the default limit is 128 KiB); a quote never closed
        # makes one field of the rest of the file, refused at this size, not held whole
        csv.field_size_limit(_FIELD_CHARACTERS)
        # pyarrow drops a UTF-8 byte-order mark: so must the reader, or a quote opening the
        # first field would read as text
        encoding = "utf-8-sig" if codecs.lookup(dialect.encoding).name == "utf-8" else (
            dialect.encoding)
        record = previous = start = 0
        try:
            with open(path, newline="", encoding=encoding, errors="replace") as f:
                reader = csv.reader(f, delimiter=dialect.delimiter)
                fields: list[str] = []
                for record, fields in enumerate(reader, start=1):  # noqa: B007 (the last is read)
                    start = previous + 1  # the line this record starts on
                    if reader.line_num - previous > 1:
                        spanning.append(record)
                        extra.append(reader.line_num - previous - 1)
                    previous = reader.line_num
            # the lenient reader ends a field left open at the end of the file as if closed
            open_at_end = _ends_in_open_quote(path, encoding, dialect.delimiter, start) if (
                record) else False
        except csv.Error as e:
            if "field limit" in str(e):  # a quote never closed, or a value of 16 Mi characters
                raise DataError(f"line {previous + 1}: a quoted value runs over more than "
                                f"{_FIELD_CHARACTERS:,} characters: a quote that is never "
                                f"closed swallows the lines after it; close or remove the "
                                f"quote", file=path) from e
            log.warning("%s: line numbers count rows from line %d on, where lines inside "
                        "quoted values are not known (%s)", path, previous + 1, e)
            out = cls(spanning, extra)
            out.quotes_closed = None
            return out
        finally:
            csv.field_size_limit(limit)
        out = cls(spanning, extra, record)
        out.quotes_closed = None if open_at_end is None else not open_at_end
        if open_at_end:  # the last row's last field runs to the end of the file
            out.unclosed = (int(out(np.array([record]))[0]), len(fields) - 1,
                            dialect.delimiter.join(fields))
        return out

    def refuse_unclosed(self, path: str, names: list[str], dialect: "CsvDialect") -> None:
        """Refuses, before the file is parsed, a quote never closed: its field swallows
        every line after it, whose rows would be lost (read as one row of the right width
        when in a column the mapping does not read), and pyarrow, whose parse blocks a row
        must fit in, cannot read a file's tail as one value. Names the column when the
        row has every column."""
        if self.unclosed is None:
            return
        line, field, text = self.unclosed
        raise _quote_over_lines(path, dialect, line, text, "to the end of the file",
                                column=names[field] if field + 1 == len(names) else None,
                                closed=False)

    def warn_if_spanning(self, path: str, read: int) -> None:
        """Warns when rows span several lines: a free-text column's values may, but a stray
        quote closed by a later one swallows the lines between, whose rows are then lost.
        ``read``: the records pyarrow read (header, rows, rejected lines), which the pass
        must have counted too for its line numbers to be the file's."""
        if self.records is not None and self.records != read:
            log.warning("%s: %d records read, %d counted when finding the rows that span "
                        "lines: line numbers in messages may be off", path, read, self.records)
        if not self.spanning.size:
            return
        longest = int(np.argmax(self.extra))
        n = int(self.spanning.size)
        log.warning("%s: %d lines hold %d rows (header and malformed lines included): %d "
                    "%s several lines, the longest %d lines from line %d on; a "
                    "free-text column's quoted values may hold line breaks, but a quote "
                    "never closed in a column the mapping does not read swallows the lines "
                    "after it, whose rows are then lost", path, read + int(self.extra.sum()),
                    read, n, "row spans" if n == 1 else "rows span",
                    int(self.extra[longest]) + 1,
                    int(self(self.spanning[longest:longest + 1])[0]))


#: The longest value, in characters, ``RecordLines`` reads (16 Mi: 64 MiB in Python's csv
#: reader's buffer); past it the line numbers count rows from there on (warned).
_FIELD_CHARACTERS = 1 << 24


def _ends_in_open_quote(path: str, encoding: str, delimiter: str, line: int) -> bool | None:
    """Whether the file's last record, from ``line`` on, ends inside a quoted field (the
    strict reader says "unexpected end of data" where the lenient one closes it, with or
    without a line break at the end of the file); None when the strict reader stops on
    something else first (a character after a closing quote)."""
    with open(path, newline="", encoding=encoding, errors="replace") as f:
        try:
            for _ in csv.reader(itertools.islice(f, line - 1, None), delimiter=delimiter,
                                strict=True):
                pass
        except csv.Error as e:
            return True if "unexpected end of data" in str(e) else None
    return False


def _holds_byte(path: str, byte: bytes, chunk_bytes: int) -> bool:
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            if byte in chunk:
                return True
    return False


#: Names a delimiter may be given by where a tab is awkward to write (a shell's ``--set``):
#: the word and the two characters backslash-t.
DELIMITER_NAMES = {"tab": "\t", "\\t": "\t"}


def named_delimiter(value: Any) -> Any:
    """``value`` with ``tab`` and ``\\t`` (backslash, t) read as the tab character."""
    return DELIMITER_NAMES.get(value, value) if isinstance(value, str) else value


@dataclasses.dataclass(frozen=True)
class CsvDialect:
    """How a CSV file's text is written.

    Args:
        delimiter: Between fields: one character (``,``, ``\\t``, ``;``; ``tab`` and
            backslash-t are read as the tab by the mappings, ``named_delimiter``), or several, e.g.
            ``::`` as in MovieLens 1M's ``ratings.dat``. A delimiter of several characters
            has no quoting: every occurrence separates two fields, and quotes are text.
        encoding: The file's character encoding (a Python codec name: ``utf-8``,
            ``latin-1``, ``cp1252``).
    """

    delimiter: str = ","
    encoding: str = "utf-8"

    def check(self, key: str = "") -> None:
        """Raises a DataError naming ``key`` (e.g. ``delimiter``) for a bad setting."""
        if not isinstance(self.delimiter, str) or not self.delimiter:
            raise DataError(f"mapping key '{key}delimiter' is not allowed", value=self.delimiter,
                            expected="a non-empty string, e.g. ',', '\\t' or '::'")
        if "\n" in self.delimiter or "\r" in self.delimiter:
            raise DataError(f"mapping key '{key}delimiter' is not allowed", value=self.delimiter,
                            expected="characters other than a line break")
        if not isinstance(self.encoding, str) or not self.encoding:
            raise DataError(f"mapping key '{key}encoding' is not allowed", value=self.encoding,
                            expected="a codec name, e.g. 'utf-8' or 'latin-1'")
        try:
            codec = codecs.lookup(self.encoding)
        except LookupError as e:
            raise DataError(f"mapping key '{key}encoding' is not allowed: unknown encoding",
                            value=self.encoding, expected="a Python codec name, e.g. "
                            "'utf-8', 'latin-1' or 'cp1252'") from e
        if codec.encode("\n")[0] != b"\n":
            raise DataError(f"mapping key '{key}encoding' is not allowed", value=self.encoding,
                            expected="an encoding that writes ASCII as itself (utf-8, latin-1, "
                                     "cp1252, ...)")

    @property
    def several(self) -> bool:
        """Whether the delimiter has several characters (read through ``_DelimiterStream``)."""
        return len(self.delimiter) > 1

    def as_written(self, text: str) -> str:
        """A line as pyarrow parsed it, with the delimiter the file has."""
        return text.replace(_UNIT_SEPARATOR.decode(), self.delimiter) if self.several else text

    def split_line(self, line: str) -> list[str]:
        """One line's fields (a header line's names)."""
        if self.several:
            return line.rstrip("\r\n").split(self.delimiter)
        return next(csv.reader([line], delimiter=self.delimiter), [])

    def source(self, path: str):
        """What ``pyarrow.csv.open_csv`` reads: the path, or for a delimiter of several
        characters a stream of the file with each delimiter made one byte."""
        if not self.several:
            return path
        return io.BufferedReader(_DelimiterStream(path, self.delimiter.encode(self.encoding)),
                                 buffer_size=1 << 20)

    def parse_options(self, handler) -> pacsv.ParseOptions:
        if self.several:
            return pacsv.ParseOptions(delimiter=_UNIT_SEPARATOR.decode(), quote_char=False,
                                      ignore_empty_lines=False, invalid_row_handler=handler)
        # a quoted value may hold line breaks (a free-text column's): without
        # newlines_in_values one that crosses a parse block stops the reader
        return pacsv.ParseOptions(delimiter=self.delimiter, ignore_empty_lines=False,
                                  newlines_in_values=True, invalid_row_handler=handler)


class _DelimiterStream(io.RawIOBase):
    """A file's bytes with every (left-to-right, non-overlapping) occurrence of a delimiter
    of several bytes replaced by ``_UNIT_SEPARATOR``: what pyarrow's one-byte CSV parser
    reads. Line breaks are untouched, so line numbers are the file's own. A file that
    already holds the unit separator is refused (its fields could not be told apart)."""

    def __init__(self, path: str, delimiter: bytes, chunk_bytes: int = 1 << 20) -> None:
        super().__init__()
        self.path, self.delimiter, self.chunk_bytes = path, delimiter, chunk_bytes
        self.file = open(path, "rb")
        self.out = b""       # replaced bytes not yet read
        self.held = b""      # raw bytes that may begin a delimiter the next chunk ends
        self.lines_before = 0
        self.eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.out and not self.eof:
            self._fill()
        n = min(len(buffer), len(self.out))
        buffer[:n] = self.out[:n]
        self.out = self.out[n:]
        return n

    def _fill(self) -> None:
        chunk = self.file.read(self.chunk_bytes)
        self.eof = not chunk
        found = chunk.find(_UNIT_SEPARATOR)
        if found >= 0:
            line = self.lines_before + self.held.count(b"\n") + chunk.count(b"\n", 0, found) + 1
            raise DataError(f"line {line}: the file holds the byte 0x1F (ASCII unit separator), "
                            f"which reading a delimiter of several characters uses",
                            file=self.path, expected="a file without that byte, or a "
                            "one-character delimiter")
        text = (self.held + chunk).replace(self.delimiter, _UNIT_SEPARATOR)
        keep = 0 if self.eof else _prefix_at_end(text, self.delimiter)
        self.held, text = text[len(text) - keep:], text[:len(text) - keep]
        self.lines_before += text.count(b"\n")
        self.out += text

    def close(self) -> None:
        self.file.close()
        super().close()


def _prefix_at_end(text: bytes, delimiter: bytes) -> int:
    """The length of the longest proper prefix of ``delimiter`` that ``text`` ends with."""
    for k in range(len(delimiter) - 1, 0, -1):
        if text.endswith(delimiter[:k]):
            return k
    return 0


#: The leading bytes of compressed files a CSV converter may be handed by mistake.
COMPRESSED_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz",
                    b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip"}


def refuse_compressed(path: str) -> None:
    """A compressed file is named as such (the converters read plain text), not reported as
    text in the wrong encoding."""
    try:
        with open(path, "rb") as f:
            start = f.read(6)
    except FileNotFoundError as e:
        raise DataError("input file not found", file=path) from e
    for magic, kind in COMPRESSED_MAGIC.items():
        if start.startswith(magic):
            raise DataError(f"the file is {kind}-compressed; the CSV converters read plain "
                            f"text: decompress it first (e.g. {_UNPACK[kind]})", file=path)


_UNPACK = {"gzip": "gunzip -k FILE", "bzip2": "bunzip2 -k FILE", "xz": "unxz -k FILE",
           "zstd": "zstd -d FILE", "zip": "unzip FILE"}


def header_of(path: str, dialect: CsvDialect) -> list[str]:
    """The column names on the first line of a CSV file."""
    refuse_compressed(path)  # names a missing file too
    try:
        with open(path, "rb") as f:
            first = dialect.split_line(f.readline().decode(dialect.encoding).lstrip("\ufeff"))
    except UnicodeDecodeError as e:
        raise DataError(f"line 1: the header line is not {dialect.encoding} text ({e.reason} "
                        f"at byte {e.start}){ENCODING_HINT}", file=path,
                        value=e.object[max(0, e.start - 20):e.end + 20].decode(
                            dialect.encoding, "replace")) from e
    except csv.Error as e:
        raise DataError(f"cannot read the header line: {e}", file=path) from e
    if not first or not any(c.strip() for c in first):
        raise DataError("empty file: no header line and no data rows", file=path)
    return [c.strip() for c in first]


ENCODING_HINT = "; the mapping key 'encoding' names the file's encoding, e.g. latin-1"


def file_columns(path: str, dialect: CsvDialect, header: bool,
                 names: list[str] | None) -> list[str]:
    """The names a CSV file's columns are read by: its header line's; ``names`` for a file
    without one; with both, ``names`` in place of the header line's, one for each of them
    (a file whose columns are named otherwise than a pipeline expects, read unedited)."""
    if not header:
        refuse_compressed(path)
        return list(names or [])
    in_file = header_of(path, dialect)
    if not names:
        return in_file
    if len(names) != len(in_file):
        raise DataError(f"mapping key 'columns' names {len(names)} columns but the header line "
                        f"(line 1) has {len(in_file)}", file=path, value=list(names),
                        expected=f"{len(in_file)} names, one in place of each of {in_file}")
    return list(names)


def check_columns(path: str, wanted: list[str], available: list[str], what: str,
                  hint: str = "") -> None:
    """Names the first wanted column the file does not have (``hint``: how else to name it),
    or has twice (which of the two is meant is not known)."""
    for name in wanted:
        if name not in available:
            if len(available) == 1:
                hint += _delimiter_hint(available[0])
            raise DataError(f"{what} {name!r} is not a column of this file", file=path,
                            column=name, expected=f"one of {available}{hint}")
        at = [i + 1 for i, n in enumerate(available) if n == name]
        if len(at) > 1:
            raise DataError(f"{what} {name!r} names {len(at)} columns of this file (columns "
                            f"{', '.join(map(str, at))} of line 1)", file=path, column=name,
                            expected=f"one column of that name{hint}")


def _delimiter_hint(header: str) -> str:
    """When a header line read as a single column holds another common delimiter: that
    the file may be delimited by it."""
    for found, given in ((";", ";"), ("\t", "tab"), ("|", "|"), ("::", "::")):
        if found in header:
            return (f"; the header line reads as one column but holds {found!r}: if that "
                    f"is the file's delimiter, say so (mapping key 'delimiter', gmeta data "
                    f"csv --delimiter {given!r})")
    return ""


def text_batches(path: str, columns: list[str], *, dialect: CsvDialect, header: bool,
                 names: list[str] | None, policy: str, counts: CsvCounts,
                 block_bytes: int, missing_hint: str = ""
                 ) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Batches of ``columns`` as strings, each with the line numbers of its rows, the
    file's columns named as ``file_columns`` gives them (``missing_hint`` ends the error
    naming a column it lacks).

    Blank lines are dropped (counted); malformed lines raise or are skipped per ``policy``.
    """
    all_names = file_columns(path, dialect, header, names)
    check_columns(path, columns, all_names, "mapped column", missing_hint)
    record_lines = RecordLines.of_file(path, dialect)
    record_lines.refuse_unclosed(path, all_names, dialect)
    lines = _LineNumbers(path, all_names, 1 if header else 0, dialect, record_lines)
    # the names as read (a header line's with spaces around them stripped), never the
    # parser's own reading of the header line
    read = pacsv.ReadOptions(block_size=block_bytes, use_threads=False, column_names=all_names,
                             skip_rows=1 if header else 0, encoding=dialect.encoding)
    parse = dialect.parse_options(lines.handler)
    convert = pacsv.ConvertOptions(include_columns=columns,
                                   column_types={c: pa.string() for c in columns},
                                   strings_can_be_null=False, quoted_strings_can_be_null=False)
    opener = functools.partial(_open_csv, path, dialect, read_options=read,
                               parse_options=parse, convert_options=convert)
    rows = 0
    for batch, first_row in record_batches(opener, path, "CSV"):
        rows += batch.num_rows
        line_numbers = lines.of(first_row, batch.num_rows)
        batch, line_numbers = _without_blank_lines(batch, line_numbers, counts)
        _refuse_values_over_lines(batch, line_numbers, path, dialect,
                                  closed=record_lines.quotes_closed)
        if lines.pending and policy == "error":  # rows before the bad line go first, so
            before = line_numbers < lines.pending[0][0]  # the earliest problem is reported
            yield batch.filter(pa.array(before)), line_numbers[before]
        lines.take_malformed(policy, counts)
        yield batch, line_numbers
    lines.take_malformed(policy, counts)
    record_lines.warn_if_spanning(path, (1 if header else 0) + rows + len(lines.rejected))


def _refuse_values_over_lines(batch: pa.RecordBatch, line_numbers: np.ndarray, path: str,
                              dialect: CsvDialect, closed: bool | None) -> None:
    """Refuses, under either bad-rows policy, a mapped value holding a line break (an id, a
    label or a number never spans lines): a stray quote whose field runs over the lines
    after it, up to the next quote (``closed``: True) or one never closed (None: not
    known). Skipped as one bad row, it would drop every line it swallowed while counting
    one."""
    for name in batch.schema.names:
        column = batch.column(name)
        broken = pc.fill_null(pc.match_substring_regex(column, "[\r\n]"), False)
        if not pc.any(broken).as_py():
            continue
        i = int(np.flatnonzero(broken.to_numpy(zero_copy_only=False))[0])
        raise _quote_over_lines(path, dialect, int(line_numbers[i]), column[i].as_py(),
                                "a value of a mapped column never spans lines", column=name,
                                closed=closed)


def _quote_over_lines(path: str, dialect: CsvDialect, line: int, text: str, why: str,
                      column: str | None = None, closed: bool | None = False) -> DataError:
    """The error of a quote opened on ``line`` whose field ``text`` swallowed the lines
    after it: ``closed`` False, never closed; True, closed by a later quote (a stray quote
    paired with the next one); None, not known which."""
    spanned = text.rstrip("\r\n").replace("\r\n", "\n").count("\n")
    what = {False: "a quote that is never closed: the field it opens runs",
            True: "a quote closed only by a later line's quote: the field it opens runs",
            None: "a quote closed by a later line's quote or never: the field it opens "
                  "runs"}[closed]
    lines = ("over the next line" if spanned == 1 else f"over the next {spanned} lines"
             if spanned else "to the end of the file")
    why = f" ({why})" if why != lines else ""  # not said twice
    return DataError(f"line {line}: {what} {lines}{why}; close or remove the quote",
                     file=path, column=column,
                     value=dialect.as_written((text.splitlines() or [""])[0])[:200])


def _open_csv(path: str, dialect: CsvDialect, **options) -> pacsv.CSVStreamingReader:
    """pyarrow's streaming reader of ``path``; text the encoding cannot decode is reported by
    its line."""
    try:
        return _Reader(pacsv.open_csv(dialect.source(path), **options), path, dialect)
    except pa.ArrowInvalid as e:
        _raise_if_not_text(e, path, dialect)
        raise


class _Reader:
    """A pyarrow CSV reader whose text-decoding errors name the file's line."""

    def __init__(self, reader, path: str, dialect: CsvDialect) -> None:
        self.reader, self.path, self.dialect = reader, path, dialect

    def read_next_batch(self) -> pa.RecordBatch:
        try:
            return self.reader.read_next_batch()
        except pa.ArrowInvalid as e:
            _raise_if_not_text(e, self.path, self.dialect)
            raise


def _raise_if_not_text(error: Exception, path: str, dialect: CsvDialect) -> None:
    """For a pyarrow error on text the encoding does not decode, a DataError naming the
    first such line of the file (read again, on this error path only)."""
    if "UTF8" not in str(error) and "decode" not in str(error):
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                raw.decode(dialect.encoding)
            except UnicodeDecodeError as e:
                raise DataError(f"line {number}: not {dialect.encoding} text ({e.reason} at "
                                f"byte {e.start} of the line){ENCODING_HINT}", file=path,
                                value=raw[max(0, e.start - 20):e.end + 20].decode(
                                    dialect.encoding, "replace")) from error


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
    """Text -> float64 for an order column: numbers, or ISO-8601 date-times as seconds
    (``2024-05-01``, ``2024-05-01 10:00``, ``2024-05-01T10:00:00.250Z``,
    ``...+02:00``; one without an offset is read as UTC).

    Returns:
        ``(values, bad)``, bad True where the text is neither (each value on its own: one
        bad date-time leaves the others read).
    """
    out, bad = numbers(values)
    if not bad.any():
        return out, bad
    at = np.flatnonzero(bad)
    text = pc.utf8_trim_whitespace(values.filter(pa.array(bad)))
    try:  # the common forms of a whole column at once
        out[at] = pc.cast(pc.cast(text, pa.timestamp("s")), pa.int64()).to_numpy(
            zero_copy_only=False).astype(np.float64)
        bad[at] = False
        return out, bad
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    encoded = pc.dictionary_encode(text)
    seconds = np.array([_iso_seconds(w) for w in encoded.dictionary.to_pylist()], np.float64)
    got = seconds[encoded.indices.to_numpy(zero_copy_only=False)]
    out[at], bad[at] = got, np.isnan(got)
    return out, bad


def _iso_seconds(text: str) -> float:
    """Seconds since the epoch of an ISO-8601 date-time (UTC unless it has an offset), or
    NaN."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return float("nan")
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()
