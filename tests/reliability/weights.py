"""Reading a checkpoint's weights without building a model: dense variables from the TF
checkpoint, table shards of all ranks merged and sorted by id (so checkpoints saved by
different world sizes compare equal when they hold the same rows)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tensorflow as tf


def dense_weights(ckpt: Path) -> dict[str, np.ndarray]:
    """Every saved tensor of the dense checkpoint except bookkeeping (save counter)."""
    reader = tf.train.load_checkpoint(str(ckpt / "dense"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if "save_counter" not in name and not name.startswith("_CHECKPOINTABLE")}


def merged_tables(ckpt: Path) -> dict[str, dict[str, np.ndarray]]:
    """'<layer>/<table>' -> field -> array over all ranks' shard files, rows sorted by id."""
    size = json.loads((ckpt / "MANIFEST.json").read_text())["world_size"]
    parts: dict[str, dict[str, list[np.ndarray]]] = {}
    for path in sorted((ckpt / "shards").glob(f"*.rank*-of-{size}.npz")):
        layer = path.name.split(".rank")[0]
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                table, _, field = key.rpartition("/")
                parts.setdefault(f"{layer}/{table}", {}).setdefault(field, []).append(data[key])
    merged = {}
    for name, fields in parts.items():
        arrays = {f: np.concatenate(v) for f, v in fields.items()}
        order = np.argsort(arrays["ids"], kind="stable")
        merged[name] = {f: v[order] for f, v in arrays.items()}
    return merged


def assert_same_weights(a: Path, b: Path) -> None:
    """Checkpoints a and b hold bit-identical dense weights and table rows."""
    dense_a, dense_b = dense_weights(a), dense_weights(b)
    assert sorted(dense_a) == sorted(dense_b)
    for name in dense_a:
        np.testing.assert_array_equal(dense_a[name], dense_b[name], err_msg=name)
    tables_a, tables_b = merged_tables(a), merged_tables(b)
    assert sorted(tables_a) == sorted(tables_b)
    for name in tables_a:
        for field in tables_a[name]:
            np.testing.assert_array_equal(tables_a[name][field], tables_b[name][field],
                                          err_msg=f"{name}/{field}")
