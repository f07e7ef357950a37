"""Elastic training: ranks may leave or join while a job runs (Horovod elastic).

Launch with a host discovery script that prints ``host:slots`` lines, e.g.::

    horovodrun --min-np 1 --max-np 2 --host-discovery-script ./discover_hosts.sh \\
        --network-interface lo --gloo-timeout-seconds 60 python train_elastic.py

(``--network-interface`` skips Horovod's interface probe, which hangs on one machine.)

Embedding rows live on one rank each, so a rank that leaves takes its shard with it: the
in-memory state Horovod keeps for dense weights is not enough. Here a *commit* is a
sharded checkpoint (``gmeta_tf.checkpoint.save``: every rank writes its shard, rank 0 the
dense weights and the manifest last). After any reset (a rank left, joined, or died) every
rank points its ShardedHashEmbedding layers at the new world size and rank and re-imports
all tables from the last good commit, keeping the ids it now owns; dense weights,
optimizer slots and the step come from the same commit. Work since that commit is redone
from the same step, so nothing committed is lost and every row ends on its owner.

Everything a rank does before ``train(state)`` runs alone on a rank that joins later, so
it must not call collectives: build the model from shapes (``layer.build``), not by
calling it on a batch (the embedding exchange is an all-to-all).

Example::

    state = elastic.ShardedModelState(model, optimizer, "run/elastic", commit_every=10)

    @elastic.run
    def train(state):
        step_fn = make_step()              # (re)traced here: the world size is baked in
        while state.step < steps:
            step_fn(*local_share(global_batch(state.step)))
            state.step += 1
            if state.step % 10 == 0:
                state.commit()             # may raise to reset on a host change

    train(state)
"""

from __future__ import annotations

import functools
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import tensorflow as tf
from horovod.common.elastic import State, run_fn
from horovod.common.exceptions import HorovodInternalError

from gmeta_tf import checkpoint, distributed
from gmeta_tf.embedding.update_trigger import dense_variables

log = logging.getLogger(__name__)

# Messages of TF errors raised by Horovod ops when a peer is gone (any collective).
_HOROVOD_OPS = ("HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather",
                "HorovodBroadcast", "HorovodAlltoall", "HorovodReducescatter", "Horovod")


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Like ``hvd.elastic.run``: runs ``func(state, ...)``, resetting and re-entering it
    when ranks leave, join or fail.

    Unlike ``hvd.elastic.run`` it also turns a failed all-to-all (the embedding exchange)
    into a reset, not only all-reduce, all-gather and broadcast. ``func`` must rebuild any
    ``tf.function`` that calls the embedding on entry: world size and rank are traced in.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as err:
            if any(op in (err.message or "") for op in _HOROVOD_OPS):
                raise HorovodInternalError(err) from err
            raise

    return run_fn(wrapper, _reset_horovod)


def _reset_horovod() -> None:
    import horovod.tensorflow as hvd

    hvd.shutdown()
    hvd.init()


def reshard_layers(model) -> None:
    """Points every ShardedHashEmbedding of model at the current world size and rank.

    A layer reads both at construction; after an elastic reset they change. A gradient
    scale left at its default (1 / world size) follows the new size. The tables' contents
    are not moved here: re-import them (``checkpoint.restore``) right after.
    """
    size, rank = distributed.size(), distributed.rank()
    for layer in checkpoint.sharded_layers(model):
        if math.isclose(layer.gradient_scale, 1.0 / layer.world_size):
            layer.gradient_scale = 1.0 / size
        layer.world_size, layer.world_rank = size, rank


def _broadcast_ints(values: Sequence[int]) -> tuple[int, ...]:
    """Rank 0's tuple of integers on every rank (no pickling, unlike hvd.broadcast_object)."""
    if distributed.size() == 1:
        return tuple(int(v) for v in values)
    import horovod.tensorflow as hvd

    tensor = hvd.broadcast(tf.constant([int(v) for v in values], tf.int64), root_rank=0,
                           name="gmeta_elastic_broadcast_ints")
    return tuple(int(v) for v in tensor.numpy())


def _optimizer_variables(optimizer) -> list[tf.Variable]:
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


class ShardedModelState(State):
    """Elastic state of a model with sharded hash embeddings: committed to disk.

    Args:
        model: The built model (call it once so its variables exist).
        optimizer: Its dense optimizer (built here if it is not: every rank must hold the
            same optimizer variables to broadcast them).
        commit_dir: Where commits go (``ckpt-<step>`` directories, shared by all ranks).
        keep: Commits kept on disk (older ones are deleted after each commit).

    Attributes:
        step: The training step; saved with each commit and restored on a reset.
        resets: Resets this process has gone through (for logs and tests).
    """

    def __init__(self, model, optimizer, commit_dir: str | os.PathLike, keep: int = 2) -> None:
        self.model, self.optimizer = model, optimizer
        self.commit_dir, self.keep = Path(commit_dir), keep
        self.step = 0
        self.resets = 0
        if optimizer is not None and hasattr(optimizer, "build"):
            # Slots exist before the first step, so a rank that joins later holds the same
            # optimizer variables as the others and the broadcast in sync() lines up.
            optimizer.build(dense_variables(model))
        self._initial = [v.numpy() for v in self._variables()]
        super().__init__(bcast_object=_broadcast_ints, get_rank=distributed.rank)

    def _variables(self) -> list[tf.Variable]:
        return list(self.model.variables) + _optimizer_variables(self.optimizer)

    # -- horovod.common.elastic.State ------------------------------------------------------
    def save(self) -> None:
        """Commits: every rank writes its shard, rank 0 the dense weights and manifest."""
        checkpoint.save(self.commit_dir, self.model, self.step, self.optimizer, keep=self.keep)

    def restore(self) -> None:
        """Nothing to undo in memory: :meth:`reset` reloads the last commit from disk."""

    def reset(self) -> None:
        """After a reset (no collectives: new ranks do not call this): reshard, reload."""
        self.resets += 1
        self._load()

    def sync(self) -> None:
        """At start and after ranks joined (every rank calls this): reload, then give every
        rank rank 0's weights and step."""
        self._load()
        distributed.broadcast_variables(self._variables(), root_rank=0)
        (self.step,) = _broadcast_ints([self.step])
        if not checkpoint.complete_checkpoints(self.commit_dir):
            self._initial = [v.numpy() for v in self._variables()]

    # -- loading ------------------------------------------------------------------------------
    def _load(self) -> None:
        reshard_layers(self.model)
        found = checkpoint.restore_latest_good(self.commit_dir, self.model, self.optimizer,
                                               agree=False)
        if found is None:  # nothing committed yet: back to the start
            for var, value in zip(self._variables(), self._initial):
                var.assign(value)
            for layer in checkpoint.sharded_layers(self.model):
                _clear_tables(layer)
            self.step = 0
        else:
            self.step = found.step
        log.info("rank %d of %d: state at step %d (%s)", distributed.rank(), distributed.size(),
                 self.step, found.directory if found else "nothing committed yet")


def _clear_tables(layer) -> None:
    empty = {table: {field: value[:0] for field, value in snap.items()}
             for table, snap in layer.export_shards().items()}
    layer.import_shards([empty])
