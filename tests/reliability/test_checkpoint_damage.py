"""Damaged, partial and hostile checkpoints are detected (checksums, then every field and
array) and restore walks back to the newest good one, saying which and why."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gmeta_tf import checkpoint
from gmeta_tf.checkpoint import MANIFEST, CheckpointError
from gmeta_tf.embedding import Adagrad
from tests.embedding.sharded_worker import TinyCtrModel
from tests.reliability.weights import merged_tables

INT64 = np.iinfo(np.int64)


def batch(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 3, 8)
    return {"f1": np.array([INT64.min, INT64.max, -1, 0, *rng.integers(-50, 50, 4)]),
            "f2": rng.integers(-50, 50, (8, 2)),
            "g": tf.RaggedTensor.from_row_lengths(rng.integers(-50, 50, int(lengths.sum())),
                                                  lengths)}


def make_model() -> tuple[TinyCtrModel, tf.keras.optimizers.Optimizer]:
    tf.keras.backend.clear_session()  # the same layer names as the model that saved
    tf.keras.utils.set_random_seed(0)
    return TinyCtrModel(Adagrad(0.1)), tf.keras.optimizers.Adagrad(0.1)


def train_step(model, optimizer, seed: int) -> None:
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(batch(seed), training=True)))
    dense = [v for v in model.trainable_variables if v is not model.embedding.update_trigger]
    grads = tape.gradient(loss, dense + [model.embedding.update_trigger])
    optimizer.apply_gradients(zip(grads[:len(dense)], dense))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """ckpt-1 and ckpt-2 of a tiny model whose tables hold ids at both int64 limits."""
    root = tmp_path_factory.mktemp("saved")
    model, optimizer = make_model()
    for step in (1, 2):
        train_step(model, optimizer, step)
        checkpoint.save(root, model, step, optimizer)
    return root


def fresh_copy(saved: Path, into: Path) -> Path:
    shutil.copytree(saved, into / "ckpt", dirs_exist_ok=True)
    return into / "ckpt"


def restore_newest_good(root: Path) -> tuple[checkpoint.Restored | None, list]:
    model, optimizer = make_model()
    model(batch(0), training=False)
    skipped: list = []
    found = checkpoint.restore_latest_good(root, model, optimizer,
                                           on_skip=lambda d, why: skipped.append((d.name, why)))
    return found, skipped


def test_ids_at_the_int64_limits_survive_a_round_trip(saved, tmp_path):
    root = fresh_copy(saved, tmp_path)
    found, skipped = restore_newest_good(root)
    assert found.step == 2 and not skipped
    (ids,) = [t["ids"] for name, t in merged_tables(root / "ckpt-2").items()
              if name.endswith("/a")]
    assert INT64.min in ids and INT64.max in ids


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_file_truncated_at_any_offset_is_detected(saved, data):
    with tempfile.TemporaryDirectory() as tmp:
        root = fresh_copy(saved, Path(tmp))
        newest = root / "ckpt-2"
        files = sorted(str(p.relative_to(newest)) for p in newest.rglob("*") if p.is_file())
        rel = data.draw(st.sampled_from(files), label="file")
        size = (newest / rel).stat().st_size
        offset = data.draw(st.integers(0, size - 1), label="offset")
        with open(newest / rel, "r+b") as f:
            f.truncate(offset)
        found, skipped = restore_newest_good(root)
        assert found is not None and found.step == 1, skipped
        assert skipped[0][0] == "ckpt-2"
        assert rel in skipped[0][1] or MANIFEST in skipped[0][1], skipped


def test_a_save_that_never_finished_is_skipped(saved, tmp_path):
    root = fresh_copy(saved, tmp_path)
    partial = root / "ckpt-3" / "shards"
    partial.mkdir(parents=True)
    (partial / "sharded_hash_embedding.rank0-of-1.npz").write_bytes(b"PK\x03\x04 half a zip")
    found, skipped = restore_newest_good(root)
    assert found.step == 2
    assert skipped == [("ckpt-3", f"no {MANIFEST} (a save that did not finish)")]


def rewrite_manifest(directory: Path, edit) -> None:
    manifest = json.loads((directory / MANIFEST).read_text())
    edit(manifest)
    (directory / MANIFEST).write_text(json.dumps(manifest))


def reseal(directory: Path) -> None:
    """Recomputes the manifest's checksums: the damage is then only in the content."""
    rewrite_manifest(directory, lambda m: m["files"].update(
        {rel: checkpoint._sha256(directory / rel) for rel in m["files"]}))


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(world_size=10**12), "field 'world_size' = 1000000000000"),
    (lambda m: m.update(world_size="1"), "field 'world_size' = '1'"),
    (lambda m: m.update(step=True), "field 'step' = True"),
    (lambda m: m.update(step=7), "field 'step' = 7, expected 2 as in the directory name"),
    (lambda m: m.update(files=[]), "field 'files' = []"),
    (lambda m: m["files"].update({"../../etc/passwd": "0" * 64}), "'../../etc/passwd'"),
    (lambda m: m["files"].update({"dense.index": None}), "checksum None"),
    (lambda m: m["files"].pop("shards/sharded_hash_embedding.rank0-of-1.npz"),
     "does not list shards/sharded_hash_embedding.rank0-of-1.npz"),
])
def test_hostile_manifest_fields_are_named(saved, tmp_path, edit, message):
    root = fresh_copy(saved, tmp_path)
    rewrite_manifest(root / "ckpt-2", edit)
    found, skipped = restore_newest_good(root)
    assert found.step == 1
    assert message in skipped[0][1], skipped


@pytest.mark.parametrize("text", ["", "[1, 2]", "{\"step\": NaN}", "\xff\xfe", "{" * 100000])
def test_unreadable_manifest_is_named(saved, tmp_path, text):
    root = fresh_copy(saved, tmp_path)
    (root / "ckpt-2" / MANIFEST).write_bytes(text.encode("latin-1"))
    found, skipped = restore_newest_good(root)
    assert found.step == 1 and MANIFEST in skipped[0][1], skipped


@pytest.mark.parametrize("field, value, message", [
    ("values", np.nan, "non-finite value"),
    ("slots", np.inf, "non-finite value"),
    ("ids", "float", "field 'ids' has dtype float64"),
    ("freq", "short", "field 'freq' has"),
])
def test_shard_arrays_are_checked_even_when_checksums_match(saved, tmp_path, field, value,
                                                            message):
    root = fresh_copy(saved, tmp_path)
    path = root / "ckpt-2" / "shards" / "sharded_hash_embedding.rank0-of-1.npz"
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    key = f"a/{field}"
    if value == "float":
        arrays[key] = arrays[key].astype(np.float64)
    elif value == "short":
        arrays[key] = arrays[key][:-1]
    else:
        arrays[key] = arrays[key].copy()
        arrays[key][0, 0] = value
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    reseal(root / "ckpt-2")
    found, skipped = restore_newest_good(root)
    assert found.step == 1
    assert message in skipped[0][1] and path.name in skipped[0][1], skipped


def test_pickled_shard_is_refused(saved, tmp_path):
    root = fresh_copy(saved, tmp_path)
    path = root / "ckpt-2" / "shards" / "sharded_hash_embedding.rank0-of-1.npz"
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["a/ids"] = np.array([object()] * len(arrays["a/ids"]), dtype=object)
    with open(path, "wb") as f:
        np.savez(f, **arrays)  # an object array can only be stored pickled
    reseal(root / "ckpt-2")
    found, skipped = restore_newest_good(root)
    assert found.step == 1 and "cannot be read" in skipped[0][1], skipped


def test_no_good_checkpoint_is_an_error_listing_each(saved, tmp_path):
    root = fresh_copy(saved, tmp_path)
    for step in (1, 2):
        (root / f"ckpt-{step}" / "dense.index").write_bytes(b"")
    model, optimizer = make_model()
    model(batch(0), training=False)
    with pytest.raises(CheckpointError, match=r"no good checkpoint under .*ckpt-2: .*"
                                              r"dense.index is damaged.*ckpt-1: .*dense.index"):
        checkpoint.restore_latest_good(root, model, optimizer)


def test_prune_keeps_the_newest_and_clears_dead_saves(saved, tmp_path):
    root = fresh_copy(saved, tmp_path)
    (root / "ckpt-0").mkdir()  # a save that died before ckpt-1
    (root / "ckpt-9").mkdir()  # a save that may be in progress
    deleted = checkpoint.prune(root, keep=1)
    assert sorted(d.name for d in deleted) == ["ckpt-0", "ckpt-1"]
    assert sorted(os.listdir(root)) == ["ckpt-2", "ckpt-9"]
    with pytest.raises(ValueError, match="keep must be an integer >= 1"):
        checkpoint.prune(root, keep=0)
