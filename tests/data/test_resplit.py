"""The validation split, and training tasks' support/query rows drawn anew each epoch."""

from __future__ import annotations

import numpy as np

from gmeta_tf import data
from tests.data.conftest import NUM_TASKS, convert_small


def _query_items(batches) -> dict[int, tuple]:
    """task id -> the item ids of its query rows (sorted)."""
    out = {}
    for batch in batches:
        mask = np.asarray(batch["query"]["mask"]) > 0
        items = np.asarray(batch["query"]["item_id"])
        for t, task in enumerate(np.asarray(batch["task_id"])):
            out[int(task)] = tuple(sorted(items[t][mask[t]].tolist()))
    return out


def _all_items(batches) -> dict[int, list]:
    out = {}
    for batch in batches:
        for t, task in enumerate(np.asarray(batch["task_id"])):
            rows = []
            for role in ("support", "query"):
                mask = np.asarray(batch[role]["mask"][t]) > 0
                rows += np.asarray(batch[role]["item_id"][t])[mask].tolist()
            out[int(task)] = sorted(rows)
    return out


def test_validation_split_is_a_seeded_fraction_of_the_warm_tasks(raw_csv, tmp_path):
    m = convert_small(raw_csv, tmp_path / "v", seed=5)
    tasks = {s: set() for s in ("warm", "valid", "cold")}
    for split in tasks:
        for batch in data.read_tasks(str(tmp_path / "v"), 64, split=split):
            tasks[split] |= set(np.asarray(batch["task_id"]).tolist())
    assert all(tasks.values())
    assert not (tasks["warm"] & tasks["valid"]) and not (tasks["valid"] & tasks["cold"])
    assert m.split["valid_tasks"] == len(tasks["valid"])
    valid_of_warm = len(tasks["valid"]) / (len(tasks["warm"]) + len(tasks["valid"]))
    assert 0.04 < valid_of_warm < 0.2  # default valid_fraction 0.1
    assert len(tasks["warm"]) + len(tasks["valid"]) + len(tasks["cold"]) <= NUM_TASKS
    again = convert_small(raw_csv, tmp_path / "v2", seed=5)
    assert again.split["valid_tasks"] == m.split["valid_tasks"]
    none = data.convert_csv(str(raw_csv), str(tmp_path / "v0"), data.synthetic.CSV_MAPPING,
                            split=data.SplitConfig(query_size=5, min_rows=8, valid_fraction=0.0))
    assert none.split["valid_tasks"] == 0 and {f.split for f in none.files} == {"warm", "cold"}


def test_training_tasks_are_resplit_each_epoch_and_evaluation_tasks_are_not(raw_csv, tmp_path):
    convert_small(raw_csv, tmp_path / "r", seed=1)
    path = str(tmp_path / "r")
    ds = data.TaskDataset(path, "warm")
    epochs = list(ds.tasks(8, None, None, shuffle_seed=3, epochs=2, resplit=True))
    half = len(epochs) // 2
    first, second = _query_items(epochs[:half]), _query_items(epochs[half:])
    assert first.keys() == second.keys()
    changed = sum(first[t] != second[t] for t in first)
    assert changed > 0.9 * len(first)            # query rows drawn anew for nearly every task
    assert _all_items(epochs[:half]) == _all_items(epochs[half:])  # the same rows in all
    for t in first:                              # as many query rows as the file's split
        assert len(first[t]) == len(second[t]) == 5
    # Evaluation reads (no shuffle seed, or no resplit) keep the file's split every time.
    fixed = [_query_items(ds.tasks(8, None, None, epochs=1, resplit=True)) for _ in range(2)]
    assert fixed[0] == fixed[1]
    kept = list(ds.tasks(8, None, None, shuffle_seed=3, epochs=2, resplit=False))
    assert _query_items(kept[:half]) == _query_items(kept[half:]) == fixed[0]
