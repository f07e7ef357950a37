"""Small config types of the embedding layers: one table, its cache, one feature."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from gmeta_tf import config_fields
from gmeta_tf.config_fields import FieldError
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

    capacity: int = config_fields.field(min=1, max=2**31 - 1)
    min_count: int = config_fields.field(2, min=1)
    rebalance_every: int = config_fields.field(0, min=0)

    def __post_init__(self):
        config_fields.check(self)


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One hash table: its dim, fused sparse optimizer, row policy and optional MixCache.

    ``optimizer`` is a name ("sgd", "adagrad", "adam"), a mapping ``{name: ..., **params}``
    or a ``SparseOptimizer``; ``learning_rate`` (when not None) replaces its learning rate.

    ``cache`` (a :class:`MixCacheConfig`, or None) puts a MixCache of hot rows inside each
    rank's shard of the table (see :class:`~gmeta_tf.embedding.HashTable`).

    Example::

        TableConfig(name="item", dim=16, optimizer=Adagrad(0.05), admit_after=2)
        TableConfig(name="ad", dim=16, cache=MixCacheConfig(capacity=50_000, min_count=2))
    """

    name: str
    dim: int = config_fields.field(min=1)
    optimizer: Any = "adagrad"
    learning_rate: float | None = config_fields.field(None, min_exclusive=0.0)
    initializer: Literal["zeros", "uniform", "normal"] = "uniform"
    init_scale: float = config_fields.field(0.05, min=0.0)
    admit_after: int = config_fields.field(1, min=1)
    default_value: float = 0.0
    seed: int = 0
    cache: MixCacheConfig | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise FieldError("TableConfig", "name", self.name, "a non-empty string")
        owner = f"TableConfig {self.name!r}"
        config_fields.check(self, owner)
        try:
            optimizer = sparse_optimizers.get(self.optimizer)
            if self.learning_rate is not None:
                optimizer = dataclasses.replace(optimizer, learning_rate=self.learning_rate)
        except (ValueError, TypeError) as err:
            raise FieldError(owner, "optimizer", self.optimizer,
                             f"one of {list(sparse_optimizers.NAMES)}, a mapping "
                             f"{{name: ..., learning_rate: ...}} or a SparseOptimizer "
                             f"({err})") from err
        object.__setattr__(self, "optimizer", optimizer)
        if self.cache is not None and not isinstance(self.cache, MixCacheConfig):
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
