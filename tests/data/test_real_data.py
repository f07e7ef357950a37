"""The converters on the real files in ../shared/data (skipped when absent)."""

from __future__ import annotations

import numpy as np
import pytest

from gmeta_tf import data
from tests.data.conftest import need_shared

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def movielens(tmp_path_factory):
    src = need_shared("ml-100k")
    out = tmp_path_factory.mktemp("ml") / "ml"
    return out, data.convert_movielens(str(src), str(out), seed=0,
                                       output=data.OutputConfig(rows_per_block=8192))


def test_movielens_follows_the_cold_start_protocol(movielens):
    out, m = movielens
    assert m.split["rows_in"] == 100_000 and m.split["dropped_short"] == 0  # all users >= 20
    assert m.split["warm_tasks"] + m.split["valid_tasks"] + m.split["cold_tasks"] == 943
    assert 0.15 < m.split["cold_tasks"] / 943 < 0.25
    assert {f.name for f in m.schema.labels} == {"rating", "label"}
    cold = data.read_tasks(str(out), 32, support=None, query=10, split="cold")
    tasks = 0
    for batch in cold:
        q = batch["query"]
        np.testing.assert_array_equal(q["mask"].numpy().sum(axis=1), 10)
        rating, label = q["rating"].numpy(), q["label"].numpy()
        np.testing.assert_array_equal(label, (rating >= 4) * q["mask"].numpy())
        assert q["genres"].shape[2] == 6
        tasks += batch["task_id"].shape[0]
    assert tasks == m.split["cold_tasks"]


def test_movielens_rows_match_u_data(movielens):
    out, _ = movielens
    src = need_shared("ml-100k", "u.data")
    raw = np.loadtxt(src, dtype=np.int64)
    got = []
    for batch in data.read_rows(str(out), 10_000):
        got.append(np.stack([batch[k].numpy().astype(np.int64)
                             for k in ("user_id", "item_id", "rating")], axis=1))
    got = np.concatenate(got)
    key = lambda a: a[np.lexsort(a.T[::-1])]  # noqa: E731
    np.testing.assert_array_equal(key(got), key(raw[:, :3]))


@pytest.mark.parametrize("file_format, int_mode", [("parquet", "bucketize"), ("orc", "log")])
def test_criteo_converts_and_reads(tmp_path, file_format, int_mode):
    src = need_shared("criteo", "train.tsv")
    m = data.convert_criteo(str(src), str(tmp_path / "c"), seed=1, int_mode=int_mode,
                            output=data.OutputConfig(file_format=file_format))
    kept = m.split["warm_tasks"] + m.split["valid_tasks"] + m.split["cold_tasks"]
    assert m.split["rows_in"] == 7200 and kept > 50
    batches = list(data.read_tasks(str(tmp_path / "c"), 16, 20, 4, split="warm", shuffle_seed=0))
    assert sum(b["task_id"].shape[0] for b in batches) == m.split["warm_tasks"]
    s = batches[0]["support"]
    assert s["C10"].dtype.name == "int64" and s["label"].dtype.name == "float32"
    kind = "int64" if int_mode == "bucketize" else "float32"
    assert s["I5"].dtype.name == kind
    np.testing.assert_array_equal(batches[0]["task_id"].numpy()[:, None] * s["mask"].numpy(),
                                  s["C2"].numpy() * s["mask"].numpy())  # task = C2 value
