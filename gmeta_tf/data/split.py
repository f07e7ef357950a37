"""The cold-start split (../DESIGN.md, "Cold-start evaluation protocol"), seeded and streaming.

Tasks are split into warm (``warm_fraction``) and cold, and a seeded ``valid_fraction`` of
the warm tasks is held out as the validation split ("valid": what training evaluates,
stops early and chooses checkpoints on; the cold split is only scored by ``gmeta eval``);
every kept task is split into a support set and a query set of ``query_size`` rows,
chosen at random or as the task's last rows by time; tasks with fewer than ``min_rows``
(or more than ``max_rows``, but for warm tasks kept by ``train_long_tasks``) rows are
dropped and counted; with ``train_long_tasks`` a long warm task drawn for validation is
trained on instead (``max_rows`` bounds only the scored splits) and counted. Every
decision is a pure function of ``(seed, task id, task size, row rank in the task)``
computed with a counter-based hash, so the split does not depend on how the input was
chunked or bucketed, and the same seed always reproduces it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from gmeta_tf import config_fields
from gmeta_tf.config_fields import FieldError
from gmeta_tf.data.schema import QUERY_COLUMN, TASK_COLUMN

ORDER_COLUMN = "__order"  # optional input column: rows of a task are ordered by it ("last")
QuerySelection = Literal["random", "last"]
QUERY_SELECTIONS = ("random", "last")


@dataclasses.dataclass
class SplitConfig:
    """Parameters of the warm/cold and support/query split.

    Args:
        seed: Seed of every random choice.
        warm_fraction: Fraction of tasks that are warm (trained on); the rest are cold.
        valid_fraction: Fraction of the warm tasks held out as the "valid" split (chosen by
            a seeded hash of the task id, independent of the warm/cold draw); 0: none.
        query_size: Query rows per task; the task's other rows are its support set (0:
            no query rows, for row data that plain CTR models read whole).
        min_rows: Tasks with fewer rows are dropped (MeLU: 13).
        max_rows: Tasks with more rows are dropped (MeLU: 100), but for the warm tasks
            trained on when ``train_long_tasks``; None keeps them all.
        query_selection: "random" rows, or the "last" rows by the order column (time).
        train_long_tasks: Keep the warm tasks that have more than ``max_rows`` rows
            for training (the default), those drawn for validation too: ``max_rows``
            then bounds only the scored tasks (valid, cold), and training draws a long
            task's rows anew each epoch up to the batch's support slots. False: every
            long task is dropped (MeLU's protocol to the letter).
    """

    seed: int = 0
    warm_fraction: float = config_fields.field(0.8, min=0.0, max=1.0)
    valid_fraction: float = config_fields.field(0.1, min=0.0, max=0.9)
    query_size: int = config_fields.field(10, min=0)
    min_rows: int = config_fields.field(13, min=1)
    max_rows: int | None = config_fields.field(None, min=2)
    query_selection: QuerySelection = "random"
    train_long_tasks: bool = True

    def __post_init__(self) -> None:
        config_fields.check(self)
        if self.min_rows < self.query_size + 1:
            raise FieldError("SplitConfig", "min_rows", self.min_rows,
                             f"at least query_size + 1 = {self.query_size + 1} (every task "
                             f"keeps a support row)")


#: The protocol of each source when a config leaves it out: MovieLens's (MeLU: 10 query
#: ratings of users with 13 or more) for ratings and CSV; fewer rows for Criteo's tasks
#: and for generated ones.
SOURCE_SPLITS = {
    "movielens": SplitConfig(),
    "csv": SplitConfig(),
    "criteo": SplitConfig(query_size=4, min_rows=8),
    "synthetic": SplitConfig(query_size=5, min_rows=8),
}


def source_split(source: str) -> SplitConfig:
    """The split a source's data gets when the config leaves it out (``SOURCE_SPLITS``;
    a dataset converted beforehand: MovieLens's)."""
    return SOURCE_SPLITS.get(source, SOURCE_SPLITS["movielens"])


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer: a fast, well-mixed uint64 -> uint64 bijection."""
    z = np.asarray(x).astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z += np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _seeded(values: np.ndarray, seed: int, stream: int) -> np.ndarray:
    key = mix64(np.array([seed * 8 + stream], dtype=np.uint64))[0]
    return mix64(values.astype(np.int64).view(np.uint64) ^ key)


def _uniform(task_ids: np.ndarray, seed: int, stream: int) -> np.ndarray:
    return (_seeded(task_ids, seed, stream) >> np.uint64(11)).astype(np.float64) / 2.0**53


def warm_mask(task_ids: np.ndarray, config: SplitConfig) -> np.ndarray:
    """True for tasks that are warm, a pure function of (seed, task id)."""
    return _uniform(task_ids, config.seed, 1) < config.warm_fraction


def split_of_tasks(task_ids: np.ndarray, config: SplitConfig) -> np.ndarray:
    """Per task: 0 warm (trained on), 1 valid (warm, held out for validation), 2 cold."""
    warm = warm_mask(task_ids, config)
    valid = warm & (_uniform(task_ids, config.seed, 3) < config.valid_fraction)
    return np.where(warm, np.where(valid, 1, 0), 2).astype(np.int8)


#: The splits a converted dataset holds, in the order of ``split_of_tasks``' codes.
SPLITS = ("warm", "valid", "cold")


def _group_starts(sorted_tasks: np.ndarray) -> np.ndarray:
    change = np.flatnonzero(sorted_tasks[1:] != sorted_tasks[:-1]) + 1
    return np.concatenate([[0], change]).astype(np.int64)


def split_tasks(table: pa.Table, config: SplitConfig) -> tuple[dict[str, pa.Table], dict[str, int]]:
    """Groups whole tasks, drops short/long ones, marks query rows, splits warm/valid/cold.

    Args:
        table: Rows of whole tasks in input order (every row of a task it contains is in
            it), with a ``task_id`` column and optionally ``__order``.
        config: The split parameters.

    Returns:
        ``(tables, counts)``: a table per split of ``SPLITS``, sorted by task, each task's
        support rows first then its query rows (each in input/time order), with an
        ``is_query`` int32 column and without ``__order``; counts of kept and dropped tasks.
    """
    counts = {"warm_tasks": 0, "valid_tasks": 0, "cold_tasks": 0, "dropped_short": 0,
              "dropped_long": 0, "long_tasks_moved_to_warm": 0}
    if table.num_rows == 0:
        return {s: table for s in SPLITS}, counts
    tasks = table.column(TASK_COLUMN).to_numpy()
    within = (table.column(ORDER_COLUMN).to_numpy() if ORDER_COLUMN in table.column_names
              else np.arange(len(tasks)))
    order = np.lexsort((np.arange(len(tasks)), within, tasks))
    tasks = tasks[order]
    starts = _group_starts(tasks)
    sizes = np.diff(np.append(starts, len(tasks)))
    task_split = split_of_tasks(tasks[starts], config)
    too_long = sizes > (config.max_rows if config.max_rows is not None else np.inf)
    if config.train_long_tasks:
        # A long task drawn for validation cannot be scored there (max_rows bounds the
        # scored tasks) but is still warm: it is trained on rather than lost.
        moved = too_long & (task_split == 1) & (sizes >= config.min_rows)
        counts["long_tasks_moved_to_warm"] = int(moved.sum())
        task_split[moved] = 0
        too_long &= task_split == 2
    keep_task = (sizes >= config.min_rows) & ~too_long
    counts["dropped_short"] = int((sizes < config.min_rows).sum())
    counts["dropped_long"] = int(too_long.sum())

    group = np.repeat(np.arange(len(starts)), sizes)
    rank = np.arange(len(tasks)) - starts[group]
    is_query = _query_rows(tasks, rank, group, starts, sizes, config)
    keep_row = keep_task[group]
    final = np.lexsort((rank, is_query, tasks))
    final = final[keep_row[final]]
    is_query = is_query[final].astype(np.int32)
    out = table.take(pa.array(order[final]))
    if ORDER_COLUMN in out.column_names:
        out = out.drop_columns([ORDER_COLUMN])
    out = out.append_column(QUERY_COLUMN, pa.array(is_query))
    row_split = task_split[group[final]]
    for code, name in enumerate(SPLITS):
        counts[f"{name}_tasks"] = int((task_split[keep_task] == code).sum())
    return {name: out.filter(pa.array(row_split == code)) for code, name in enumerate(SPLITS)}, counts


def _query_rows(tasks: np.ndarray, rank: np.ndarray, group: np.ndarray, starts: np.ndarray,
                sizes: np.ndarray, config: SplitConfig) -> np.ndarray:
    """Per row (grouped by task, in task order), True when it belongs to the query set."""
    q = config.query_size
    if config.query_selection == "last":
        return rank >= sizes[group] - q
    with np.errstate(over="ignore"):
        key = mix64(_seeded(tasks, config.seed, 2) + rank.astype(np.uint64))
    by_key = np.lexsort((key, group))
    key_rank = np.empty_like(rank)
    key_rank[by_key] = np.arange(len(rank)) - starts[group[by_key]]
    return key_rank < q


def split_record(config: SplitConfig, counts: dict[str, int]) -> dict[str, Any]:
    """What the manifest records about the split: parameters, seed and task counts."""
    return {**dataclasses.asdict(config), **counts}
