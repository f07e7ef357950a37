"""Turns blocks of rows (whole tasks) into padded task batches or row batches, in numpy.

Every task of a block becomes one entry of a window: its support rows padded (or cut) to
``support`` slots and its query rows to ``query`` slots, with a 0/1 mask. The window's
tasks are shuffled (when a generator is given) and handed out ``tasks_per_batch`` at a
time. Bad input is caught here, where file and task are known.
"""

from __future__ import annotations

import collections
import logging
from typing import Iterator

import numpy as np

from gmeta_tf.data.errors import DataError
from gmeta_tf.data.readers.base import Chunk
from gmeta_tf.data.schema import PAD_ID, QUERY_COLUMN, TASK_COLUMN, Feature, FeatureKind

log = logging.getLogger(__name__)
ROLES = ("support", "query")
BAD_TASK_POLICIES = ("error", "skip")
Batch = dict[str, object]


def feature_array(cols: Chunk, feature: Feature) -> np.ndarray:
    """A feature's values from its storage columns: [rows] or [rows, dim]."""
    if feature.is_slotted:
        return np.stack([cols[c] for c in feature.columns], axis=1).astype(feature.numpy_dtype)
    return cols[feature.name].astype(feature.numpy_dtype, copy=False)


def task_runs(tasks: np.ndarray, path: str) -> tuple[np.ndarray, np.ndarray]:
    """Start and length of every run of equal task ids; a task must be one run.

    Raises:
        DataError: A task's rows are not contiguous in the file.
    """
    starts = np.concatenate([[0], np.flatnonzero(tasks[1:] != tasks[:-1]) + 1]).astype(np.int64)
    ids = tasks[starts]
    if len(np.unique(ids)) != len(ids):
        uniq, counts = np.unique(ids, return_counts=True)
        raise DataError("rows of the task are not contiguous (not a task-partitioned file)",
                        file=path, column=TASK_COLUMN, task=int(uniq[counts > 1][0]))
    return starts, np.diff(np.append(starts, len(tasks)))


def bad_label_rows(cols: Chunk, labels: list[Feature]) -> dict[str, np.ndarray]:
    """Per label feature, a mask of rows whose label is NaN or outside its range."""
    out = {}
    for f in labels:
        v = cols[f.name].astype(np.float64)
        lo, hi = f.value_range or (-np.inf, np.inf)
        out[f.name] = np.isnan(v) | (v < lo) | (v > hi)
    return out


class _Window:
    """The rows (or tasks) added and not yet batched, and the batching both batchers share:
    the window joined, shuffled (when a generator is given) and cut into ``batch_len``
    entries at a time; a partial rest waits for the next block unless ``final``."""

    batch_len: int

    def __init__(self) -> None:
        self._window: list[dict[str, np.ndarray]] = []

    def clear(self) -> None:
        """Drops the entries waiting in the window."""
        self._window = []

    def batches(self, rng: np.random.Generator | None, final: bool) -> Iterator[Batch]:
        """Emits full batches from the window (and, if ``final``, the last partial one)."""
        if not self._window:
            return
        window = _concat(self._window)
        n = len(window[TASK_COLUMN])
        if rng is not None:
            order = rng.permutation(n)
            window = {k: v[order] for k, v in window.items()}
        b = self.batch_len
        full = n - n % b
        for lo in range(0, full, b):
            yield self._emit({k: v[lo:lo + b] for k, v in window.items()})
        rest = {k: v[full:] for k, v in window.items()}
        self._window = [rest] if n > full and not final else []
        if final and n > full:
            yield self._emit(rest)

    def _emit(self, flat: dict[str, np.ndarray]) -> Batch:
        return flat


class TaskBatcher(_Window):
    """Accumulates tasks from blocks and emits batches of whole tasks.

    Args:
        features: The features to emit (labels included).
        tasks_per_batch: T, tasks per batch.
        support: Support slots per task; None pads to the longest support set in the batch.
        query: Query slots per task; None pads to the longest query set in the batch.
        min_support: Tasks with fewer support rows are bad.
        min_query: Tasks with fewer query rows are bad.
        on_bad_task: "error" raises on a bad task (short, or NaN/out-of-range label);
            "skip" drops it and counts it in ``skipped`` (logged by the dataset).
        resplit: In a shuffled epoch (``add_block`` given a generator), draw each task's
            support and query rows anew: as many query rows as the file marks, chosen at
            random among all of the task's rows. A training task's query answers then
            change from epoch to epoch, so the outer loop cannot memorise them from the
            support rows (meta-overfitting); without a generator the file's split is kept.
    """

    def __init__(self, features: list[Feature], tasks_per_batch: int, support: int | None,
                 query: int | None, min_support: int = 1, min_query: int = 1,
                 on_bad_task: str = "error", resplit: bool = False) -> None:
        if on_bad_task not in BAD_TASK_POLICIES:
            raise DataError("unknown on_bad_task policy", value=on_bad_task,
                            expected=f"one of {BAD_TASK_POLICIES}")
        self.features, self.tasks_per_batch = features, tasks_per_batch
        self.caps = {"support": support, "query": query}
        self.minimum = {"support": min_support, "query": min_query}
        self.on_bad_task = on_bad_task
        self.resplit = resplit
        self.skipped: collections.Counter = collections.Counter()
        super().__init__()

    @property
    def batch_len(self) -> int:
        return self.tasks_per_batch

    @property
    def pending_tasks(self) -> int:
        return sum(len(w[TASK_COLUMN]) for w in self._window)

    def add_block(self, cols: Chunk, path: str, rng: np.random.Generator | None = None) -> None:
        """Validates a block of whole tasks and adds its tasks to the window.

        A task with more rows of a role than its slots keeps the first ones in file order,
        or, given ``rng`` (a shuffled epoch), a random subset drawn anew each epoch, so
        over the epochs training sees all of a large task's rows. With ``resplit`` and
        ``rng`` the support/query split itself is drawn anew (see the class docstring).
        """
        tasks = cols[TASK_COLUMN].astype(np.int64)
        if len(tasks) == 0:
            return
        starts, sizes = task_runs(tasks, path)
        group = np.repeat(np.arange(len(starts)), sizes)
        is_query = cols[QUERY_COLUMN].astype(bool)
        if self.resplit and rng is not None:
            is_query = redrawn_query_rows(group, is_query, rng)
        keep = self._valid_tasks(cols, tasks, starts, sizes, group, is_query, path)
        if not keep.any():
            return
        slot = np.cumsum(keep) - 1  # position of each kept task in this block's output
        entry: dict[str, np.ndarray] = {TASK_COLUMN: tasks[starts][keep]}
        role_rank = _rank_within(group * 2 + is_query,
                                 rng.random(len(tasks)) if rng is not None else None)
        values = {f.name: feature_array(cols, f) for f in self.features}
        for role, flag in zip(ROLES, (False, True)):
            rows = np.flatnonzero((is_query == flag) & keep[group])
            counts = np.bincount(slot[group[rows]], minlength=int(keep.sum()))
            cap = self.caps[role] if self.caps[role] is not None else int(counts.max())
            self.skipped[f"{role}_rows_cut_beyond_slots"] += int(np.maximum(counts - cap, 0).sum())
            rows = rows[role_rank[rows] < cap]
            at = (slot[group[rows]], role_rank[rows])
            mask = np.zeros((len(entry[TASK_COLUMN]), cap), np.float32)
            mask[at] = 1.0
            entry[f"{role}/mask"] = mask
            for f in self.features:
                pad = PAD_ID if f.numpy_dtype == np.int64 else 0
                v = values[f.name]
                out = np.full((len(mask), cap, *v.shape[1:]), pad, v.dtype)
                out[at] = v[rows]
                entry[f"{role}/{f.name}"] = out
        self._window.append(entry)

    def _valid_tasks(self, cols: Chunk, tasks: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                     group: np.ndarray, is_query: np.ndarray, path: str) -> np.ndarray:
        keep = np.ones(len(starts), bool)
        labels = [f for f in self.features if f.kind == FeatureKind.LABEL]
        for name, bad in bad_label_rows(cols, labels).items():
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                lo, hi = next(f for f in labels if f.name == name).value_range or ("-inf", "inf")
                self._bad(DataError("NaN or out-of-range label", file=path, column=name,
                                    task=int(tasks[i]), value=float(cols[name][i]),
                                    expected=f"a number in [{lo}, {hi}]"), "bad_label_tasks")
                keep &= np.bincount(group[bad], minlength=len(starts)) == 0
        n_query = np.bincount(group, weights=is_query, minlength=len(starts)).astype(np.int64)
        n_support = sizes - n_query
        short = (n_support < self.minimum["support"]) | (n_query < self.minimum["query"])
        if short.any():
            i = int(np.flatnonzero(short)[0])
            self._bad(DataError(
                "task has too few rows for its support and query sets", file=path,
                task=int(tasks[starts[i]]), value={"support": int(n_support[i]), "query": int(n_query[i])},
                expected=f">= {self.minimum['support']} support and >= {self.minimum['query']} query rows"),
                "short_tasks", count=int(short.sum()))
            keep &= ~short
        return keep

    def _bad(self, error: DataError, what: str, count: int = 1) -> None:
        if self.on_bad_task == "error":
            raise error
        self.skipped[f"skipped_{what}"] += count
        log.debug("skipping: %s", error)

    def _emit(self, flat: dict[str, np.ndarray]) -> Batch:
        out: Batch = {TASK_COLUMN: flat[TASK_COLUMN]}
        for role in ROLES:
            mask = flat[f"{role}/mask"]
            width = self.caps[role] or max(1, int(mask.any(axis=0).nonzero()[0].max(initial=0)) + 1)
            out[role] = {k.split("/", 1)[1]: v[:, :width] for k, v in flat.items()
                         if k.startswith(role + "/")}
        return out


def redrawn_query_rows(group: np.ndarray, is_query: np.ndarray,
                       rng: np.random.Generator) -> np.ndarray:
    """A new query flag per row: in every task (``group``, contiguous), as many query rows
    as ``is_query`` marks, drawn uniformly among all of the task's rows."""
    n_query = np.bincount(group, weights=is_query).astype(np.int64)
    return _rank_within(group, rng.random(len(group))) < n_query[group]


def _rank_within(key: np.ndarray, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """0, 1, 2... within each run of equal keys, in the order of ``tiebreak`` within a run
    (default: the rows' order)."""
    order = (np.argsort(key, kind="stable") if tiebreak is None
             else np.lexsort((tiebreak, key)))
    sorted_key = key[order]
    starts = np.concatenate([[0], np.flatnonzero(sorted_key[1:] != sorted_key[:-1]) + 1])
    run = np.repeat(starts, np.diff(np.append(starts, len(key))))
    rank = np.empty(len(key), np.int64)
    rank[order] = np.arange(len(key)) - run
    return rank


def _concat(entries: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenates window entries along their first axis (tasks or rows), padding ragged
    slot axes."""
    out = {}
    for k in entries[0]:
        parts = [e[k] for e in entries]
        if parts[0].ndim >= 2:
            width = max(p.shape[1] for p in parts)
            pad = 0 if k.endswith("/mask") or parts[0].dtype != np.int64 else PAD_ID
            parts = [np.concatenate([p, np.full((len(p), width - p.shape[1], *p.shape[2:]), pad,
                                                p.dtype)], axis=1) if p.shape[1] < width else p
                     for p in parts]
        out[k] = np.concatenate(parts)
    return out


class RowBatcher(_Window):
    """Accumulates rows from blocks and emits plain row batches (non-meta CTR training).

    Rows with a NaN/out-of-range label raise (``on_bad_row="error"``) or are dropped and
    counted in ``skipped`` ("skip").
    """

    def __init__(self, features: list[Feature], batch_size: int, on_bad_row: str = "error") -> None:
        if on_bad_row not in BAD_TASK_POLICIES:
            raise DataError("unknown on_bad_row policy", value=on_bad_row,
                            expected=f"one of {BAD_TASK_POLICIES}")
        self.features, self.batch_size, self.on_bad_row = features, batch_size, on_bad_row
        self.skipped: collections.Counter = collections.Counter()
        super().__init__()

    @property
    def batch_len(self) -> int:
        return self.batch_size

    def add_block(self, cols: Chunk, path: str, rng: np.random.Generator | None = None) -> None:
        """Validates a block's rows and adds them to the window (``rng`` is not needed
        here: rows are shuffled when batched)."""
        keep = np.ones(len(cols[TASK_COLUMN]), bool)
        labels = [f for f in self.features if f.kind == FeatureKind.LABEL]
        for name, bad in bad_label_rows(cols, labels).items():
            if bad.any() and self.on_bad_row == "error":
                i = int(np.flatnonzero(bad)[0])
                raise DataError(f"row {i} of the block: NaN or out-of-range label", file=path,
                                column=name, task=int(cols[TASK_COLUMN][i]), value=float(cols[name][i]))
            self.skipped["skipped_bad_label_rows"] += int((bad & keep).sum())
            keep &= ~bad
        entry = {TASK_COLUMN: cols[TASK_COLUMN].astype(np.int64)[keep],
                 QUERY_COLUMN: cols[QUERY_COLUMN].astype(np.int32)[keep]}
        entry.update({f.name: feature_array(cols, f)[keep] for f in self.features})
        self._window.append(entry)
