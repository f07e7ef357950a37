"""``TaskDataset``: a split of a task-partitioned dataset as tf.data, sharded over ranks.

See the package docstring (``gmeta_tf.data``) for the batch layout.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
from typing import Iterator

import numpy as np
import tensorflow as tf

from gmeta_tf.data import filesystem as fs
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.file_check import check_data_file
from gmeta_tf.data.manifest import Manifest
from gmeta_tf.data.readers.base import ColumnReader, make_reader
from gmeta_tf.data.schema import QUERY_COLUMN, TASK_COLUMN, Feature
from gmeta_tf.data.sharding import Block, blocks_of, shard_blocks, tasks_per_rank
from gmeta_tf.data.task_batcher import ROLES, RowBatcher, TaskBatcher

log = logging.getLogger(__name__)
VERIFY_MODES = ("checksum", "size")


def _topology(rank: int | None, size: int | None) -> tuple[int, int]:
    if rank is not None and size is not None:
        return rank, size
    from gmeta_tf import distributed

    return (distributed.rank() if rank is None else rank,
            distributed.size() if size is None else size)


class TaskDataset:
    """One split of a dataset, as seen by one rank.

    Args:
        path: Dataset directory (local or a tf.io.gfile URI such as s3://...).
        split: "warm", "cold", or None for every file.
        rank: This rank; None asks ``gmeta_tf.distributed`` (0 without horovodrun).
        size: Number of ranks; None asks ``gmeta_tf.distributed``.
        reader: "auto" (= "arrow"), "arrow", "tfio_iotensor" or "tfio_dataset".
        features: Feature names to read (default all, labels included).
        verify: "checksum" (size and SHA-256 of this rank's files) or "size" only.
        num_parallel_reads: Blocks read concurrently ahead of the batcher.

    Example::

        ds = TaskDataset("data/ml", split="warm", rank=0, size=2)
        for batch in ds.tasks(tasks_per_batch=32, support=20, query=10, shuffle_seed=0):
            batch["support"]["item_id"].shape   # [32, 20]
    """

    def __init__(self, path: str, split: str | None = "warm", rank: int | None = None,
                 size: int | None = None, reader: str = "auto", features: list[str] | None = None,
                 verify: str = "checksum", num_parallel_reads: int = 2) -> None:
        if verify not in VERIFY_MODES:
            raise DataError("unknown verify mode", value=verify, expected=f"one of {VERIFY_MODES}")
        self.path, self.split = path, split
        self.rank, self.size = _topology(rank, size)
        self.manifest = Manifest.load(path)
        self.features = self._select(features)
        self.reader: ColumnReader = make_reader(reader, self.manifest.file_format)
        self.num_parallel_reads = max(1, num_parallel_reads)
        self._last_skips: dict[str, int] = {}  # the counts logged last (see _log_skips)
        entries = self.manifest.files_of(split)
        if not entries:
            raise DataError(f"split {split!r} has no files", file=path)
        all_blocks = blocks_of([(fs.join(path, e.path), e) for e in entries])
        self.blocks: list[Block] = shard_blocks(all_blocks, self.rank, self.size)
        self._tasks_per_rank = tasks_per_rank(all_blocks, self.size)
        mine = {b.path for b in self.blocks}
        for e in entries:
            if fs.join(path, e.path) in mine:
                check_data_file(path, e, self.manifest, checksum=verify == "checksum")

    def _select(self, names: list[str] | None) -> list[Feature]:
        schema = self.manifest.schema
        if names is None:
            return list(schema.features)
        missing = [n for n in names if n not in {f.name for f in schema.features}]
        if missing:
            raise DataError("feature not in the dataset schema", file=fs.join(self.path, "manifest.json"),
                            column=missing[0], expected=f"one of {[f.name for f in schema.features]}")
        return [schema[n] for n in names]

    @property
    def columns(self) -> list[str]:
        """File columns this dataset reads."""
        return [TASK_COLUMN, QUERY_COLUMN, *[c for f in self.features for c in f.columns]]

    @property
    def num_tasks(self) -> int:
        """Tasks in this rank's shard."""
        return sum(b.tasks for b in self.blocks)

    @property
    def num_rows(self) -> int:
        """Rows in this rank's shard."""
        return sum(b.rows for b in self.blocks)

    @property
    def fewest_tasks_per_rank(self) -> int:
        """Tasks of the rank whose shard has the fewest (what every rank can batch)."""
        return min(self._tasks_per_rank)

    def steps_per_epoch(self, tasks_per_batch: int) -> int:
        """Full task batches every rank can produce: the same count on all ranks."""
        return self.fewest_tasks_per_rank // tasks_per_batch

    # -- reading -------------------------------------------------------------------------

    def _block_order(self, epoch: int, shuffle_seed: int | None) -> list[Block]:
        if shuffle_seed is None:
            return list(self.blocks)
        rng = np.random.default_rng([shuffle_seed, epoch, self.rank])
        return [self.blocks[i] for i in rng.permutation(len(self.blocks))]

    def _read_block(self, block: Block) -> dict[str, np.ndarray]:
        chunks = list(self.reader.read(block.path, block.start, block.stop, self.columns))
        if not chunks:
            raise DataError(f"rows {block.start}..{block.stop} missing", file=block.path)
        cols = {c: np.concatenate([ch[c] for ch in chunks]) for c in self.columns}
        if len(cols[TASK_COLUMN]) != block.rows:
            raise DataError(f"block at row {block.start} has the wrong row count", file=block.path,
                            value=len(cols[TASK_COLUMN]), expected=f"{block.rows} rows (manifest)")
        return cols

    def _loaded_blocks(self, blocks: list[Block]) -> Iterator[tuple[Block, dict[str, np.ndarray]]]:
        """Blocks in order, read ``num_parallel_reads`` ahead on threads (pyarrow drops the GIL)."""
        with concurrent.futures.ThreadPoolExecutor(self.num_parallel_reads) as pool:
            pending: collections.deque = collections.deque()
            for block in blocks:
                pending.append((block, pool.submit(self._read_block, block)))
                if len(pending) > self.num_parallel_reads:
                    b, fut = pending.popleft()
                    yield b, fut.result()
            while pending:
                b, fut = pending.popleft()
                yield b, fut.result()

    def _epochs(self, epochs: int | None) -> Iterator[int]:
        e = 0
        while epochs is None or e < epochs:
            yield e
            e += 1

    def _run(self, batcher: TaskBatcher | RowBatcher, epochs: int | None, shuffle_seed: int | None,
             window_blocks: int, limit: int | None, split_seed: int | None = None
             ) -> Iterator[dict]:
        for epoch in self._epochs(epochs):
            rng = (np.random.default_rng([shuffle_seed, epoch, self.rank, 1])
                   if shuffle_seed is not None else None)
            split_rng = (np.random.default_rng([split_seed, epoch, self.rank, 2])
                         if split_seed is not None else rng)
            emitted, in_window = 0, 0
            blocks = self._block_order(epoch, shuffle_seed)
            for i, (block, cols) in enumerate(self._loaded_blocks(blocks)):
                batcher.add_block(cols, block.path, split_rng)
                in_window += 1
                last = i == len(blocks) - 1
                if in_window >= window_blocks or last:
                    in_window = 0
                    for batch in batcher.batches(rng, final=last and limit is None):
                        if limit is not None and emitted >= limit:
                            break
                        emitted += 1
                        yield batch
            batcher.clear()  # leftovers exist only with a step limit: not carried over
            self._log_skips(batcher, epoch)
            if limit is not None and emitted < limit:
                raise DataError(f"rank {self.rank} produced {emitted} batches, fewer than the "
                                f"{limit} every rank must take (tasks were skipped?)", file=self.path)

    def _log_skips(self, batcher: TaskBatcher | RowBatcher, epoch: int) -> None:
        """Logs an epoch's skipped tasks and rows and the rows cut to the batch's slots,
        only when they differ from the last epoch logged: a long task's rows beyond its
        slots are cut alike every epoch, and the same line each epoch hid the rest."""
        counts = {what: n for what, n in batcher.skipped.items() if n}
        batcher.skipped.clear()
        if counts == self._last_skips:
            return
        self._last_skips = counts
        for what, n in sorted(counts.items()):
            level = logging.WARNING if what.startswith("skipped") else logging.INFO
            log.log(level, "%s rank %d epoch %d: %s: %d (logged again when it changes)",
                    self.path, self.rank, epoch, what.replace("_", " "), n)

    # -- public tf.data views ------------------------------------------------------------

    def tasks(self, tasks_per_batch: int, support: int | None = None, query: int | None = None, *,
              shuffle_seed: int | None = None, epochs: int | None = 1, min_support: int = 1,
              min_query: int = 1, on_bad_task: str = "error", ragged: bool = False,
              equal_steps: bool | None = None, window_blocks: int = 4,
              prefetch: int = 2, resplit: bool = False,
              resplit_seed: int | None = None) -> tf.data.Dataset:
        """Batches of ``tasks_per_batch`` whole tasks split into support and query.

        Args:
            tasks_per_batch: T.
            support: Support slots S (padded with a mask; of a task with more rows, the
                first S are kept, or with ``shuffle_seed`` S drawn anew each epoch); None
                pads to the batch's longest support set.
            query: Query slots Q; None pads to the batch's longest query set.
            shuffle_seed: Shuffle blocks and tasks per epoch with this seed; None keeps file order.
            epochs: Passes over the data; None repeats forever.
            min_support: Tasks with fewer support rows are bad (see ``on_bad_task``).
            min_query: Tasks with fewer query rows are bad.
            on_bad_task: "error" or "skip" (skips counted in the log).
            ragged: Yield ``tf.RaggedTensor`` [T, None, ...] per feature instead of padded
                tensors and masks.
            equal_steps: Take exactly ``steps_per_epoch`` batches per epoch, the same on all
                ranks (Horovod needs it); default True when size > 1.
            window_blocks: Blocks whose tasks are shuffled together.
            prefetch: Batches prepared ahead.
            resplit: With ``shuffle_seed``, draw every task's support and query rows anew
                each epoch (as many query rows as the file's split has; training tasks),
                instead of the file's fixed split (evaluation tasks keep it).
            resplit_seed: Draw every task's support and query rows with this seed (as
                ``resplit`` does, the same number of query rows) while tasks and blocks
                keep file order: evaluation tasks scored under another split of their rows.

        Returns:
            A ``tf.data.Dataset`` of batch dicts (layout in the package docstring).
        """
        equal_steps = self.size > 1 if equal_steps is None else equal_steps
        limit = self.steps_per_epoch(tasks_per_batch) if equal_steps else None
        make = lambda: TaskBatcher(self.features, tasks_per_batch, support, query,  # noqa: E731
                                   min_support, min_query, on_bad_task,
                                   resplit or resplit_seed is not None)
        signature = self._task_signature(support, query)
        ds = _batches_dataset(lambda: self._run(make(), epochs, shuffle_seed, window_blocks, limit,
                                                resplit_seed),
                              signature)
        if ragged:
            ds = ds.map(_to_ragged, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.prefetch(prefetch)

    def rows(self, batch_size: int, *, shuffle_seed: int | None = None, epochs: int | None = 1,
             on_bad_row: str = "error", window_blocks: int = 4, prefetch: int = 2) -> tf.data.Dataset:
        """Plain row batches: {feature: [B] or [B, dim], "task_id": [B], "is_query": [B]}."""
        signature = {TASK_COLUMN: tf.TensorSpec([None], tf.int64),
                     QUERY_COLUMN: tf.TensorSpec([None], tf.int32)}
        signature.update({f.name: _spec(f, []) for f in self.features})
        ds = _batches_dataset(
            lambda: self._run(RowBatcher(self.features, batch_size, on_bad_row), epochs,
                              shuffle_seed, window_blocks, None),
            signature)
        return ds.prefetch(prefetch)

    def _task_signature(self, support: int | None, query: int | None) -> dict:
        signature: dict = {TASK_COLUMN: tf.TensorSpec([None], tf.int64)}
        for role, cap in zip(ROLES, (support, query)):
            signature[role] = {f.name: _spec(f, [None, cap]) for f in self.features}
            signature[role]["mask"] = tf.TensorSpec([None, cap], tf.float32)
        return signature


def _stacked(batches: Iterator[dict], max_stack: int) -> Iterator[dict]:
    """Stacks up to ``max_stack`` consecutive batches of identical shapes on a new axis 0."""
    group: list[dict] = []

    def shapes(batch: dict) -> list:
        return [a.shape for a in tf.nest.flatten(batch)]

    for batch in batches:
        if group and (len(group) == max_stack or shapes(batch) != shapes(group[0])):
            yield tf.nest.map_structure(lambda *a: np.stack(a), *group)
            group = []
        group.append(batch)
    if group:
        yield tf.nest.map_structure(lambda *a: np.stack(a), *group)


def _batches_dataset(make_batches, signature: dict, max_stack: int = 16) -> tf.data.Dataset:
    """A dataset of the generator's batches.

    Handing numpy to tf.data has a fixed cost per generator element whatever its size, so
    batches cross in stacks of up to ``max_stack`` and ``unbatch`` (C++) splits them again
    (``benchmarks.meta_io`` measures the whole reader against the meta step).

    tf.data's autotuning is off: the pipeline has nothing for it to tune (a generator, a
    fixed prefetch), and its model thread sleeps for up to a minute between passes, which
    an iterator's deletion waits out: a training run that ended sat up to 60 s in the
    deletion of its endless training iterator before its process could exit.
    """
    stacked = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), signature)
    ds = tf.data.Dataset.from_generator(lambda: _stacked(make_batches(), max_stack),
                                        output_signature=stacked)
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.unbatch().with_options(options)


def _spec(feature: Feature, lead: list) -> tf.TensorSpec:
    shape = [*lead, None] if not lead else lead
    if feature.is_slotted:
        shape = [*shape, feature.dim]
    return tf.TensorSpec(shape, tf.as_dtype(feature.numpy_dtype))


def _to_ragged(batch: dict) -> dict:
    out = {TASK_COLUMN: batch[TASK_COLUMN]}
    for role in ROLES:
        lengths = tf.cast(tf.reduce_sum(batch[role]["mask"], axis=1), tf.int64)
        out[role] = {k: tf.RaggedTensor.from_tensor(v, lengths=lengths)
                     for k, v in batch[role].items() if k != "mask"}
    return out


def read_tasks(path: str, tasks_per_batch: int, support: int | None = None, query: int | None = None,
               *, split: str | None = "warm", rank: int | None = None, size: int | None = None,
               shuffle_seed: int | None = None, reader: str = "auto", **kwargs) -> tf.data.Dataset:
    """Task batches of one split, sharded over ranks; see ``TaskDataset.tasks``.

    Keyword arguments go to ``TaskDataset`` (features, verify, num_parallel_reads) or to
    ``TaskDataset.tasks`` (epochs, min_support, min_query, on_bad_task, ragged, ...).
    """
    ds_args = {k: kwargs.pop(k) for k in ("features", "verify", "num_parallel_reads") if k in kwargs}
    return TaskDataset(path, split, rank, size, reader, **ds_args).tasks(
        tasks_per_batch, support, query, shuffle_seed=shuffle_seed, **kwargs)


def read_rows(path: str, batch_size: int, *, split: str | None = None, rank: int | None = None,
              size: int | None = None, shuffle_seed: int | None = None, reader: str = "auto",
              **kwargs) -> tf.data.Dataset:
    """Plain row batches (non-meta CTR training); see ``TaskDataset.rows``."""
    ds_args = {k: kwargs.pop(k) for k in ("features", "verify", "num_parallel_reads") if k in kwargs}
    return TaskDataset(path, split, rank, size, reader, **ds_args).rows(
        batch_size, shuffle_seed=shuffle_seed, **kwargs)
