"""Generic CSV -> dataset, driven by a column mapping (YAML, command line or Python).

A new dataset needs a mapping, not code. Every key (README, "Your own data")::

    task: user_id              # the task column: its value is the task (user, ad, site);
                               # absent: every row is its own task (a plain CTR model's rows)
    label: rating              # the label column (a number)
    label_threshold: 4         # optional: label = 1 if rating >= 4 else 0 (raw kept as 'rating')
    label_range: [1, 5]        # optional: valid raw label values; others are bad rows
    sparse: [user_id, item_id, occupation]   # categorical columns -> int64 ids
    multi_hot: {genres: 6}     # column: width; values joined by `separator`
    dense: [age]               # numeric columns (missing -> 0.0, counted)
    order_by: timestamp        # optional: numbers or ISO date-times; "last" query rows are
                               # the latest
    separator: "|"             # between the values of a multi-hot cell
    delimiter: ","             # between fields; several characters too, e.g. "::"
    encoding: utf-8            # the file's character encoding, e.g. latin-1
    header: true               # false: give `columns: [names...]`
    columns: null              # with a header line: names read in place of that line's
    join:                      # optional side files, joined on a key before mapping
      - {path: items.csv, key: item_id, columns: [genres]}
      - {path: users.csv, key: user_id, on: user_id, delimiter: ";"}
      - {path: movies.dat, key: item_id, header: false, names: [item_id, title, genres]}

Sparse and multi-hot values become ids as described in ``gmeta_tf.data.hashing``. Every
row keeps its line number until it is written, so a bad value is reported by line and
column name; with ``bad_rows: skip`` malformed lines, unparseable numbers, empty task
values and bad labels are dropped and counted in the manifest. Without a ``task`` column
every row is its own task (``ROW_TASK_BITS``: the file's index and the row's line), so a
plain CTR model's validation split is a seeded fraction of the rows, not of the values
of some column, whose tasks can be of very unequal sizes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gmeta_tf.data import hashing
from gmeta_tf.data.converters.csv_join import JoinSpec, SideTable
from gmeta_tf.data.converters.csv_lines import (CsvCounts, CsvDialect, file_columns,
                                                header_of, named_delimiter, numbers,
                                                text_batches, timestamps)
from gmeta_tf.data.converters.pipeline import (OutputConfig, RawBatch, columns_to_batch, convert,
                                              expected_label, label_problems)
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import Manifest
from gmeta_tf.data.schema import (LABEL_COLUMN, ROW_TASK_BITS, TASK_COLUMN, Feature,
                                  FeatureKind, Schema)
from gmeta_tf.data.split import ORDER_COLUMN, SplitConfig

log = logging.getLogger(__name__)

#: How many rows a conversion skipping bad values names in its log (the rest are counted).
SKIPPED_ROWS_LOGGED = 3
LABEL = LABEL_COLUMN


@dataclasses.dataclass
class CsvMapping:
    """Which CSV column plays which role. One type for YAML, CLI and Python."""

    label: str
    task: str | None = None
    label_threshold: float | None = None
    label_range: tuple[float, float] | None = None
    sparse: list[str] = dataclasses.field(default_factory=list)
    multi_hot: dict[str, int] = dataclasses.field(default_factory=dict)
    dense: list[str] = dataclasses.field(default_factory=list)
    order_by: str | None = None
    separator: str = "|"
    delimiter: str = ","
    encoding: str = "utf-8"
    header: bool = True
    columns: list[str] | None = None
    join: list[JoinSpec] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("task", "label", "separator"):
            if name == "task" and self.task is None:
                continue
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise DataError(f"mapping key {name!r} is not allowed", value=getattr(self, name),
                                expected="a non-empty string")
        self.dialect.check()
        for name in ("sparse", "dense", "columns"):
            value = getattr(self, name)
            if name == "columns" and value is None:
                continue
            if not isinstance(value, list) or not all(isinstance(c, str) and c for c in value):
                raise DataError(f"mapping key {name!r} is not allowed", value=value,
                                expected="a list of column names")
        if not isinstance(self.multi_hot, dict) or not all(
                isinstance(c, str) and c for c in self.multi_hot):
            raise DataError("mapping key 'multi_hot' is not allowed", value=self.multi_hot,
                            expected="a mapping of column name to width, e.g. {genres: 3}")
        for column, width in self.multi_hot.items():
            if isinstance(width, bool) or not isinstance(width, int) or width < 1:
                raise DataError(f"mapping key 'multi_hot.{column}' is not allowed", value=width,
                                expected="a width (an integer >= 1)")
        if self.label_range is not None and not self.label_range[0] <= self.label_range[1]:
            raise DataError("mapping key 'label_range' is not allowed", value=list(self.label_range),
                            expected="[low, high] with low <= high")
        roles = [*self.sparse, *self.multi_hot, *self.dense]
        twice = sorted({c for c in roles if roles.count(c) > 1})
        if twice:
            raise DataError(f"column {twice[0]!r} has two roles in the mapping",
                            expected="each column in one of sparse, multi_hot, dense")
        if not self.header and not self.columns:
            raise DataError("mapping key 'columns' is missing: header: false needs the column "
                            "names, e.g. columns: [user, item, rating]")

    @property
    def dialect(self) -> CsvDialect:
        """How the main file's text is written (side files default to it)."""
        return CsvDialect(self.delimiter, self.encoding)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CsvMapping":
        """Builds a mapping from a parsed YAML/JSON dict, rejecting unknown keys."""
        if not isinstance(d, dict):
            raise DataError("a mapping must be a YAML mapping of keys", value=d,
                            expected=f"keys among {sorted(f.name for f in dataclasses.fields(cls))}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DataError(f"unknown mapping keys {unknown}", expected=f"keys among {sorted(known)}")
        if "label" not in d:
            raise DataError("mapping key 'label' is missing", expected="a column name")
        d = dict(d)
        if "delimiter" in d:
            d["delimiter"] = named_delimiter(d["delimiter"])
        if isinstance(d.get("multi_hot"), list):  # ["genres:6", ...] from the command line
            d["multi_hot"] = dict(_name_width(s) for s in d["multi_hot"])
        for name in ("label_threshold",):
            if d.get(name) is not None:
                d[name] = _number(d[name], name)
        if d.get("label_range") is not None:
            rng = d["label_range"]
            if not isinstance(rng, (list, tuple)) or len(rng) != 2:
                raise DataError("mapping key 'label_range' is not allowed", value=rng,
                                expected="[low, high]")
            d["label_range"] = tuple(_number(v, "label_range") for v in rng)
        joins = d.get("join") or []
        if not isinstance(joins, list):
            raise DataError("mapping key 'join' is not allowed", value=joins,
                            expected="a list of side files {path, key, ...}")
        d["join"] = [j if isinstance(j, JoinSpec) else JoinSpec.from_dict(j, f"join[{i}]")
                     for i, j in enumerate(joins)]
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str) -> "CsvMapping":
        import yaml

        from gmeta_tf.config_fields import load_yaml

        try:
            with open(path, encoding="utf-8") as f:
                raw = load_yaml(f) or {}
        except OSError as e:
            raise DataError(f"cannot read the mapping file: {e.strerror}", file=path) from e
        except yaml.YAMLError as e:
            raise DataError(f"mapping file is not valid YAML: {e}", file=path) from e
        try:
            return cls.from_dict(raw)
        except DataError as e:
            raise DataError(str(e), file=path) from e

    def schema(self) -> Schema:
        """The output schema this mapping produces."""
        features = [Feature(c, FeatureKind.SPARSE) for c in self.sparse]
        features += [Feature(c, FeatureKind.MULTI_HOT, w) for c, w in self.multi_hot.items()]
        features += [Feature(c, FeatureKind.DENSE) for c in self.dense]
        if self.label_threshold is None:
            features.append(Feature(LABEL, FeatureKind.LABEL, value_range=self.label_range))
        else:
            features.append(Feature(LABEL, FeatureKind.LABEL, value_range=(0.0, 1.0)))
            if self.label != LABEL:
                features.append(Feature(self.label, FeatureKind.LABEL, value_range=self.label_range))
        return Schema(features)

    def joined_columns(self, sides: list[SideTable]) -> set[str]:
        return {c for side in sides for c in side.columns}

    def input_columns(self, joined: set[str] = frozenset()) -> list[str]:
        """Columns read from the main file (joined ones come from side files)."""
        cols = [*([self.task] if self.task else []), self.label, *self.sparse,
                *self.multi_hot, *self.dense]
        if self.order_by:
            cols.append(self.order_by)
        cols = [c for c in cols if c not in joined]
        cols += [j.main_column for j in self.join]
        return list(dict.fromkeys(cols))


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise DataError(f"mapping key {key!r} is not allowed", value=value,
                        expected="a finite number")
    return float(value)


def _name_width(spec: str) -> tuple[str, int]:
    name, _, width = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not name or not width.isdigit():
        raise DataError("multi-hot spec needs a width", value=spec, expected="NAME:WIDTH, e.g. genres:6")
    return name, int(width)


class _RowParser:
    """Text columns of one batch -> the storage columns of the mapping's schema."""

    def __init__(self, mapping: CsvMapping, sides: list[SideTable], policy: str,
                 counts: CsvCounts) -> None:
        self.mapping, self.sides, self.policy, self.counts = mapping, sides, policy, counts
        self.rows_named = 0  # skipped rows named in the log so far
        self.rows = 0  # rows kept
        self.holding_values: set[str] = set()  # feature columns with a value in a kept row
        self.stored_label = LABEL if mapping.label_threshold is None else mapping.label
        # an out-of-range label's error names the key that set the range
        self.range_set_by = ({self.stored_label: "the mapping key 'label_range' (gmeta data csv "
                                                 "--label-range)"}
                             if mapping.label_range is not None else {})

    def _expected_number(self, column: str) -> str:
        """What a number column's cell may hold, as an error says it."""
        m = self.mapping
        if column == m.label:
            lo, hi = m.label_range or (-np.inf, np.inf)
            return expected_label(lo, hi, self.range_set_by.get(self.stored_label))
        return "a number, or an empty cell, NA or NaN for a missing value (read as 0)"

    def parse(self, batch: pa.RecordBatch, lines: np.ndarray, path: str, file_index: int,
              in_header: dict[str, str] | None = None) -> RawBatch:
        """``in_header``: the header line's own name of each column the mapping key
        ``columns`` renames, so that errors name a column as the file does."""
        m = self.mapping
        in_header = in_header or {}
        text = {name: batch.column(name) for name in batch.schema.names}
        for side in self.sides:
            text.update(side.join(text[side.spec.main_column], self.counts))
        values, problems = {}, []
        # (rows, column, problem, what was expected, dropped here) of each check
        for column in dict.fromkeys([m.label, *m.dense]):
            values[column], bad = numbers(text[column])
            problems.append((bad, column, "not a number", self._expected_number(column), True))
        problems.extend(self._label_problems(values[m.label]))
        if m.order_by:
            values[ORDER_COLUMN], bad = timestamps(text[m.order_by])
            problems.append((bad, m.order_by, "not a number or an ISO date-time",
                             "seconds, or an ISO-8601 date-time such as 2026-12-06T10:00:00",
                             True))
        if m.task:
            empty_task = pc.equal(pc.utf8_trim_whitespace(text[m.task]), "").to_numpy(
                zero_copy_only=False)
            problems.append((empty_task, m.task, "empty task value",
                             f"the row's task ({m.task}), not empty", True))
        keep = self._keep(problems, text, lines, path, in_header)
        if keep is not None:
            text = {k: v.filter(pa.array(keep)) for k, v in text.items()}
            values = {k: v[keep] for k, v in values.items()}
            lines = lines[keep]
        label_in_file = in_header.get(m.label, m.label)
        own = {self.stored_label: label_in_file} if self.stored_label != label_in_file else {}
        return RawBatch(columns_to_batch(self._columns(text, values, lines, file_index)),
                        path, 0, lines, file_columns=own,
                        task_text=pc.utf8_trim_whitespace(text[m.task]) if m.task else None,
                        range_set_by=self.range_set_by)

    def _label_problems(self, label: np.ndarray) -> list[tuple]:
        """A missing label and one outside ``label_range``: rows the label check of the
        conversion drops and counts (``check_labels``), found here too so that the
        earliest bad row of any kind is the one an error names, and the first skipped are
        named."""
        lo, hi = self.mapping.label_range or (-np.inf, np.inf)
        expected = self._expected_number(self.mapping.label)
        return [(mask, self.mapping.label, problem, expected, False)
                for mask, problem in label_problems(label, lo, hi)]

    def _keep(self, problems: list, text: dict, lines: np.ndarray, path: str,
              in_header: dict[str, str]) -> np.ndarray | None:
        """None when no row is dropped here; otherwise the rows to keep (policy "skip")."""
        bad, dropped = np.zeros(len(lines), bool), np.zeros(len(lines), bool)
        for mask, *_, here in problems:
            bad |= mask
            if here:
                dropped |= mask
        if not bad.any():
            return None
        m = self.mapping
        if self.policy == "error":
            i = int(np.flatnonzero(bad)[0])
            _, column, problem, expected, here = next(p for p in problems if p[0][i])
            task = repr(text[m.task][i].as_py().strip()) if m.task and not here else None
            raise DataError(f"line {lines[i]}: {problem}",
                            file=path, column=in_header.get(column, column), task=task,
                            value=text[column][i].as_py(),
                            expected=f"{expected}; --bad-rows skip (data.bad_rows: skip) drops "
                                     "such rows")
        # the first few skipped rows, each named as the error policy would name it
        for i in np.flatnonzero(bad)[:max(0, SKIPPED_ROWS_LOGGED - self.rows_named)]:
            _, column, problem, expected, _ = next(p for p in problems if p[0][i])
            log.warning("%s: column '%s': line %d: %s (got %r, expected %s): row skipped "
                        "(data.bad_rows: skip; the first %d such rows are named)", path,
                        in_header.get(column, column), lines[i], problem,
                        text[column][i].as_py(), expected, SKIPPED_ROWS_LOGGED)
            self.rows_named += 1
        self.counts.rows_skipped_bad_value += int(dropped.sum())
        return None if not dropped.any() else ~dropped

    def _columns(self, text: dict, values: dict, lines: np.ndarray,
                 file_index: int) -> dict[str, np.ndarray]:
        m = self.mapping
        tasks = (hashing.to_ids(pc.utf8_trim_whitespace(text[m.task]), m.task) if m.task
                 else (np.int64(file_index) << ROW_TASK_BITS) + lines.astype(np.int64))
        cols: dict[str, np.ndarray] = {TASK_COLUMN: tasks}
        self.rows += len(lines)
        for c in m.sparse:
            cols[c] = hashing.to_ids(pc.utf8_trim_whitespace(text[c]), c)
            if (cols[c] != hashing.MISSING_ID).any():
                self.holding_values.add(c)
        for c, width in m.multi_hot.items():
            slots, truncated = hashing.to_slots(text[c], c, m.separator, width)
            self.counts.truncated_multi_hot_rows += truncated
            cols.update({f"{c}__{i}": slots[:, i] for i in range(width)})
            if (slots >= 0).any():
                self.holding_values.add(c)
        for c in m.dense:
            self.counts.missing_dense_values += int(np.isnan(values[c]).sum())
            cols[c] = np.nan_to_num(values[c], nan=0.0).astype(np.float32)
            if not np.isnan(values[c]).all():
                self.holding_values.add(c)
        raw = values[m.label].astype(np.float32)
        if m.label_threshold is None:
            cols[LABEL] = raw
        else:  # NaN stays NaN so the label check still sees it
            cols[LABEL] = np.where(np.isnan(raw), np.nan, raw >= m.label_threshold).astype(np.float32)
            if m.label != LABEL:
                cols[m.label] = raw
        if m.order_by:
            cols[ORDER_COLUMN] = values[ORDER_COLUMN]
        return cols


RENAME_HINT = (", or the mapping key 'columns': one name for each column of the file, read in "
               "place of its header line's")


def _raw_batches(paths: list[str], mapping: CsvMapping, sides: list[SideTable], policy: str,
                 counts: CsvCounts, block_bytes: int) -> Iterator[RawBatch]:
    parser = _RowParser(mapping, sides, policy, counts)
    columns = mapping.input_columns(mapping.joined_columns(sides))
    for index, path in enumerate(paths):
        in_header = ({read: own for read, own in zip(mapping.columns, header_of(
            path, mapping.dialect)) if read != own} if mapping.header and mapping.columns
            else {})
        if index == 0:
            unread = [c for c in file_columns(path, mapping.dialect, mapping.header,
                                              mapping.columns) if c not in columns]
            if unread:
                log.info("%s: columns the mapping does not read (no role: task, label, "
                         "sparse, multi_hot, dense or order_by): %s", path, ", ".join(unread))
        if index == 0 and mapping.task is None and mapping.order_by:
            log.warning("mapping key 'order_by' (%s) orders each task's rows, and the mapping "
                        "has no 'task': every row is its own task, so it orders nothing",
                        mapping.order_by)
        for batch, lines in text_batches(path, columns, dialect=mapping.dialect,
                                         header=mapping.header, names=mapping.columns,
                                         policy=policy, counts=counts, block_bytes=block_bytes,
                                         missing_hint=RENAME_HINT if mapping.header else ""):
            yield parser.parse(batch, lines, path, index, in_header)
    features = [*mapping.sparse, *mapping.multi_hot, *mapping.dense]
    empty = [c for c in features if c not in parser.holding_values]
    if empty and parser.rows:
        log.warning("%s: column%s %s empty in every row read: %s nothing (ids 0, dense 0.0); "
                    "a column named wrongly in the mapping, or one the export left empty?",
                    ", ".join(paths), "s" if len(empty) > 1 else "", ", ".join(empty),
                    "they tell" if len(empty) > 1 else "it tells")


def _side_tables(mapping: CsvMapping) -> list[SideTable]:
    sides = [SideTable(spec, mapping.dialect) for spec in mapping.join]
    seen: dict[str, str] = {}
    for side in sides:
        for column in side.columns:
            if column in seen:
                raise DataError(f"column {column!r} comes from two side files ({seen[column]} "
                                f"and {side.spec.path}); list the wanted ones under "
                                f"join[].columns", file=side.spec.path, column=column)
            seen[column] = side.spec.path
    return sides


def recorded_mapping(recorded: Any) -> Any:
    """A manifest's recorded mapping as ``source_record`` would write it today: keys added
    since (``encoding``, a side file's ``header``) at their defaults, so that a dataset
    converted before them still fits its unchanged config."""
    try:
        return json.loads(json.dumps(dataclasses.asdict(CsvMapping.from_dict(recorded))))
    except (DataError, TypeError, ValueError):
        return recorded


def source_record(paths: list[str], mapping: CsvMapping) -> dict:
    """What a CSV conversion records as its source: inputs (with sizes and modification
    times, so a pipeline notices an edited input) and the mapping."""
    files = [*paths, *(j.path for j in mapping.join)]
    return {"kind": "csv", "paths": [os.path.abspath(p) for p in paths],
            "mapping": json.loads(json.dumps(dataclasses.asdict(mapping))),  # as a manifest has it
            "inputs": {os.path.abspath(p): [os.path.getsize(p), int(os.path.getmtime(p))]
                       for p in files if os.path.exists(p)}}


def convert_csv(src: str | list[str], out_dir: str, mapping: CsvMapping | dict | str,
                split: SplitConfig | None = None, output: OutputConfig | None = None,
                block_bytes: int = 16 << 20) -> Manifest:
    """Converts CSV file(s) to a task-partitioned dataset, streaming.

    Args:
        src: A CSV path or a list of paths with the same columns.
        out_dir: Output dataset directory.
        mapping: A ``CsvMapping``, its dict form, or a YAML file path.
        split: Cold-start split parameters (default ``SplitConfig()``).
        output: File format, sizes, overwrite and bad-row policy (default ``OutputConfig()``).
        block_bytes: CSV bytes parsed per batch.

    Returns:
        The manifest of the written dataset.

    Raises:
        DataError: A missing file or column, a bad line (policy "error", naming the file,
            line, column and value), or no data row at all.

    Example::

        convert_csv("ratings.csv", "out/", {"task": "user", "label": "rating",
                    "label_threshold": 4, "sparse": ["user", "item"],
                    "join": [{"path": "items.csv", "key": "item"}]})
    """
    if isinstance(mapping, str):
        mapping = CsvMapping.from_yaml(mapping)
    elif isinstance(mapping, dict):
        mapping = CsvMapping.from_dict(mapping)
    paths = [src] if isinstance(src, str) else list(src)
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise DataError("input file not found", file=missing[0])
    folders = [p for p in paths if os.path.isdir(p)]
    if folders:
        raise DataError("input is a directory", file=folders[0],
                        expected="a CSV file (gmeta data csv takes several, each named: "
                                 "gmeta data csv a.csv b.csv OUT)")
    output = output or OutputConfig()
    sides = _side_tables(mapping)
    counts = CsvCounts()
    manifest = convert(_raw_batches(paths, mapping, sides, output.bad_rows, counts, block_bytes),
                       mapping.schema(), out_dir, split=split or SplitConfig(), output=output,
                       input_bytes=sum(os.path.getsize(p) for p in paths),
                       source=source_record(paths, mapping), input_counts=counts.as_dict)
    return manifest
