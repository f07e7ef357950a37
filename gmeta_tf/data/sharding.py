"""Sharding whole-task blocks across ranks: contiguous, balanced by rows, never splitting a task.

The blocks of a split (runs of whole tasks, from the manifest) are laid end to end in file
order and cut into ``size`` contiguous runs of about equal row counts. Each rank reads only
its run, mostly one stretch of one or two files. Every task is in exactly one block, hence
on exactly one rank.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import FileEntry


@dataclasses.dataclass(frozen=True)
class Block:
    """A run of whole tasks: rows ``[start, stop)`` of one file."""

    path: str
    start: int
    stop: int
    tasks: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def blocks_of(files: list[tuple[str, FileEntry]]) -> list[Block]:
    """All blocks of the given ``(full path, entry)`` files, in file order."""
    out = []
    for path, entry in files:
        start = 0
        for rows, tasks in entry.blocks:
            out.append(Block(path, start, start + rows, tasks))
            start += rows
    return out


def shard_blocks(blocks: list[Block], rank: int, size: int) -> list[Block]:
    """The contiguous, row-balanced run of blocks that belongs to ``rank`` of ``size``.

    Raises:
        DataError: There are fewer blocks than ranks (write smaller blocks) or rank is out of
            range.
    """
    if not 0 <= rank < size:
        raise DataError("rank out of range", value=rank, expected=f"0 <= rank < {size}")
    if len(blocks) < size:
        raise DataError(f"{len(blocks)} blocks cannot feed {size} ranks; convert with a smaller "
                        "rows_per_block", value=len(blocks), expected=f">= {size} blocks")
    prefix = np.concatenate([[0], np.cumsum([b.rows for b in blocks])])
    targets = prefix[-1] * np.arange(1, size) / size
    above = np.clip(np.searchsorted(prefix, targets), 1, len(blocks))
    nearer_below = (targets - prefix[above - 1]) < (prefix[above] - targets)
    cuts = np.where(nearer_below, above - 1, above)  # the block boundary nearest each target
    bounds = [0, *cuts.tolist(), len(blocks)]
    bounds = _spread(bounds, len(blocks))
    return blocks[bounds[rank]:bounds[rank + 1]]


def _spread(bounds: list[int], n: int) -> list[int]:
    """Makes cut points strictly increasing so that every rank gets at least one block."""
    for i in range(1, len(bounds) - 1):
        bounds[i] = max(bounds[i], bounds[i - 1] + 1)
    for i in range(len(bounds) - 2, 0, -1):
        bounds[i] = min(bounds[i], bounds[i + 1] - 1)
    return bounds


def tasks_per_rank(blocks: list[Block], size: int) -> list[int]:
    """Task count of every rank's shard (for equal step counts across ranks)."""
    return [sum(b.tasks for b in shard_blocks(blocks, r, size)) for r in range(size)]
