"""Fixtures of the Meta-IO tests: small generated data, and the real data when present."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from gmeta_tf import data  # noqa: E402
from gmeta_tf.data import synthetic  # noqa: E402

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
NUM_TASKS = 300


def need_shared(*parts: str) -> Path:
    """A path under ../shared/data, or skip the test with the reason."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real data not found at {path} (CI always has ../shared/data)")
    return path


@pytest.fixture(scope="session")
def raw_csv(tmp_path_factory) -> Path:
    """A raw synthetic CSV: 300 users, ~20 rows each, genres as 'a|b|c'."""
    path = tmp_path_factory.mktemp("raw") / "ratings.csv"
    synthetic.write_raw_csv(str(path), NUM_TASKS, rows_per_task=20, seed=7)
    return path


def convert_small(raw: Path, out: Path, file_format: str = "parquet", seed: int = 0,
                  **output) -> data.Manifest:
    """Converts the raw CSV with small blocks so that sharding has something to share."""
    return data.convert_csv(
        str(raw), str(out), synthetic.CSV_MAPPING,
        split=data.SplitConfig(seed=seed, query_size=5, min_rows=8),
        output=data.OutputConfig(file_format=file_format, rows_per_block=500, rows_per_file=2500,
                                 **output))


@pytest.fixture(scope="session", params=["parquet", "orc"])
def dataset(request, raw_csv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"ds_{request.param}") / "ds"
    convert_small(raw_csv, out, request.param)
    return out


@pytest.fixture(scope="session")
def parquet_dataset(raw_csv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ds_pq") / "ds"
    convert_small(raw_csv, out, "parquet")
    return out


def rows_by_task(batches) -> dict[int, collections.Counter]:
    """Rows of padded task batches, as {task: Counter of row tuples}, masks applied."""
    out: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for batch in batches:
        for role in ("support", "query"):
            part = {k: v.numpy() for k, v in batch[role].items()}
            for t, task in enumerate(batch["task_id"].numpy()):
                for s in np.flatnonzero(part["mask"][t]):
                    out[int(task)][row_tuple({k: v[t, s] for k, v in part.items()})] += 1
    return out


def row_tuple(row: dict) -> tuple:
    genres = tuple(int(g) for g in np.atleast_1d(row["genres"]) if g != data.PAD_ID)
    return (int(row["item_id"]), int(row["category"]), int(row["age"]),
            float(np.float32(row["price"])), float(row["label"]), tuple(sorted(genres)))
