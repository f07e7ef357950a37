"""Tasks are shared out over ranks whole, once each, with balanced work."""

from __future__ import annotations

import numpy as np
import pytest

from gmeta_tf import data
from gmeta_tf.data.sharding import Block, shard_blocks


def task_ids(path, rank, size, **kwargs):
    ds = data.read_tasks(str(path), 8, split=None, rank=rank, size=size, **kwargs)
    return np.concatenate([b["task_id"].numpy() for b in ds])


def test_two_ranks_cover_every_task_once(dataset):
    rank0 = task_ids(dataset, 0, 2, equal_steps=False)
    rank1 = task_ids(dataset, 1, 2, equal_steps=False)
    everything = task_ids(dataset, 0, 1)
    assert len(np.intersect1d(rank0, rank1)) == 0
    assert sorted(np.concatenate([rank0, rank1])) == sorted(everything)
    assert len(set(rank0)) == len(rank0) and len(set(rank1)) == len(rank1)


def test_ranks_get_balanced_rows_and_equal_steps(parquet_dataset):
    shards = [data.TaskDataset(str(parquet_dataset), split="warm", rank=r, size=2) for r in (0, 1)]
    rows = [s.num_rows for s in shards]
    block = max(r for f in shards[0].manifest.files for r, _ in f.blocks)
    assert abs(rows[0] - rows[1]) <= block
    steps = [sum(1 for _ in data.read_tasks(str(parquet_dataset), 8, rank=r, size=2, shuffle_seed=0))
             for r in (0, 1)]
    assert steps[0] == steps[1] == shards[0].steps_per_epoch(8)


def test_block_partition_is_contiguous_balanced_and_never_empty():
    blocks = [Block("f", i * 10, i * 10 + n, 1) for i, n in enumerate([5, 50, 5, 5, 30, 5])]
    for size in (1, 2, 3, 6):
        parts = [shard_blocks(blocks, r, size) for r in range(size)]
        assert [b for p in parts for b in p] == blocks
        assert all(parts)
    with pytest.raises(data.DataError, match="7 ranks"):
        shard_blocks(blocks, 0, 7)
