"""Hostile input, generated: malformed config files for the config loader and malformed
datasets (manifest, data file bytes, column values) for the Meta-IO reader. Within a
bounded budget nothing may crash or hang: every input is accepted or refused with the
module's own error (ConfigError, DataError) naming where the problem is."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gmeta_tf import data
from gmeta_tf.config import ConfigError, PipelineConfig, load_config
from gmeta_tf.data import synthetic
from gmeta_tf.data.manifest import sha256_of
from tests.data.conftest import convert_small

EXAMPLE_SECONDS = 60  # one example taking longer than this is a hang, not load
FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
READER_FUZZ = settings(FUZZ, max_examples=15)  # each example builds a tf.data pipeline
INT64 = np.iinfo(np.int64)


@contextlib.contextmanager
def no_hang(what: str) -> Iterator[None]:
    """Fails the example (instead of the whole run hanging) if it takes too long."""
    def alarm(signum, frame):
        raise AssertionError(f"{what} still running after {EXAMPLE_SECONDS}s: a hang")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(EXAMPLE_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


HOSTILE_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.sampled_from([INT64.min, INT64.max, -1, 0, 1 << 63, float("nan"), float("inf"),
                     float("-inf"), 1e308, -0.0, "", "nan", "\x00", "a" * 10000, [], {}]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.lists(st.integers(-5, 5), max_size=4), st.dictionaries(st.text(max_size=5),
                                                              st.integers(), max_size=3),
)


def config_keys() -> list[tuple[str, ...]]:
    """Every key path of the pipeline config, sections and leaves."""
    paths = []

    def walk(value: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                paths.append(prefix + (k,))
                walk(v, prefix + (k,))

    walk(PipelineConfig().to_dict(), ())
    return paths + [("model", "tables", "user", "learning_rate"), ("nope",),
                    ("train", "nope")]


def base_pipeline() -> dict:
    return yaml.safe_load((Path(__file__).resolve().parents[2] / "pipelines" /
                           "default.yaml").read_text())


def load_or_refuse(path: Path) -> None:
    try:
        load_config(str(path))
    except ConfigError as err:
        assert str(err).startswith(("config key '", f"config file {path}")), str(err)


@FUZZ
@given(key=st.sampled_from(config_keys()), value=HOSTILE_VALUES)
def test_config_loader_with_a_hostile_value_at_any_key(key, value):
    raw = base_pipeline()
    node = raw
    for part in key[:-1]:
        node = node.setdefault(part, {}) if isinstance(node.get(part), dict) else {}
    node[key[-1]] = value
    with tempfile.TemporaryDirectory() as tmp, no_hang("load_config"):
        path = Path(tmp) / "pipeline.yaml"
        path.write_text(yaml.safe_dump(raw, allow_unicode=True))
        load_or_refuse(path)


@FUZZ
@given(content=st.one_of(
    st.binary(max_size=300),
    st.text(alphabet=st.sampled_from("[]{}:,-&*!|>'\"\n #a1.?%@`"), max_size=300),
    st.integers(0, 300).map(lambda n: "a:\n" + "".join(" " * i + "- b:\n" for i in range(n))),
    st.sampled_from(["!!python/object/apply:os.system ['true']", "a: !!binary AAAA",
                     "train: {steps: !!float .nan}", "&a [*a, *a]", "[" * 3000, "---\n---\n"]),
))
def test_config_loader_with_malformed_files(content):
    with tempfile.TemporaryDirectory() as tmp, no_hang("load_config"):
        path = Path(tmp) / "pipeline.yaml"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        load_or_refuse(path)


# ---- the Meta-IO reader -----------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz_data")
    synthetic.write_raw_csv(str(root / "raw.csv"), 40, rows_per_task=20, seed=3)
    convert_small(root / "raw.csv", root / "ds")
    return root / "ds"


def read_all(directory: Path) -> int:
    """Reads every batch of every split; returns the tasks read."""
    batches = data.read_tasks(str(directory), 4, 5, 3, split=None)
    return sum(int(b["task_id"].shape[0]) for b in batches)


def read_or_refuse(directory: Path) -> None:
    """Reading either succeeds or stops with Meta-IO's DataError whose message starts with
    the file at fault, a file of this dataset (the manifest or a data file)."""
    try:
        read_all(directory)
    except data.DataError as err:
        assert err.file and str(err).startswith(f"{err.file}: "), str(err)
        assert Path(err.file).resolve().is_relative_to(directory.resolve()), str(err)
    except tf.errors.OpError as err:  # a DataError raised inside tf.data's generator
        assert "DataError" in err.message and f"{directory}/" in err.message, err.message


def reseal(directory: Path, rel: str) -> None:
    """Makes the manifest agree with a changed file, so the reader must look inside it."""
    manifest = json.loads((directory / "manifest.json").read_text())
    for entry in manifest["files"]:
        if entry["path"] == rel:
            entry.update(bytes=os.path.getsize(directory / rel),
                         sha256=sha256_of(str(directory / rel)))
    (directory / "manifest.json").write_text(json.dumps(manifest))


def first_file(directory: Path) -> str:
    return json.loads((directory / "manifest.json").read_text())["files"][0]["path"]


@contextlib.contextmanager
def copy_of(dataset: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(shutil.copytree(dataset, Path(tmp) / "ds"))


def manifest_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += manifest_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            out += manifest_paths(v, prefix + (i,))
    return out


@READER_FUZZ
@given(data_=st.data(), value=HOSTILE_VALUES)
def test_reader_with_a_hostile_manifest_field(dataset, data_, value):
    manifest = json.loads((dataset / "manifest.json").read_text())
    path = data_.draw(st.sampled_from(manifest_paths(manifest)), label="field")
    node = manifest
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with copy_of(dataset) as ds, no_hang("read_tasks"):
        (ds / "manifest.json").write_text(json.dumps(manifest, allow_nan=True))
        read_or_refuse(ds)


@READER_FUZZ
@given(data_=st.data(), resealed=st.booleans())
def test_reader_with_damaged_file_bytes(dataset, data_, resealed):
    with copy_of(dataset) as ds, no_hang("read_tasks"):
        rel = first_file(ds)
        blob = bytearray((ds / rel).read_bytes())
        how = data_.draw(st.sampled_from(["truncate", "flip", "empty", "manifest"]), label="how")
        if how == "truncate":
            blob = blob[:data_.draw(st.integers(0, len(blob) - 1), label="offset")]
        elif how == "flip":
            for _ in range(data_.draw(st.integers(1, 8), label="flips")):
                blob[data_.draw(st.integers(0, len(blob) - 1))] ^= 0xFF
        elif how == "empty":
            blob = bytearray()
        if how == "manifest":
            text = (ds / "manifest.json").read_bytes()
            (ds / "manifest.json").write_bytes(text[:data_.draw(st.integers(0, len(text)))])
        else:
            (ds / rel).write_bytes(bytes(blob))
            if resealed:
                reseal(ds, rel)
        read_or_refuse(ds)


@READER_FUZZ
@given(column=st.sampled_from(["user_id", "item_id", "label", "price", "age"]),
       value=st.sampled_from([INT64.min, INT64.max, -1, 0, float("nan"), float("inf"),
                              -float("inf"), 1e38]))
def test_reader_with_hostile_column_values(dataset, column, value):
    with copy_of(dataset) as ds, no_hang("read_tasks"):
        rel = first_file(ds)
        table = pq.read_table(ds / rel)
        if column not in table.column_names:
            return
        index = table.column_names.index(column)
        kind = table.schema.field(column).type
        if pa.types.is_integer(kind) and not (isinstance(value, int) or math.isfinite(value)):
            return  # an integer column cannot hold NaN
        if pa.types.is_integer(kind):
            value = int(value)
        array = pa.array([value] * table.num_rows).cast(kind, safe=False)
        pq.write_table(table.set_column(index, column, array), ds / rel,
                       row_group_size=pq.ParquetFile(ds / rel).metadata.row_group(0).num_rows)
        reseal(ds, rel)
        read_or_refuse(ds)
