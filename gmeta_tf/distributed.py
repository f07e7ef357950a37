"""Horovod init, topology and the collectives gmeta-tf uses.

Size 1 is just a small cluster: without horovodrun every function here works as a single
process (collectives become identities), so one code path serves one process and many.

Collectives are counted at run time (calls and payload bytes, per kind) so tests and
benchmarks can check that a meta step runs two all-to-alls forward (ids out, rows back)
and one back, whatever its inner steps:
see :func:`collective_counts`.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import tensorflow as tf

_LAUNCHER_ENV = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_KINDS = ("alltoall", "alltoall_grad", "allreduce", "broadcast")


@functools.lru_cache(maxsize=None)
def _hvd():
    """Imports and initializes Horovod once; None for a plain single process."""
    launched = any(k in os.environ for k in _LAUNCHER_ENV)
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        if launched:
            raise
        return None
    hvd.init()
    return hvd


def init() -> None:
    """Initializes the collective layer (idempotent)."""
    _hvd()


def rank() -> int:
    hvd = _hvd()
    return hvd.rank() if hvd else 0


def size() -> int:
    hvd = _hvd()
    return hvd.size() if hvd else 1


def local_rank() -> int:
    hvd = _hvd()
    return hvd.local_rank() if hvd else 0


def is_chief() -> bool:
    return rank() == 0


# ---- counters ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _counters() -> dict[str, tf.Variable]:
    with tf.init_scope():
        return {
            f"{kind}_{what}": tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name=f"gmeta_{kind}_{what}")
            for kind in _KINDS
            for what in ("calls", "bytes")
        }


def _count(kind: str, payload) -> list:
    """Counts one collective call carrying payload (a tensor or a list of tensors)."""
    counters = _counters()
    tensors = payload if isinstance(payload, (list, tuple)) else [payload]
    nbytes = tf.add_n([tf.size(t, out_type=tf.int64) * t.dtype.size for t in tensors])
    return [counters[f"{kind}_calls"].assign_add(1), counters[f"{kind}_bytes"].assign_add(nbytes)]


def collective_counts() -> dict[str, int]:
    """Collectives run so far in this process: '<kind>_calls' and '<kind>_bytes' (payload
    this rank sent) for alltoall (forward), alltoall_grad (backward), allreduce, broadcast."""
    return {name: int(var.numpy()) for name, var in _counters().items()}


def reset_collective_counts() -> None:
    for var in _counters().values():
        var.assign(0)


# ---- collectives ------------------------------------------------------------------------

def _raw_alltoall(tensor: tf.Tensor, splits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    hvd = _hvd()
    if hvd is None or hvd.size() == 1:
        return tensor, splits
    return hvd.alltoall(tensor, splits=splits)


def alltoall(tensor: tf.Tensor, splits: tf.Tensor,
             kind: str = "alltoall") -> tuple[tf.Tensor, tf.Tensor]:
    """Sends ``splits[r]`` leading rows of ``tensor`` (in order) to rank r.

    Returns (received rows, received splits). Differentiable for float tensors: the
    gradient goes back through one all-to-all with the received splits. ``kind``
    "alltoall_grad" counts an explicit backward exchange (no autodiff) as such.
    """
    if kind not in ("alltoall", "alltoall_grad"):
        raise ValueError(f"kind must be 'alltoall' or 'alltoall_grad', got {kind!r}")
    splits = tf.cast(splits, tf.int32)
    if kind == "alltoall_grad" or not tensor.dtype.is_floating:
        with tf.control_dependencies(_count(kind, tensor)):
            return _raw_alltoall(tf.identity(tensor), splits)

    @tf.custom_gradient
    def exchange(x):
        with tf.control_dependencies(_count("alltoall", x)):
            received, received_splits = _raw_alltoall(tf.identity(x), splits)

        def grad(d_received, d_splits=None):
            d_received = tf.convert_to_tensor(d_received)
            with tf.control_dependencies(_count("alltoall_grad", d_received)):
                back, _ = _raw_alltoall(tf.identity(d_received), received_splits)
            return back

        return (received, received_splits), grad

    return exchange(tensor)


def allreduce_gradients(grads: list) -> list:
    """Averages dense gradients over ranks (None stays None). Never give it embedding
    gradients: those travel by all-to-all to the rows' owners."""
    hvd = _hvd()
    present = [g for g in grads if g is not None]
    if not present:
        return list(grads)
    dense = [tf.convert_to_tensor(g) for g in present]
    counted = _count("allreduce", dense)
    if hvd is None or hvd.size() == 1:
        reduced = dense
    else:
        with tf.control_dependencies(counted):
            reduced = hvd.grouped_allreduce(dense, op=hvd.Average)
    it = iter(reduced)
    return [None if g is None else next(it) for g in grads]


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (a collective: call it at the same point on
    every rank)."""
    if size() == 1:
        return bool(flag)
    return bool(sum_over_ranks(np.array([1 if flag else 0]))[0] > 0)


def broadcast_variables(variables, root_rank: int = 0) -> None:
    """Gives every rank rank root_rank's values (initial dense weights)."""
    variables = list(variables)
    hvd = _hvd()
    if variables:
        _count("broadcast", [v.value() for v in variables])
    if hvd is not None and hvd.size() > 1 and variables:
        hvd.broadcast_variables(variables, root_rank=root_rank)


def barrier() -> None:
    hvd = _hvd()
    if hvd is not None and hvd.size() > 1:
        hvd.allreduce(tf.constant(0.0), name="gmeta_barrier")


def sum_over_ranks(values) -> np.ndarray:
    """Element-wise sum of a 1-D array over all ranks, on every rank (int64 or float64)."""
    array = np.asarray(values)
    dtype = np.int64 if np.issubdtype(array.dtype, np.integer) else np.float64
    tensor = tf.constant(array.astype(dtype).reshape(-1))
    hvd = _hvd()
    if hvd is not None and hvd.size() > 1:
        tensor = hvd.allreduce(tensor, op=hvd.Sum, name="gmeta_sum_over_ranks")
    return tensor.numpy()


def allgather(values) -> np.ndarray:
    """Every rank's 1-D array (lengths may differ), concatenated in rank order, on every rank."""
    tensor = tf.constant(np.asarray(values).reshape(-1))
    hvd = _hvd()
    if hvd is not None and hvd.size() > 1:
        tensor = hvd.allgather(tensor, name="gmeta_allgather")
    return tensor.numpy()
