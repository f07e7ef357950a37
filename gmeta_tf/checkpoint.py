"""Checkpoints of a model whose embedding tables are sharded over ranks.

Layout of one checkpoint ``<root>/ckpt-<step>/``:

- ``dense.*``: a ``tf.train.Checkpoint`` of the model's variables (dense weights, update
  triggers, step counters) and of the optimizer, written by rank 0;
- ``shards/<layer>.rank<r>-of-<n>.npz``: rank r's shard of every table of each
  :class:`ShardedHashEmbedding` (ids, rows, optimizer slots, counters);
- ``MANIFEST.json``: world size, step and the SHA-256 of every file, written last by
  rank 0. A checkpoint without a manifest is incomplete and never restored.

Every file is written under a temporary name, fsynced and renamed, so a crash leaves the
previous checkpoint intact. Restoring reads all shard files of a layer and keeps the ids
each rank owns under the *current* world size: save with 2 ranks, restore with 1 or 4.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.embedding.sharded_hash_embedding import ShardedHashEmbedding

MANIFEST = "MANIFEST.json"
_SNAPSHOT_FIELDS = ("ids", "values", "slots", "freq", "last_seen", "admitted")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or damaged."""


def _sharded_layers(model) -> list[ShardedHashEmbedding]:
    layers = [m for m in model.submodules if isinstance(m, ShardedHashEmbedding)]
    if isinstance(model, ShardedHashEmbedding):
        layers.insert(0, model)
    return layers


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, write) -> None:
    """Calls write(tmp_path), fsyncs it and renames it to path."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    def write(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)

    write_atomically(path, write)


def save(root: str | os.PathLike, model, step: int, optimizer=None) -> Path:
    """Saves a checkpoint of model (and optimizer) at step; every rank must call it."""
    directory = Path(root) / f"ckpt-{int(step)}"
    shards_dir = directory / "shards"
    rank, size = distributed.rank(), distributed.size()
    if distributed.is_chief():
        if directory.exists() and not (directory / MANIFEST).exists():
            for stale in directory.rglob("*"):  # an incomplete earlier attempt
                if stale.is_file():
                    stale.unlink()
        shards_dir.mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    for layer in _sharded_layers(model):
        arrays = {f"{table}/{field}": value
                  for table, snap in layer.export_shards().items()
                  for field, value in snap.items()}
        _save_npz(shards_dir / f"{layer.name}.rank{rank}-of-{size}.npz", arrays)
    if distributed.is_chief():
        objects = {"model": model}
        if optimizer is not None:
            objects["optimizer"] = optimizer
        tf.train.Checkpoint(**objects).write(str(directory / "dense"))
    distributed.barrier()
    if distributed.is_chief():
        files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
        manifest = {
            "step": int(step),
            "world_size": size,
            "files": {str(p.relative_to(directory)): _sha256(p) for p in files},
        }
        write_atomically(directory / MANIFEST,
                         lambda tmp: Path(tmp).write_text(json.dumps(manifest, indent=1)))
    distributed.barrier()
    return directory


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Checkpoints under root that have a manifest, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = re.fullmatch(r"ckpt-(\d+)", d.name)
        if m and (d / MANIFEST).is_file():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def latest(root: str | os.PathLike) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def verify(directory: Path) -> dict:
    """The manifest of a checkpoint whose files all match their checksums."""
    manifest_path = directory / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {directory}: unreadable manifest ({err})") from err
    for rel, expected in files.items():
        path = directory / rel
        if not path.is_file():
            raise CheckpointError(f"checkpoint {directory}: file {rel} is missing")
        actual = _sha256(path)
        if actual != expected:
            raise CheckpointError(f"checkpoint {directory}: file {rel} is damaged "
                                  f"(sha256 {actual[:12]}..., manifest says {expected[:12]}...)")
    return manifest


def _load_npz(path: Path) -> dict[str, dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            tables: dict[str, dict[str, np.ndarray]] = {}
            for key in data.files:
                table, _, field = key.rpartition("/")
                tables.setdefault(table, {})[field] = data[key]
    except (OSError, ValueError) as err:
        raise CheckpointError(f"shard file {path} cannot be read ({err})") from err
    for table, fields in tables.items():
        missing = set(_SNAPSHOT_FIELDS) - set(fields)
        if missing:
            raise CheckpointError(f"shard file {path}: table '{table}' lacks {sorted(missing)}")
    return tables


def restore(directory: str | os.PathLike, model, optimizer=None) -> dict:
    """Restores a checkpoint saved with any world size; returns its manifest.

    The model must be built (called once) so its variables exist.
    """
    directory = Path(directory)
    manifest = verify(directory)
    objects = {"model": model}
    if optimizer is not None:
        objects["optimizer"] = optimizer
    tf.train.Checkpoint(**objects).read(str(directory / "dense")).expect_partial()
    saved_size = manifest["world_size"]
    for layer in _sharded_layers(model):
        paths = [directory / "shards" / f"{layer.name}.rank{r}-of-{saved_size}.npz"
                 for r in range(saved_size)]
        layer.import_shards([_load_npz(p) for p in paths])
    return manifest
