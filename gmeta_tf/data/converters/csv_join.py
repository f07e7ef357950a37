"""Side files joined to a CSV on a key: items with their genres, users with their attributes.

A side file is a small CSV read whole (one row per key); every row of the main file gets
the side columns of the row whose key equals its ``on`` column (keys compare as text). A
row without a match gets empty values (id 0, no multi-hot ids, dense 0.0) and is counted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gmeta_tf.data.converters.csv_lines import (CsvCounts, CsvDialect, file_columns,
                                                named_delimiter, text_batches)
from gmeta_tf.data.errors import DataError


@dataclasses.dataclass
class JoinSpec:
    """One side file of a CSV mapping.

    Args:
        path: The side CSV file.
        key: Its key column (one row per key).
        on: The main file's column holding the key (default: the same name as ``key``).
        columns: Side columns to add (default: every column but the key).
        delimiter: The side file's field delimiter (default: the main file's).
        encoding: The side file's character encoding (default: the main file's).
        header: Whether its first line names its columns (false: ``names`` does).
        names: Its column names, one for each column in its order: for a file without a
            header line, or read in place of its header line's.
    """

    path: str
    key: str
    on: str | None = None
    columns: list[str] | None = None
    delimiter: str | None = None
    encoding: str | None = None
    header: bool = True
    names: list[str] | None = None

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "JoinSpec":
        if not isinstance(d, dict):
            raise DataError(f"mapping key {where!r} is not allowed", value=d,
                            expected="a mapping with keys path, key, on, columns, delimiter, "
                                     "encoding, header, names")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DataError(f"mapping key '{where}.{unknown[0]}' is not allowed: unknown key",
                            expected=f"keys among {sorted(known)}")
        for name in ("path", "key"):
            if not isinstance(d.get(name), str) or not d[name]:
                raise DataError(f"mapping key '{where}.{name}' is not allowed", value=d.get(name),
                                expected="a non-empty string")
        for name in ("columns", "names"):
            value = d.get(name)
            if value is not None and (not isinstance(value, list)
                                      or not all(isinstance(c, str) and c for c in value)):
                raise DataError(f"mapping key '{where}.{name}' is not allowed", value=value,
                                expected="a list of column names")
        if not isinstance(d.get("header", True), bool):
            raise DataError(f"mapping key '{where}.header' is not allowed", value=d["header"],
                            expected="true or false")
        if d.get("header") is False and not d.get("names"):
            raise DataError(f"mapping key '{where}.names' is missing: header: false needs the "
                            f"side file's column names, e.g. names: [item_id, title, genres]")
        if "delimiter" in d:
            d = {**d, "delimiter": named_delimiter(d["delimiter"])}
        spec = cls(**d)
        spec.dialect(CsvDialect()).check(f"{where}.")
        return spec

    def dialect(self, main: CsvDialect) -> CsvDialect:
        """The side file's dialect: its own delimiter and encoding, else the main file's."""
        return CsvDialect(self.delimiter or main.delimiter, self.encoding or main.encoding)

    @property
    def main_column(self) -> str:
        return self.on or self.key


class SideTable:
    """A side file in memory, ready to be joined to batches of the main file."""

    def __init__(self, spec: JoinSpec, main: CsvDialect, block_bytes: int = 16 << 20):
        self.spec = spec
        dialect = spec.dialect(main)
        available = file_columns(spec.path, dialect, spec.header, spec.names)
        self.columns = (list(spec.columns) if spec.columns is not None
                        else [c for c in available if c != spec.key])
        counts = CsvCounts()
        batches = list(text_batches(spec.path, [spec.key, *self.columns], dialect=dialect,
                                    header=spec.header, names=spec.names, policy="error",
                                    counts=counts, block_bytes=block_bytes))
        if not batches or not sum(b.num_rows for b, _ in batches):
            raise DataError("side file has no data rows", file=spec.path)
        table = pa.Table.from_batches([b for b, _ in batches])
        lines = np.concatenate([n for _, n in batches])
        self.keys = pc.utf8_trim_whitespace(table.column(spec.key).combine_chunks())
        self._check_unique(lines)
        self.values = {c: table.column(c).combine_chunks() for c in self.columns}

    def _check_unique(self, lines: np.ndarray) -> None:
        first = pc.index_in(self.keys, value_set=self.keys).to_numpy(zero_copy_only=False)
        repeated = np.flatnonzero(first != np.arange(len(first)))
        if repeated.size:
            i = int(repeated[0])
            raise DataError(f"line {lines[i]}: key repeated (first on line {lines[first[i]]}); "
                            f"a side file holds one row per key", file=self.spec.path,
                            column=self.spec.key, value=self.keys[i].as_py())

    def join(self, main_keys: pa.Array, counts: CsvCounts) -> dict[str, pa.Array]:
        """The side columns for every main row (empty text where no key matched)."""
        index = pc.index_in(pc.utf8_trim_whitespace(main_keys), value_set=self.keys)
        counts.rows_without_join_match += index.null_count
        return {c: pc.fill_null(v.take(index), "") for c, v in self.values.items()}
