"""Generic CSV -> dataset, driven by a column mapping (YAML, command line or Python).

A new dataset needs a mapping, not code. Example YAML::

    task: user_id              # the task column (ids or strings)
    label: rating              # label column ...
    label_threshold: 4         # ... optional: label = rating >= 4 (raw kept as 'rating')
    label_range: [1, 5]        # optional: valid raw label values
    sparse: [user_id, item_id, occupation]
    multi_hot: {genres: 6}     # column: width ; values joined by `separator`
    dense: [age]
    order_by: timestamp        # optional: "last" query rows are the latest
    separator: "|"
    delimiter: ","
    header: true               # false: give `columns: [names...]`

Sparse and multi-hot values become ids as described in ``gmeta_tf.data.hashing``; a missing
dense value becomes 0.0 (counted in the log).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from gmeta_tf.data import hashing
from gmeta_tf.data.converters.pipeline import (OutputConfig, RawBatch, columns_to_batch, convert,
                                               record_batches)
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import Manifest
from gmeta_tf.data.schema import TASK_COLUMN, Feature, FeatureKind, Schema
from gmeta_tf.data.split import ORDER_COLUMN, SplitConfig

log = logging.getLogger(__name__)
LABEL = "label"


@dataclasses.dataclass
class CsvMapping:
    """Which CSV column plays which role. One type for YAML, CLI and Python."""

    task: str
    label: str
    label_threshold: float | None = None
    label_range: tuple[float, float] | None = None
    sparse: list[str] = dataclasses.field(default_factory=list)
    multi_hot: dict[str, int] = dataclasses.field(default_factory=dict)
    dense: list[str] = dataclasses.field(default_factory=list)
    order_by: str | None = None
    separator: str = "|"
    delimiter: str = ","
    header: bool = True
    columns: list[str] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CsvMapping":
        """Builds a mapping from a parsed YAML/JSON dict, rejecting unknown keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DataError(f"unknown mapping keys {unknown}", expected=f"keys among {sorted(known)}")
        d = dict(d)
        if isinstance(d.get("multi_hot"), list):  # ["genres:6", ...] from the command line
            d["multi_hot"] = dict(_name_width(s) for s in d["multi_hot"])
        if d.get("label_range") is not None:
            d["label_range"] = tuple(float(v) for v in d["label_range"])
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str) -> "CsvMapping":
        import yaml

        with open(path) as f:
            return cls.from_dict(yaml.safe_load(f) or {})

    def schema(self) -> Schema:
        """The output schema this mapping produces."""
        features = [Feature(c, FeatureKind.SPARSE) for c in self.sparse]
        features += [Feature(c, FeatureKind.MULTI_HOT, w) for c, w in self.multi_hot.items()]
        features += [Feature(c, FeatureKind.DENSE) for c in self.dense]
        if self.label_threshold is None:
            features.append(Feature(LABEL, FeatureKind.LABEL, value_range=self.label_range))
        else:
            features.append(Feature(LABEL, FeatureKind.LABEL, value_range=(0.0, 1.0)))
            if self.label != LABEL:
                features.append(Feature(self.label, FeatureKind.LABEL, value_range=self.label_range))
        return Schema(features)

    def input_columns(self) -> list[str]:
        cols = [self.task, self.label, *self.sparse, *self.multi_hot, *self.dense]
        if self.order_by:
            cols.append(self.order_by)
        return list(dict.fromkeys(cols))


def _name_width(spec: str) -> tuple[str, int]:
    name, _, width = spec.partition(":")
    if not width.isdigit():
        raise DataError("multi-hot spec needs a width", value=spec, expected="NAME:WIDTH, e.g. genres:6")
    return name, int(width)


def _column_types(mapping: CsvMapping) -> dict[str, pa.DataType]:
    types: dict[str, pa.DataType] = {c: pa.string() for c in (mapping.task, *mapping.sparse,
                                                              *mapping.multi_hot)}
    types.update({c: pa.float64() for c in (mapping.label, *mapping.dense)})
    if mapping.order_by:
        types[mapping.order_by] = pa.float64()
    return types


def _open(path: str, mapping: CsvMapping, block_bytes: int) -> pacsv.CSVStreamingReader:
    read = pacsv.ReadOptions(block_size=block_bytes,
                             column_names=None if mapping.header else mapping.columns)
    if not mapping.header and not mapping.columns:
        raise DataError("header: false needs `columns`", file=path)
    try:
        return pacsv.open_csv(
            path, read_options=read,
            parse_options=pacsv.ParseOptions(delimiter=mapping.delimiter),
            convert_options=pacsv.ConvertOptions(include_columns=mapping.input_columns(),
                                                 column_types=_column_types(mapping)))
    except (pa.ArrowInvalid, KeyError) as e:
        raise DataError(f"cannot read as CSV with this mapping: {e}", file=path) from e
    except FileNotFoundError as e:
        raise DataError("input file not found", file=path) from e


def _parse(batch: pa.RecordBatch, mapping: CsvMapping, counts: dict[str, int]) -> pa.RecordBatch:
    cols: dict[str, np.ndarray] = {TASK_COLUMN: hashing.to_ids(batch.column(mapping.task), mapping.task)}
    for c in mapping.sparse:
        cols[c] = hashing.to_ids(batch.column(c), c)
    for c, width in mapping.multi_hot.items():
        slots, truncated = hashing.to_slots(batch.column(c), c, mapping.separator, width)
        counts["truncated_multi_hot_rows"] += truncated
        cols.update({f"{c}__{i}": slots[:, i] for i in range(width)})
    for c in mapping.dense:
        values = batch.column(c).to_numpy(zero_copy_only=False).astype(np.float32)
        counts["missing_dense_values"] += int(np.isnan(values).sum())
        cols[c] = np.nan_to_num(values, nan=0.0)
    raw = batch.column(mapping.label).to_numpy(zero_copy_only=False).astype(np.float32)
    if mapping.label_threshold is None:
        cols[LABEL] = raw
    else:  # NaN stays NaN so the label check still sees it
        cols[LABEL] = np.where(np.isnan(raw), np.nan, raw >= mapping.label_threshold).astype(np.float32)
        if mapping.label != LABEL:
            cols[mapping.label] = raw
    if mapping.order_by:
        cols[ORDER_COLUMN] = batch.column(mapping.order_by).to_numpy(zero_copy_only=False)
    return columns_to_batch(cols)


def _raw_batches(paths: list[str], mapping: CsvMapping, counts: dict[str, int],
                 block_bytes: int) -> Iterator[RawBatch]:
    for path in paths:
        opener = functools.partial(_open, path, mapping, block_bytes)
        for batch, first_row in record_batches(opener, path, "CSV"):
            yield RawBatch(_parse(batch, mapping, counts), path, first_row)


def convert_csv(src: str | list[str], out_dir: str, mapping: CsvMapping | dict | str,
                split: SplitConfig | None = None, output: OutputConfig | None = None,
                block_bytes: int = 16 << 20) -> Manifest:
    """Converts CSV file(s) to a task-partitioned dataset, streaming.

    Args:
        src: A CSV path or a list of paths with the same columns.
        out_dir: Output dataset directory.
        mapping: A ``CsvMapping``, its dict form, or a YAML file path.
        split: Cold-start split parameters (default ``SplitConfig()``).
        output: File format and sizes (default ``OutputConfig()``).
        block_bytes: CSV bytes parsed per batch.

    Returns:
        The manifest of the written dataset.

    Example::

        convert_csv("ratings.csv", "out/", {"task": "user", "label": "rating",
                    "label_threshold": 4, "sparse": ["user", "item"]})
    """
    if isinstance(mapping, str):
        mapping = CsvMapping.from_yaml(mapping)
    elif isinstance(mapping, dict):
        mapping = CsvMapping.from_dict(mapping)
    paths = [src] if isinstance(src, str) else list(src)
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise DataError("input file not found", file=missing[0])
    counts = {"truncated_multi_hot_rows": 0, "missing_dense_values": 0}
    manifest = convert(_raw_batches(paths, mapping, counts, block_bytes), mapping.schema(), out_dir,
                       split=split or SplitConfig(), output=output or OutputConfig(),
                       input_bytes=sum(os.path.getsize(p) for p in paths),
                       source={"kind": "csv", "paths": paths, "mapping": dataclasses.asdict(mapping)})
    for what, n in counts.items():
        if n:
            log.warning("%s: %d", what.replace("_", " "), n)
    return manifest
