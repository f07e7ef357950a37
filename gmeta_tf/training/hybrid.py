"""Hybrid sync/async training (PERSIA): dense tower synchronous, embeddings bounded-stale.

:class:`HybridTrainer` drives a :class:`ShardedHashEmbedding` and a dense tower in two
threads:

- the **embedding thread** issues every all-to-all, in one fixed order on every rank:
  *pull* (dedup, the all-to-all of ids, lookup-or-insert on the owners, the all-to-all of
  rows back) of batch m as soon as at most ``staleness`` earlier batches still lack their
  update, otherwise the *push* (the all-to-all of row gradients, the fused update on the
  owners) of the oldest batch whose gradients are ready. Updates are applied in batch
  order, each exactly once;
- the **main thread** runs the dense step of batch n on its pulled rows (forward,
  backward, the all-reduce of the dense gradients, the dense optimizer) and hands the
  rows' gradients to the embedding thread.

So the pulls of batches n+1..n+s (and their all-to-alls and table work) overlap the dense
step of batch n. Batch m is looked up with the updates of batches < m - s all applied
and those of at most s batches missing: its *staleness*, counted at each pull and exposed
by :meth:`HybridTrainer.metrics`. ``staleness=0`` is synchronous training: pull n+1 waits
for the update of n, and the result equals the plain layer's training.

Horovod matches collectives by name: all-to-alls come from one thread in a rank-independent
order, all-reduces from the other, so the two streams never mix. Every rank must feed the
same number of batches (as in synchronous training).

Example::

    trainer = HybridTrainer(embedding, loss_fn, dense_vars, tf.keras.optimizers.Adam(1e-3),
                            staleness=2)
    trainer.fit(batches)        # batches: iterable of feature dicts (with labels)
    trainer.metrics()           # {'steps': ..., 'staleness_max': 2, 'staleness_hist': [...]}
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from gmeta_tf import distributed, ops
from gmeta_tf.embedding.sharded_hash_embedding import PulledRows, ShardedHashEmbedding
from gmeta_tf.graph_function import graph_function

LossFn = Callable[[Mapping[str, tf.Tensor], Any], tf.Tensor]
_END = object()


def check_staleness(staleness: Any) -> int:
    """The staleness bound as an int, or ValueError naming the value and what is allowed."""
    if not isinstance(staleness, (int, np.integer)) or isinstance(staleness, bool) or staleness < 0:
        raise ValueError(f"staleness must be an integer >= 0 (0 is synchronous training, s > 0 "
                         f"lets lookups run up to s batches ahead of the updates), got "
                         f"{staleness!r}")
    return int(staleness)


@dataclasses.dataclass
class BatchRecord:
    """What one rank did for one batch (kept when ``record=True``, for tests and audits).

    Attributes:
        applied_before_pull: Updates (whole batches, counted over every ``fit``) this rank
            had applied when it pulled this batch; staleness = the batch's index (over
            every ``fit``) - applied_before_pull.
        unique_ids: Per table, this rank's unique ids of the batch (grouped by owner).
        unique_rows: Per table, the rows the pull returned for them.
        row_grads: Per table, the gradients the dense step produced for those rows
            (before the ``gradient_scale`` the owners apply).
    """

    applied_before_pull: int
    unique_ids: list[np.ndarray]
    unique_rows: list[np.ndarray]
    row_grads: list[np.ndarray] | None = None


class HybridTrainer:
    """Trains a sharded embedding plus a dense tower with bounded embedding staleness.

    Args:
        embedding: The (built or buildable) ShardedHashEmbedding; its features are read
            from each batch by name.
        loss_fn: ``loss_fn(embedded, batch) -> scalar loss`` where ``embedded`` is the
            layer's output for the batch (``{feature: [B, dim]...}``). Traced by
            ``tf.function``.
        dense_variables: The dense weights, trained by ``optimizer`` on all-reduced
            gradients. They must exist (and be broadcast from rank 0) before :meth:`fit`.
        optimizer: A Keras optimizer for the dense weights.
        staleness: The bound s >= 0 on batches looked up before the update of an earlier
            batch was applied; 0 is synchronous.
        record: Keep a :class:`BatchRecord` per batch (copies of ids, rows, gradients).

    Raises:
        ValueError: staleness is not an integer >= 0.
        TypeError: embedding is not a ShardedHashEmbedding.
    """

    def __init__(self, embedding: ShardedHashEmbedding, loss_fn: LossFn,
                 dense_variables: Sequence[tf.Variable], optimizer: tf.keras.optimizers.Optimizer,
                 staleness: int = 0, record: bool = False):
        if not isinstance(embedding, ShardedHashEmbedding):
            raise TypeError(f"embedding must be a ShardedHashEmbedding, got "
                            f"{type(embedding).__name__}")
        self.embedding = embedding
        self.loss_fn = loss_fn
        self.dense_variables = list(dense_variables)
        self.optimizer = optimizer
        self.staleness = check_staleness(staleness)
        self.record = record
        self.records: list[BatchRecord] = []
        self.losses: list[float] = []
        self._hist = np.zeros(self.staleness + 1, np.int64)
        self._wait_for_rows = 0.0
        self._applied_total = 0  # batches whose update this rank applied, over all fits
        self._rebalance_time = 0.0
        self._dense_time = 0.0
        self._pull = graph_function(self._pull_step, reduce_retracing=True)
        self._push = graph_function(self._push_step, reduce_retracing=True)
        self._dense = graph_function(self._dense_step, reduce_retracing=True)

    # ---- the three phases (each one tf.function) ----------------------------------------
    def _pull_step(self, batch) -> PulledRows:
        table_ids, _ = self.embedding.prepare(batch)
        return self.embedding.pull(table_ids)

    def _push_step(self, pulled: PulledRows, row_grads) -> tf.Tensor:
        return self.embedding.push(pulled, row_grads)

    def _dense_step(self, batch, unique_rows, inverse):
        _, assemble = self.embedding.prepare(batch)
        unique_rows = list(unique_rows)
        with tf.GradientTape() as tape:
            tape.watch(unique_rows)
            rows = [ops.gather_rows(u, i) for u, i in zip(unique_rows, inverse)]
            loss = self.loss_fn(assemble(rows), batch)
        n = len(self.dense_variables)
        grads = tape.gradient(loss, self.dense_variables + unique_rows)
        dense_grads = distributed.allreduce_gradients(grads[:n])
        self.optimizer.apply_gradients(zip(dense_grads, self.dense_variables))
        row_grads = [tf.zeros_like(u) if g is None else tf.convert_to_tensor(g)
                     for g, u in zip(grads[n:], unique_rows)]
        return loss, row_grads

    # ---- the driver ---------------------------------------------------------------------
    def fit(self, batches: Iterable) -> dict[str, Any]:
        """Trains on every batch once; returns :meth:`metrics`.

        Raises whatever a phase raised (in either thread), after stopping the other.
        """
        if not self.embedding.built:
            self.embedding.build(None)
        ready: queue.Queue = queue.Queue()  # embedding thread -> main: (batch, pulled)
        grads: queue.Queue = queue.Queue()  # main -> embedding thread: row gradients
        self._stop = threading.Event()
        worker = threading.Thread(target=self._embedding_thread, args=(iter(batches), ready, grads),
                                  name="gmeta-hybrid-embedding", daemon=True)
        worker.start()
        try:
            while True:
                start = time.perf_counter()
                item = ready.get()
                self._wait_for_rows += time.perf_counter() - start
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                batch, pulled, index = item
                start = time.perf_counter()
                loss, row_grads = self._dense(batch, pulled.unique_rows, pulled.inverse)
                self._dense_time += time.perf_counter() - start
                self.losses.append(float(loss))
                if self.record:
                    self.records[index].row_grads = [g.numpy() for g in row_grads]
                grads.put(row_grads)
        except BaseException as err:
            self._stop.set()  # no further exchange: the other ranks may not be there
            grads.put(err)  # unblocks the embedding thread, which then stops
            raise
        finally:
            worker.join()
        return self.metrics()

    def _embedding_thread(self, batches, ready: queue.Queue, grads: queue.Queue) -> None:
        pending: list[PulledRows] = []  # pulled, update not yet applied (oldest first)
        pulled_count = applied = 0
        exhausted = False
        try:
            while not self._stop.is_set():
                if not exhausted and pulled_count - applied <= self.staleness:
                    batch = next(batches, _END)
                    if batch is _END:
                        exhausted = True
                        ready.put(_END)
                        continue
                    seen = pulled_count - applied  # earlier batches whose update is missing
                    if seen > self.staleness:  # the schedule above makes this impossible
                        raise RuntimeError(f"staleness {seen} exceeds the bound {self.staleness}")
                    pulled = self._pull(batch)
                    self._hist[seen] += 1
                    if self.record:
                        self.records.append(BatchRecord(
                            self._applied_total, [d.numpy() for d in pulled.unique_ids],
                            [r.numpy() for r in pulled.unique_rows]))
                    pending.append(pulled)
                    ready.put((batch, pulled, len(self.records) - 1))
                    pulled_count += 1
                elif applied < pulled_count:
                    row_grads = grads.get()
                    if isinstance(row_grads, BaseException):
                        return
                    self._push(pending.pop(0), row_grads)
                    applied += 1
                    self._applied_total += 1
                    self._rebalance_caches()
                else:
                    return
        except BaseException as err:  # hand it to the main thread
            ready.put(err)

    def _rebalance_caches(self) -> None:
        """Re-fills the MixCaches due after this many applied updates (between two
        exchanges: local work, no collective)."""
        start = time.perf_counter()
        if self.embedding.rebalance_caches(self._applied_total):
            self._rebalance_time += time.perf_counter() - start

    # ---- metrics ------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """Steps, the staleness seen (max, mean, histogram: batches pulled with k updates
        missing), seconds the dense steps waited for rows and spent computing, seconds
        spent re-filling caches, and each MixCache's counters on this rank."""
        steps = int(self._hist.sum())
        seen = np.flatnonzero(self._hist)
        return {
            "steps": steps,
            "staleness_bound": self.staleness,
            "staleness_max": int(seen.max()) if seen.size else 0,
            "staleness_mean": float((self._hist * np.arange(self._hist.size)).sum() / steps)
            if steps else 0.0,
            "staleness_hist": self._hist.tolist(),
            "wait_for_rows_s": self._wait_for_rows,
            "dense_s": self._dense_time,
            "cache_rebalance_s": self._rebalance_time,
            "cache": self.embedding.cache_stats(),
        }
