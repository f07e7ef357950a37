"""Horovod init and topology. Size 1 is just a small cluster: no horovodrun needed."""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=None)
def _hvd():
    """Imports and initializes Horovod once; None when running as a single plain process."""
    launched = any(k in os.environ for k in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))
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
