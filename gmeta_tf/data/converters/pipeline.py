"""The streaming conversion every converter shares: raw record batches -> dataset.

A converter only parses its raw format into record batches with the storage columns of its
schema (``task_id``, feature columns, labels, optionally ``__order``). This module checks the
labels, spills the rows into task buckets on disk, splits each bucket (warm/cold,
support/query) and writes the files and manifest atomically.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import shutil
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import Manifest
from gmeta_tf.data.partition import TaskPartitioner
from gmeta_tf.data.schema import LABEL_COLUMN, QUERY_COLUMN, TASK_COLUMN, Schema
from gmeta_tf.data.split import SPLITS, SplitConfig, split_record, split_tasks
from gmeta_tf.data.writer import DatasetWriter

log = logging.getLogger(__name__)
BAD_ROW_POLICIES = ("error", "skip")
#: Blocks per split a converter aims at by default: enough for 16 ranks.
DEFAULT_MIN_BLOCKS = 16
MAX_AUTO_ROWS_PER_BLOCK = 1 << 16


@dataclasses.dataclass
class OutputConfig:
    """How a converter writes its output (the same for every converter).

    Args:
        file_format: "parquet" or "orc".
        rows_per_file: Target rows per data file (files end on a block boundary, so a
            block is never longer than a file: blocks are cut at ``min(rows_per_block,
            rows_per_file)`` rows).
        rows_per_block: Target rows per block (a Parquet row group of whole tasks; blocks
            are what ranks share out). None chooses it from the row count so that each
            split has at least ``min_blocks`` blocks (when it has that many tasks), capped
            at ``MAX_AUTO_ROWS_PER_BLOCK``.
        bucket_bytes: Raw input bytes per on-disk task bucket; bounds converter memory.
        overwrite: Replace an existing output directory (the new dataset must have rows;
            the log compares it with the one it replaces).
        bad_rows: "error" stops at the first bad row (malformed line, value that is not a
            number, NaN/out-of-range label); "skip" drops such rows and counts them.
        min_blocks: With ``rows_per_block`` None: the blocks each split should have, at
            least the number of ranks that will read it.
    """

    file_format: str = "parquet"
    rows_per_file: int = 1 << 20
    rows_per_block: int | None = None
    bucket_bytes: int = 256 << 20
    overwrite: bool = False
    bad_rows: str = "error"
    min_blocks: int = DEFAULT_MIN_BLOCKS

    def __post_init__(self) -> None:
        if self.bad_rows not in BAD_ROW_POLICIES:
            raise DataError("unknown bad_rows policy", value=self.bad_rows,
                            expected=f"one of {BAD_ROW_POLICIES}")
        for name in ("rows_per_file", "rows_per_block", "bucket_bytes", "min_blocks"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise DataError(f"output option {name!r} is not allowed", value=value,
                                expected="an integer >= 1")

    def block_rows(self, rows: int, split: SplitConfig) -> int:
        """Rows per block for a dataset of ``rows`` rows (see ``rows_per_block``)."""
        if self.rows_per_block is not None:
            return min(self.rows_per_block, self.rows_per_file)
        wf, vf = split.warm_fraction, split.valid_fraction
        shares = (wf * (1.0 - vf), wf * vf, 1.0 - wf)  # warm, valid, cold
        smaller = min((f for f in shares if f > 0), default=1.0)
        # Half the even share: a split's size varies with the seed, and a block overshoots
        # its target to the end of its last task.
        auto = max(1, int(rows * smaller) // (2 * self.min_blocks))
        return min(auto, MAX_AUTO_ROWS_PER_BLOCK, self.rows_per_file)


@dataclasses.dataclass
class RawBatch:
    """A parsed batch plus where it came from, for error messages."""

    batch: pa.RecordBatch
    source: str
    first_row: int  # 0-based index of the batch's first data row in ``source``
    lines: np.ndarray | None = None  # the physical line of every row, when known
    # the file's own name of a stored column where it differs (a CSV's 'click' stored as
    # 'label'), and every row's task as the file writes it (before hashing), when known
    file_columns: dict[str, str] = dataclasses.field(default_factory=dict)
    task_text: pa.Array | None = None
    # what sets a stored label's valid range, where the user sets it (a CSV mapping's key),
    # named next to an out-of-range value
    range_set_by: dict[str, str] = dataclasses.field(default_factory=dict)

    def where(self, i: int) -> str:
        """Row ``i`` in words, for an error message."""
        if self.lines is not None:
            return f"line {int(self.lines[i])}"
        return f"row {self.first_row + i}"

    def column(self, name: str) -> str:
        """A stored column as the file names it."""
        return self.file_columns.get(name, name)

    def task(self, i: int):
        """Row ``i``'s task as the file writes it, else its stored id."""
        if self.task_text is not None:
            return repr(self.task_text[i].as_py())
        return self.batch.column(TASK_COLUMN)[i].as_py()


def record_batches(open_reader: Callable[[], Any], path: str,
                   what: str) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The batches of a pyarrow CSV reader, each with the index of its first row.

    ``open_reader`` opens the reader (pyarrow parses the first block while opening). A
    parse error, there or later, becomes a DataError naming the file and the row near
    which it failed.
    """
    first_row = 0
    try:
        reader = open_reader()
    except pa.ArrowInvalid as e:
        raise DataError(f"bad {what} near row {first_row}: {e}", file=path) from e
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except pa.ArrowInvalid as e:
            raise DataError(f"bad {what} near row {first_row}: {e}", file=path) from e
        yield batch, first_row
        first_row += batch.num_rows


def columns_to_batch(columns: dict[str, np.ndarray]) -> pa.RecordBatch:
    """A record batch from named 1-D numpy columns."""
    return pa.RecordBatch.from_arrays([pa.array(v) for v in columns.values()], list(columns))


def check_labels(raw: RawBatch, schema: Schema, policy: str) -> tuple[pa.RecordBatch, int]:
    """Rejects (or drops, for policy "skip") rows with a NaN or out-of-range label.

    Returns:
        The batch without bad rows, and how many rows were dropped.

    Raises:
        DataError: naming source file, row, column, task and value (policy "error").
    """
    bad = np.zeros(raw.batch.num_rows, bool)
    # The file's own label column (a rating) before the 0/1 label derived from it, so that
    # an error names the column and value the file holds.
    for label in sorted(schema.labels, key=lambda f: f.name == LABEL_COLUMN):
        values = raw.batch.column(label.name).to_numpy(zero_copy_only=False).astype(np.float64)
        lo, hi = label.value_range or (-np.inf, np.inf)
        problems = label_problems(values, lo, hi)
        this_bad = problems[0][0] | problems[1][0]
        if this_bad.any() and policy == "error":
            i = int(np.flatnonzero(this_bad)[0])
            missing = bool(problems[0][0][i])
            what = next(problem for mask, problem in problems if mask[i])
            raise DataError(f"{raw.where(i)}: {what}", file=raw.source,
                            column=raw.column(label.name), task=raw.task(i),
                            value=None if missing else float(values[i]),
                            expected=expected_label(lo, hi, raw.range_set_by.get(label.name)))
        bad |= this_bad
    if not bad.any():
        return raw.batch, 0
    return raw.batch.filter(pa.array(~bad)), int(bad.sum())


def label_problems(values: np.ndarray, lo: float, hi: float) -> list[tuple[np.ndarray, str]]:
    """The rows of label ``values`` that are missing (NaN) and those outside ``[lo, hi]``,
    each with the problem an error names."""
    with np.errstate(invalid="ignore"):
        out_of_range = (values < lo) | (values > hi)
    return [(np.isnan(values), "missing label: the cell is empty, NA or NaN"),
            (out_of_range, "label out of range")]


def expected_label(lo: float, hi: float, set_by: str | None) -> str:
    """What a label cell may hold, as an error says it (``set_by``: the key that set the
    range, if any)."""
    if not np.isfinite([lo, hi]).all():
        return "a number"
    return f"a number in [{lo:g}, {hi:g}]" + (f", the range {set_by} sets" if set_by else "")


def num_buckets(input_bytes: int, bucket_bytes: int) -> int:
    """Enough on-disk buckets that one bucket fits comfortably in memory."""
    return max(1, math.ceil(input_bytes / max(1, bucket_bytes)))


def convert(raw_batches: Iterable[RawBatch], schema: Schema, out_dir: str, *,
            split: SplitConfig, output: OutputConfig, input_bytes: int,
            source: dict, input_counts: Callable[[], dict] | None = None,
            repeats_are_events: str | None = None) -> Manifest:
    """Runs the shared conversion: check, bucket, split, write, commit.

    Args:
        raw_batches: Parsed batches with the schema's storage columns.
        schema: The output schema.
        out_dir: Output dataset directory.
        split: Cold-start split parameters.
        output: File format, sizes, overwrite and bad-row policy.
        input_bytes: Size of the raw input, to size the on-disk buckets.
        source: What was converted (recorded in the manifest).
        repeats_are_events: Why rows repeating another row of their task are events of
            their own in this source (a generator that shows a user an item again): the
            counts of ``RepeatedRows`` are then logged with this reason, not warned of, and
            the reason is recorded in the manifest (``repeats_are_events``) for
            ``gmeta eval``.
        input_counts: Called after the last batch: the converter's own counts (lines
            skipped, values repaired), recorded in the manifest and logged.

    Returns:
        The manifest of the committed dataset.

    Raises:
        DataError: The input has no data row, or no task is left after the split's
            ``min_rows``/``max_rows``; nothing is written then (an existing dataset at
            ``out_dir`` stays as it was).
    """
    counts: collections.Counter = collections.Counter()
    with DatasetWriter(out_dir, schema, output.file_format, output.rows_per_file,
                       output.rows_per_block or output.rows_per_file,
                       output.overwrite) as writer:
        spill = os.path.join(writer.tmp_dir, "_spill")
        with TaskPartitioner(spill, num_buckets(input_bytes, output.bucket_bytes)) as part:
            for batch, skipped in _checked(raw_batches, schema, output.bad_rows):
                counts["rows_skipped_bad_label"] += skipped
                part.add(batch)
            counts["rows_in"] = part.rows
            counts.update(input_counts() if input_counts else {})
            _refuse_empty(counts, source, out_dir)
            writer.rows_per_block = output.block_rows(part.rows, split)
            repeats, seen = RepeatedRows(), LabelsSeen(schema)
            for table in part.buckets():
                repeats.count(table)
                tables, bucket_counts = split_tasks(table, split)
                for name, rows in tables.items():
                    repeats.count_copied_answers(name, rows)
                    seen.add(rows)
                    writer.write(name, rows)
                counts.update(bucket_counts)
            counts.update(repeats.counts)
        shutil.rmtree(spill, ignore_errors=True)
        _log_skips(counts, split)
        repeats.log(repeats_are_events)
        if not sum(counts[f"{name}_tasks"] for name in SPLITS):
            rows_are_tasks = source.get("mapping", {"task": ""}).get("task") is None
            hint = ("; the mapping has no 'task', so every row is its own task of one row: "
                    "for a plain CTR log keep every row with min_rows 1 and query_size 0 "
                    "(gmeta data csv --min-rows 1 --query-size 0 --warm-fraction 1.0, or "
                    "data.split in a pipeline, as the README's click-log example does)"
                    if rows_are_tasks and split.min_rows > 1 else "")
            raise DataError(f"no task left to write: all {counts['dropped_short']} tasks have "
                            f"fewer than min_rows={split.min_rows} rows and "
                            f"{counts['dropped_long']} more than max_rows={split.max_rows}"
                            f"{hint}", file=_inputs(source))
        record = {**split_record(split, dict(counts)), "labels_seen": seen.ranges(),
                  **({"repeats_are_events": repeats_are_events} if repeats_are_events else {}),
                  "source": source,
                  "output": {"rows_per_block": writer.rows_per_block,
                             "rows_per_file": output.rows_per_file,
                             "rows_per_block_option": output.rows_per_block}}
        return writer.commit(record)


class LabelsSeen:
    """The smallest and largest value of every label over the rows written, recorded in
    the manifest (``labels_seen``): the range a served model checks the support labels of a
    request against where the conversion was given no ``label_range``."""

    def __init__(self, schema: Schema):
        self.names = [f.name for f in schema.labels]
        self.low = dict.fromkeys(self.names, np.inf)
        self.high = dict.fromkeys(self.names, -np.inf)

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        for name in self.names:
            values = table.column(name).to_numpy().astype(np.float64)
            self.low[name] = min(self.low[name], float(np.nanmin(values)))
            self.high[name] = max(self.high[name], float(np.nanmax(values)))

    def ranges(self) -> dict[str, list[float]]:
        return {n: [self.low[n], self.high[n]] for n in self.names if self.low[n] <= self.high[n]}


class RepeatedRows:
    """Rows the log holds twice, counted as the conversion writes them (they are kept).

    ``repeated_rows``: rows equal in every stored column (the task, every feature, the
    labels, the time where one orders the rows) to another row of the log, beyond the
    first of each such set: a log that wrote an impression twice, say. ``<split>
    _query_rows_in_support``: query rows of a split equal in every stored column to a
    support row of their task, whose answer an adapted model (and item mean + offset) is
    given before it is scored on them (``gmeta eval`` repeats the count of the split it
    scores; an eval file's rows are its warm split)."""

    EXAMPLES = 3

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.examples: dict[str, list] = collections.defaultdict(list)

    def count(self, table: pa.Table) -> None:
        """Counts the repeated rows of ``table`` (whole tasks: a row can only repeat a row of
        its own task)."""
        if table.num_rows < 2:
            return
        repeated = _repeats_earlier_row(_RowKeys(table))
        self.counts["repeated_rows"] += int(repeated.sum())
        self._remember("repeated_rows", table, repeated)

    def count_copied_answers(self, split: str, table: pa.Table) -> None:
        """Counts the query rows of ``table`` (one split, with ``is_query``) that are copies
        of a support row of their task."""
        is_query = table.column(QUERY_COLUMN).to_numpy().astype(bool)
        if not is_query.any() or is_query.all():
            return
        keys = _RowKeys(table.drop_columns([QUERY_COLUMN]))
        copied = np.zeros(len(is_query), bool)
        # rows whose hash a support row's matches, then their columns compared
        maybe = np.flatnonzero(is_query & np.isin(keys.hashes, keys.hashes[~is_query]))
        if maybe.size:
            copied[maybe] = np.isin(keys.exact(maybe), keys.exact(np.flatnonzero(~is_query)))
        key = f"{split}_query_rows_in_support"
        self.counts[key] += int(copied.sum())
        self._remember(key, table, copied)

    def _remember(self, key: str, table: pa.Table, rows: np.ndarray) -> None:
        room = self.EXAMPLES - len(self.examples[key])
        if room > 0 and rows.any():
            tasks = table.column(TASK_COLUMN).to_numpy()[np.flatnonzero(rows)]
            self.examples[key].extend(int(t) for t in dict.fromkeys(tasks.tolist()))
            del self.examples[key][self.EXAMPLES:]

    def log(self, repeats_are_events: str | None = None) -> None:
        """Warns of the counts, or, when the source says why its repeats are events of
        their own (``repeats_are_events``), logs them with that reason."""
        def examples(key: str) -> str:
            return ", ".join(map(str, self.examples[key]))

        repeated = self.counts["repeated_rows"]
        if repeated and repeats_are_events:
            log.info("%d rows repeat another row of their task in every stored column "
                     "(tasks %s...): %s", repeated, examples("repeated_rows"),
                     repeats_are_events)
        elif repeated:
            log.warning("%d rows repeat another row of their task in every stored column "
                        "(tasks %s...: a log that wrote a row twice?); they are kept, as "
                        "written: remove the copies from the input if they are not events "
                        "of their own", repeated, examples("repeated_rows"))
        for split in SPLITS:
            key = f"{split}_query_rows_in_support"
            copied = self.counts[key]
            if copied and repeats_are_events:
                log.info("%d query rows of the %s split repeat a support row of their task "
                         "(tasks %s...): %s", copied, split, examples(key), repeats_are_events)
            elif copied:
                log.warning("%d query rows of the %s split are copies of a support row of "
                            "their task (tasks %s...): a model adapted on the support rows "
                            "is given their labels before it is scored or trained on them",
                            copied, split, examples(key))


class _RowKeys:
    """Every row of a table as numbers that two rows share if and only if they are equal
    in every column: ``columns`` (rows x parts, uint64: a number by its bits, a list by its
    length and a 64-bit hash of its values in order), ``hashes`` (one uint64 a row mixing
    them, for a fast first pass) and ``exact(rows)`` (each row's parts as one value that
    ``np.unique`` and ``np.isin`` compare, to confirm what the hashes found)."""

    def __init__(self, table: pa.Table):
        parts = []
        for column in table.columns:
            column = column.combine_chunks()
            if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
                offsets = column.offsets.to_numpy()
                lengths = np.diff(offsets)
                position = (np.arange(offsets[-1] - offsets[0], dtype=np.uint64)
                            - (offsets[:-1] - offsets[0]).astype(np.uint64).repeat(lengths))
                values = _bits(column.flatten().to_numpy(zero_copy_only=False))
                total = np.concatenate([[np.uint64(0)], np.cumsum(
                    _mix(values ^ _mix(position)), dtype=np.uint64)])
                starts = offsets[:-1] - offsets[0]
                parts += [lengths.astype(np.uint64), total[starts + lengths] - total[starts]]
            else:
                parts.append(_bits(column.to_numpy(zero_copy_only=False)))
        self.columns = np.ascontiguousarray(np.stack(parts, axis=1))
        hashes = np.zeros(len(self.columns), np.uint64)
        for j in range(self.columns.shape[1]):
            hashes = _mix(hashes ^ _mix(self.columns[:, j] + np.uint64(j)))
        self.hashes = hashes

    def exact(self, rows: np.ndarray) -> np.ndarray:
        picked = np.ascontiguousarray(self.columns[rows])
        return picked.view(np.dtype((np.void, picked.dtype.itemsize * picked.shape[1]))).ravel()


def _repeats_earlier_row(keys: _RowKeys) -> np.ndarray:
    """Which rows equal an earlier row in every column."""
    repeated = np.zeros(len(keys.hashes), bool)
    unique, counts = np.unique(keys.hashes, return_counts=True)
    maybe = np.flatnonzero(np.isin(keys.hashes, unique[counts > 1]))
    if maybe.size:
        first = np.unique(keys.exact(maybe), return_index=True)[1]
        repeated[maybe] = True
        repeated[maybe[first]] = False
    return repeated


def _bits(values: np.ndarray) -> np.ndarray:
    """Numbers as uint64 bit patterns (a float as its float64 bits, so -0.0 and 0.0
    differ as they are stored)."""
    if values.dtype.kind == "f":
        return values.astype(np.float64).view(np.uint64)
    if values.dtype.kind in "iub":
        return values.astype(np.int64).view(np.uint64)
    return np.array([hash(v) for v in values.tolist()], np.int64).view(np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads every input bit over the output."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _inputs(source: dict) -> str:
    paths = source.get("paths") or [source.get("path", "?")]
    return ", ".join(map(str, paths))


def _refuse_empty(counts: collections.Counter, source: dict, out_dir: str) -> None:
    if counts["rows_in"]:
        return
    skipped = {k: v for k, v in counts.items() if k != "rows_in" and v}
    why = f" (all dropped: {skipped})" if skipped else " (a header only, or blank lines)"
    raise DataError(f"no data rows in the input{why}; nothing written, {out_dir} is left as "
                    f"it was", file=_inputs(source))


def _checked(raw_batches: Iterable[RawBatch], schema: Schema,
             policy: str) -> Iterator[tuple[pa.RecordBatch, int]]:
    for raw in raw_batches:
        yield check_labels(raw, schema, policy)


def _log_skips(counts: collections.Counter, split: SplitConfig) -> None:
    for what in ("lines_skipped_malformed", "rows_skipped_bad_value", "blank_lines",
                 "truncated_multi_hot_rows", "missing_dense_values", "rows_without_join_match"):
        if counts[what]:
            log.warning("%s: %d", what.replace("_", " "), counts[what])
    if counts["rows_skipped_bad_label"]:
        log.warning("skipped %d rows with a NaN or out-of-range label",
                    counts["rows_skipped_bad_label"])
    if counts["dropped_short"]:
        log.warning("dropped %d tasks with fewer than %d rows (min_rows)",
                    counts["dropped_short"], split.min_rows)
    if counts["dropped_long"]:
        if split.train_long_tasks:
            log.warning("dropped %d tasks drawn for the cold split with more than %s rows "
                        "(max_rows bounds the scored tasks; long warm tasks are trained on)",
                        counts["dropped_long"], split.max_rows)
        else:
            log.warning("dropped %d tasks with more than %s rows (max_rows)",
                        counts["dropped_long"], split.max_rows)
    if counts["long_tasks_moved_to_warm"]:
        log.info("moved %d tasks drawn for the validation split with more than %s rows to "
                 "the warm split, to be trained on (max_rows bounds the scored tasks)",
                 counts["long_tasks_moved_to_warm"], split.max_rows)
