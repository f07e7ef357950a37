"""Feature schema of a task-partitioned dataset, and how each feature maps to file columns.

Storage layout (what a reader finds in a Parquet or ORC file):

* ``task_id`` (int64): the task a row belongs to. A task's rows are contiguous.
* ``is_query`` (int32): 0 for a support row, 1 for a query row (the converter's split).
* a sparse feature ``f``: one int64 column ``f``.
* a dense feature ``f`` of dim 1: one float32 column ``f``; of dim D > 1: float32 columns
  ``f__0 .. f__{D-1}``.
* a label ``y``: one float32 column ``y``.
* a multi-hot feature ``f`` of width W: int64 slot columns ``f__0 .. f__{W-1}``; a row's ids
  fill the first slots and the rest hold ``PAD_ID`` (-1). tensorflow-io's Parquet reader
  cannot read list columns, so lists are never stored as lists.

Example::

    schema = Schema([Feature("user_id", "sparse"), Feature("genres", "multi_hot", dim=6),
                     Feature("age", "dense"), Feature("label", "label", value_range=(0, 1))])
    schema.columns()  # ['task_id', 'is_query', 'user_id', 'genres__0', ..., 'age', 'label']
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from gmeta_tf.data.errors import DataError

TASK_COLUMN = "task_id"
#: The label a converter writes: the file's own, or 0/1 derived from it by a threshold.
LABEL_COLUMN = "label"
#: Where a source has no task column every row is its own task, numbered
#: ``file index << ROW_TASK_BITS | row`` so that the rows of several input files never share one.
ROW_TASK_BITS = 40
QUERY_COLUMN = "is_query"
PAD_ID = -1
_RESERVED = {TASK_COLUMN, QUERY_COLUMN, "mask"}


class FeatureKind(str, enum.Enum):
    """What a feature is, which fixes its dtype and storage."""

    SPARSE = "sparse"
    MULTI_HOT = "multi_hot"
    DENSE = "dense"
    LABEL = "label"


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of the schema.

    Args:
        name: Feature name (also the column name or column prefix).
        kind: A ``FeatureKind`` or its string value.
        dim: Width of a multi-hot feature, number of values of a dense feature, 1 otherwise.
        value_range: For labels only, the closed range a valid label lies in.
    """

    name: str
    kind: FeatureKind
    dim: int = 1
    value_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FeatureKind(self.kind))
        if self.name in _RESERVED or "__" in self.name:
            raise DataError(f"feature name {self.name!r} is reserved or contains '__'")
        if self.dim < 1 or (self.dim != 1 and self.kind in (FeatureKind.SPARSE, FeatureKind.LABEL)):
            raise DataError(f"feature {self.name!r}: dim {self.dim} invalid for {self.kind.value}")
        if self.value_range is not None:
            object.__setattr__(self, "value_range", tuple(float(v) for v in self.value_range))

    @property
    def is_slotted(self) -> bool:
        """True when the feature is stored as ``name__i`` slot columns."""
        return self.kind == FeatureKind.MULTI_HOT or (self.kind == FeatureKind.DENSE and self.dim > 1)

    @property
    def columns(self) -> list[str]:
        """The file columns holding this feature."""
        if self.is_slotted:
            return [f"{self.name}__{i}" for i in range(self.dim)]
        return [self.name]

    @property
    def numpy_dtype(self) -> np.dtype:
        """int64 for ids, float32 for dense values and labels."""
        ids = self.kind in (FeatureKind.SPARSE, FeatureKind.MULTI_HOT)
        return np.dtype(np.int64 if ids else np.float32)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind.value, "dim": self.dim}
        if self.value_range is not None:
            out["range"] = list(self.value_range)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Feature":
        rng = d.get("range")
        return cls(d["name"], d["kind"], int(d.get("dim", 1)), tuple(rng) if rng else None)


class Schema:
    """An ordered list of features plus the fixed ``task_id`` and ``is_query`` columns."""

    def __init__(self, features: Iterable[Feature]) -> None:
        self.features = list(features)
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise DataError(f"duplicate feature names in schema: {names}")
        if not any(f.kind == FeatureKind.LABEL for f in self.features):
            raise DataError("schema has no label feature")

    def __getitem__(self, name: str) -> Feature:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.to_list() == other.to_list()

    @property
    def labels(self) -> list[Feature]:
        return [f for f in self.features if f.kind == FeatureKind.LABEL]

    def columns(self) -> list[str]:
        """All file columns, in file order."""
        cols = [TASK_COLUMN, QUERY_COLUMN]
        for f in self.features:
            cols.extend(f.columns)
        return cols

    def column_dtypes(self) -> dict[str, np.dtype]:
        """numpy dtype of every file column."""
        out = {TASK_COLUMN: np.dtype(np.int64), QUERY_COLUMN: np.dtype(np.int32)}
        for f in self.features:
            out.update({c: f.numpy_dtype for c in f.columns})
        return out

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema every data file must have."""
        return pa.schema([(c, pa.from_numpy_dtype(t)) for c, t in self.column_dtypes().items()])

    def to_list(self) -> list[dict[str, Any]]:
        return [f.to_dict() for f in self.features]

    @classmethod
    def from_list(cls, items: list[dict[str, Any]]) -> "Schema":
        return cls(Feature.from_dict(d) for d in items)

