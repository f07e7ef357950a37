"""Small config types of the embedding layers: one table, its cache, one feature."""

from __future__ import annotations

import dataclasses
from typing import Any

from gmeta_tf.embedding import sparse_optimizers

COMBINERS = (None, "sum", "mean")


@dataclasses.dataclass(frozen=True)
class MixCacheConfig:
    """Size and admission rule of one table's cache (per shard: per owner rank).

    Args:
        capacity: Rows the cache holds, >= 1.
        min_count: Occurrences (accumulated over every lookup) an id needs before it may
            enter the cache, >= 1. A full cache also needs it to be more frequent than its
            least frequent id, so ``min_count`` matters most while the cache fills: 1
            leaves no slot idle.
        rebalance_every: Every this many training steps, the training loops (synchronous
            and :class:`~gmeta_tf.training.hybrid.HybridTrainer`) call ``rebalance``: the
            cache then holds exactly the shard's most frequent ids. Lookups already admit by exact frequency, so 0 (never) is
            the usual choice; a rebalance costs one pass over the shard's index.

    Example::

        MixCacheConfig(capacity=20_000, min_count=1)
    """

    capacity: int
    min_count: int = 2
    rebalance_every: int = 0

    def __post_init__(self):
        for name, low in (("capacity", 1), ("min_count", 1), ("rebalance_every", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"MixCacheConfig.{name} must be an integer >= {low}, "
                                 f"got {value!r}")
        if self.capacity >= 2**31:
            raise ValueError(f"MixCacheConfig.capacity must be below 2**31, got {self.capacity}")


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One hash table: its dim, fused sparse optimizer, row policy and optional MixCache.

    ``cache`` (a :class:`MixCacheConfig`, or None) puts a MixCache of hot rows inside each
    rank's shard of the table (see :class:`~gmeta_tf.embedding.HashTable`).

    Example::

        TableConfig(name="item", dim=16, optimizer=Adagrad(0.05), admit_after=2)
        TableConfig(name="ad", dim=16, cache=MixCacheConfig(capacity=50_000, min_count=2))
    """

    name: str
    dim: int
    optimizer: Any = "adagrad"
    initializer: str = "uniform"
    init_scale: float = 0.05
    admit_after: int = 1
    default_value: float = 0.0
    seed: int = 0
    cache: MixCacheConfig | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TableConfig.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.dim, int) or isinstance(self.dim, bool) or self.dim < 1:
            raise ValueError(f"TableConfig '{self.name}': dim must be a positive integer, "
                             f"got {self.dim!r}")
        object.__setattr__(self, "optimizer", sparse_optimizers.get(self.optimizer))
        if self.cache is not None:
            if not isinstance(self.cache, MixCacheConfig):
                raise TypeError(f"TableConfig '{self.name}': cache must be a MixCacheConfig or "
                                f"None, got {self.cache!r}")

    def table_kwargs(self) -> dict:
        return dict(optimizer=self.optimizer, seed=self.seed, initializer=self.initializer,
                    init_scale=self.init_scale, admit_after=self.admit_after,
                    default_value=self.default_value)


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """One sparse feature looked up in a table.

    ``combiner`` None keeps one row per id (input [B] -> [B, dim], [B, N] -> [B, N, dim]);
    'sum' or 'mean' pools a multi-hot feature (ragged [B, None], sparse [B, N], or dense
    [B, N] where ids equal to ``pad_id`` are padding) to [B, dim]. ``id_salt`` (non-zero)
    mixes the feature's ids before the lookup (``gmeta_tf.embedding.id_salt``) so that
    features sharing a table do not share rows; 0 looks the ids up as they are.
    """

    name: str
    table: str
    combiner: str | None = None
    pad_id: int | None = None
    id_salt: int = 0

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"FeatureConfig.name must be a non-empty string, got {self.name!r}")
        if self.combiner not in COMBINERS:
            raise ValueError(f"FeatureConfig '{self.name}': combiner must be one of "
                             f"{COMBINERS}, got {self.combiner!r}")
        if self.pad_id is not None and self.combiner is None:
            raise ValueError(f"FeatureConfig '{self.name}': pad_id needs a combiner")
