"""The id batches of the embedding-step benchmark, shared by every contender.

Both sides of a venv boundary import this module (it needs numpy only), so the project's
layer and the peers train on bit-identical batches; `batch_digest` lets the caller prove it.

Example::

    spec = BatchSpec(batch_size=4, features=26, seed=0)
    ids = make_batch(spec, step=0)   # int64 [4, 26]; column f lies in [f << 40, (f + 1) << 40)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

ZIPF_A = 1.1
# Each feature owns its own id range, so the 26 tables never share ids; Zipf draws past
# 2**40 (a few percent at a=1.1) wrap inside that range instead of spilling into the next.
FEATURE_BITS = 40


@dataclass(frozen=True)
class BatchSpec:
    """Shape and seed of the id batches: `batch_size` rows of `features` ids."""

    batch_size: int = 65536
    features: int = 26
    seed: int = 0


def make_batch(spec: BatchSpec, step: int) -> np.ndarray:
    """Ids of training step `step` (warm-up is step 0): int64 [batch_size, features].

    Every step draws fresh Zipf(a=1.1) ids from its own generator, seeded by
    (seed, step), so tables keep growing and any contender can rebuild any step alone.
    """
    rng = np.random.default_rng([spec.seed, step])
    draws = rng.zipf(ZIPF_A, size=(spec.batch_size, spec.features)).astype(np.int64)
    in_range = draws & ((1 << FEATURE_BITS) - 1)
    offsets = np.arange(spec.features, dtype=np.int64) << FEATURE_BITS
    return in_range | offsets


def batch_digest(ids: np.ndarray) -> str:
    """Short fingerprint of a batch, to check that two processes saw the same ids."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def unique_count(ids: np.ndarray) -> int:
    """Number of distinct ids in a batch: the rows one step has to look up and update."""
    return int(np.unique(ids).size)
