"""The cold-start split: seeded, reproducible, recorded, independent of chunking."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from gmeta_tf import data
from gmeta_tf.data.split import split_of_tasks
from tests.data.conftest import convert_small


def split_of(path) -> dict[str, dict[int, list[int]]]:
    """{split: {task: is_query flags in file order}}."""
    out: dict[str, dict[int, list[int]]] = {}
    manifest = data.Manifest.load(str(path))
    for f in manifest.files:
        t = pq.read_table(str(path / f.path), columns=["task_id", "is_query"])
        for task, q in zip(t["task_id"].to_pylist(), t["is_query"].to_pylist()):
            out.setdefault(f.split, {}).setdefault(task, []).append(q)
    return out


def test_split_is_reproducible_from_its_seed(raw_csv, tmp_path):
    a = convert_small(raw_csv, tmp_path / "a", seed=11)
    b = convert_small(raw_csv, tmp_path / "b", seed=11, bucket_bytes=20_000)  # many buckets
    c = convert_small(raw_csv, tmp_path / "c", seed=12)
    assert split_of(tmp_path / "a") == split_of(tmp_path / "b")
    assert split_of(tmp_path / "a") != split_of(tmp_path / "c")
    assert a.split["seed"] == 11 and a.split["warm_tasks"] == b.split["warm_tasks"]
    again = convert_small(raw_csv, tmp_path / "a2", seed=11)
    assert [f.sha256 for f in a.files] == [f.sha256 for f in again.files]  # byte for byte
    assert c.split["seed"] == 12


def test_split_follows_the_protocol(raw_csv, tmp_path):
    m = convert_small(raw_csv, tmp_path / "d", seed=3)
    split = split_of(tmp_path / "d")
    assert set(split["warm"]).isdisjoint(split["cold"])
    frac = len(split["warm"]) / (len(split["warm"]) + len(split["cold"]))
    assert 0.7 < frac < 0.9
    for tasks in split.values():
        for flags in tasks.values():
            assert sum(flags) == 5  # query_size
            assert flags == sorted(flags)  # support rows first, then query rows
    assert m.split["warm_tasks"] == len(split["warm"])


def test_short_tasks_are_dropped_and_counted(raw_csv, tmp_path):
    m = data.convert_csv(str(raw_csv), str(tmp_path / "e"), data.synthetic.CSV_MAPPING,
                         split=data.SplitConfig(query_size=10, min_rows=20, max_rows=25))
    kept = m.split["warm_tasks"] + m.split["valid_tasks"] + m.split["cold_tasks"]
    assert m.split["dropped_short"] > 0 and m.split["dropped_long"] > 0
    assert kept + m.split["dropped_short"] + m.split["dropped_long"] == 300
    sizes = [f.rows for f in m.files]
    assert sum(sizes) >= kept * 20


def test_last_query_selection_takes_the_latest_rows(tmp_path):
    csv = tmp_path / "t.csv"
    rows = ["u,i,y,ts"] + [f"{u},{i},{i % 2},{100 - i}" for u in (1, 2) for i in range(15)]
    csv.write_text("\n".join(rows) + "\n")
    m = data.convert_csv(str(csv), str(tmp_path / "o"),
                         {"task": "u", "label": "y", "sparse": ["i"], "order_by": "ts"},
                         split=data.SplitConfig(warm_fraction=1.0, query_size=3, min_rows=4,
                                                query_selection="last"))
    t = pq.read_table(str(tmp_path / "o" / m.files[0].path))
    for u in (1, 2):
        sel = np.array(t["task_id"].to_pylist()) == u
        items = np.array(t["i"].to_pylist())[sel]
        query = np.array(t["is_query"].to_pylist())[sel] == 1
        assert sorted(items[query]) == [0, 1, 2]  # largest ts = smallest i
        assert list(items[~query]) == list(range(14, 2, -1))  # time order


def test_train_long_tasks_keeps_every_long_warm_task(raw_csv, tmp_path):
    base = data.SplitConfig(query_size=10, min_rows=20, max_rows=25, train_long_tasks=False)
    kept = data.SplitConfig(query_size=10, min_rows=20, max_rows=25)  # the default keeps them
    a = data.convert_csv(str(raw_csv), str(tmp_path / "a"), data.synthetic.CSV_MAPPING, split=base)
    b = data.convert_csv(str(raw_csv), str(tmp_path / "b"), data.synthetic.CSV_MAPPING, split=kept)
    sa, sb = split_of(tmp_path / "a"), split_of(tmp_path / "b")
    # The scored splits are the same tasks with the same support/query rows.
    assert sa["valid"] == sb["valid"] and sa["cold"] == sb["cold"]
    assert all(len(flags) <= 25 for name in ("valid", "cold") for flags in sb[name].values())
    # Training gains exactly the long warm tasks, each whole.
    gained = set(sb["warm"]) - set(sa["warm"])
    assert gained and set(sa["warm"]) <= set(sb["warm"])
    assert all(len(sb["warm"][t]) > 25 for t in gained)
    assert b.split["dropped_long"] == a.split["dropped_long"] - len(gained)
    # Those drawn for validation among them are trained on, not lost: only cold long
    # tasks are dropped.
    drawn = split_of_tasks(np.array(sorted(gained)), kept)
    assert (drawn == 1).sum() == b.split["long_tasks_moved_to_warm"] > 0
    assert set(drawn.tolist()) == {0, 1}
    assert a.split["long_tasks_moved_to_warm"] == 0
