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

A checkpoint comes from outside the process, so nothing in it is trusted: the manifest is
checked field by field (paths must stay inside the checkpoint, every shard file the world
size implies must be listed), every file against its SHA-256, shard arrays for dtype,
shape, duplicate ids and non-finite values, all before the model is touched; NumPy files
are read with ``allow_pickle=False``. :func:`restore_latest_good` walks back from the
newest checkpoint to the newest one that passes, saying why it skipped the others, and
:func:`prune` keeps the last K (renamed away first, so a crash while deleting never
leaves a half-deleted checkpoint that looks complete).

Example::

    checkpoint.save("run/ckpt", model, step=100, optimizer=opt, keep=3)
    found = checkpoint.restore_latest_good("run/ckpt", model, opt)  # None: start fresh
    start = found.step if found else 0
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.atomic_file import fsync_dir, write_atomically, write_text_atomically
from gmeta_tf.embedding.sharded_hash_embedding import ShardedHashEmbedding

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
_SNAPSHOT_FIELDS = ("ids", "values", "slots", "freq", "last_seen", "admitted")
# dtype kind and rank of each field of a table snapshot (see gmeta_tf.embedding.table_ops.TableSnapshot).
_FIELD_SPECS = {"ids": ("i", 1), "values": ("f", 2), "slots": ("f", 2), "freq": ("i", 1),
                "last_seen": ("i", 1), "admitted": ("b", 1)}
_CKPT_NAME = re.compile(r"ckpt-(\d+)")
_MAX_WORLD_SIZE = 1 << 16
_MAX_MANIFEST_BYTES = 64 << 20
_DELETING_PREFIX = ".deleting-"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or damaged."""


def sharded_layers(model) -> list[ShardedHashEmbedding]:
    """The ShardedHashEmbedding layers of model (model itself included), in order."""
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


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez``'s format (read by ``np.load``), the zip closed before its file also
    when the write is interrupted (Ctrl-C): ``np.savez`` leaves it to the garbage
    collector, whose late close of the closed file prints a traceback."""
    def write(tmp):
        with open(tmp, "wb") as f, zipfile.ZipFile(f, mode="w", allowZip64=True) as zipped:
            for name, value in arrays.items():
                with zipped.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(value),
                                              allow_pickle=False)

    write_atomically(path, write)


def save(root: str | os.PathLike, model, step: int, optimizer=None,
         keep: int | None = None) -> Path:
    """Saves a checkpoint of model (and optimizer) at step; every rank must call it.

    Args:
        root: Directory holding the ``ckpt-<step>`` directories.
        model: A built model (or layer) whose ShardedHashEmbedding layers are saved per rank.
        step: The training step the checkpoint is of.
        optimizer: Optional trackable optimizer(s) saved with the dense weights.
        keep: When given, rank 0 then deletes all but the newest ``keep`` checkpoints.

    Returns:
        The checkpoint directory.
    """
    directory = Path(root) / f"ckpt-{int(step)}"
    shards_dir = directory / "shards"
    rank, size = distributed.rank(), distributed.size()
    if distributed.is_chief():
        if directory.exists():  # an earlier attempt at this step, complete or not
            _mark_incomplete(directory)
            for stale in directory.rglob("*"):
                if stale.is_file():
                    stale.unlink()
        shards_dir.mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    for layer in sharded_layers(model):
        arrays = {f"{table}/{field}": value
                  for table, snap in layer.export_shards().items()
                  for field, value in snap.items()}
        _save_npz(shards_dir / f"{layer.name}.rank{rank}-of-{size}.npz", arrays)
    if distributed.is_chief():
        objects = {"model": model}
        if optimizer is not None:
            objects["optimizer"] = optimizer
        tf.train.Checkpoint(**objects).write(str(directory / "dense"))
        for written in directory.glob("dense*"):  # TF renames its files but never fsyncs
            _fsync_file(written)
    distributed.barrier()
    if distributed.is_chief():
        files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
        manifest = {
            "step": int(step),
            "world_size": size,
            "files": {str(p.relative_to(directory)): _sha256(p) for p in files},
        }
        write_text_atomically(directory / MANIFEST, json.dumps(manifest, indent=1))
        if keep is not None:
            prune(root, keep)
    distributed.barrier()
    return directory


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _mark_incomplete(directory: Path) -> None:
    """Removes a checkpoint's manifest first, durably, so that it is never taken for
    complete while its other files are being replaced or deleted."""
    manifest = directory / MANIFEST
    if manifest.exists():
        manifest.unlink()
        fsync_dir(directory)


def prune(root: str | os.PathLike, keep: int, protect: Iterable[int] = ()) -> list[Path]:
    """Deletes all but the newest ``keep`` complete checkpoints (call it on one rank),
    never the complete checkpoints of the ``protect`` steps (e.g. the best on validation).

    Incomplete checkpoints older than the newest complete one (left by a crash during a
    save) go too; a newer incomplete one may be a save in progress and stays. Each victim
    is renamed to a hidden name first, so a crash mid-delete leaves nothing that looks
    like a checkpoint.

    Args:
        root: Directory holding the ``ckpt-<step>`` directories.
        keep: How many complete checkpoints to keep (>= 1).
        protect: Steps whose complete checkpoints are kept besides those.

    Returns:
        The checkpoint directories deleted.

    Raises:
        ValueError: keep is not an integer >= 1.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1 (checkpoints to keep), got {keep!r}")
    root = Path(root)
    complete = complete_checkpoints(root)
    if not complete:
        return []
    newest = _step_of(complete[-1])
    kept = set(protect)
    victims = [d for d in complete[:-keep] if _step_of(d) not in kept] + [d for d in _checkpoint_dirs(root)
                                  if not (d / MANIFEST).is_file() and _step_of(d) < newest]
    for victim in victims:
        doomed = victim.with_name(f"{_DELETING_PREFIX}{victim.name}")
        os.replace(victim, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    for leftover in root.glob(f"{_DELETING_PREFIX}*"):  # from a crash during an earlier prune
        shutil.rmtree(leftover, ignore_errors=True)
    if victims:
        fsync_dir(root)
    return victims


def _step_of(directory: Path) -> int:
    return int(_CKPT_NAME.fullmatch(directory.name).group(1))


def _checkpoint_dirs(root: Path) -> list[Path]:
    """Every ``ckpt-<step>`` directory under root, complete or not, oldest first."""
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if _CKPT_NAME.fullmatch(d.name) and d.is_dir()]
    return sorted(found, key=_step_of)


def complete_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Checkpoints under root that have a manifest, oldest first."""
    return [d for d in _checkpoint_dirs(Path(root)) if (d / MANIFEST).is_file()]


def latest(root: str | os.PathLike) -> Path | None:
    """The newest checkpoint with a manifest (not verified: see restore_latest_good)."""
    found = complete_checkpoints(root)
    return found[-1] if found else None


def _manifest_error(directory: Path, problem: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {directory}: {MANIFEST} {problem}")


def read_manifest(directory: str | os.PathLike) -> dict:
    """A checkpoint's manifest, checked field by field (not the files' checksums).

    Raises:
        CheckpointError: The manifest is missing, not JSON, or a field has the wrong type
            or value (the message names the field, the value and what was expected).
    """
    directory = Path(directory)
    path = directory / MANIFEST
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            raise _manifest_error(directory, f"is {path.stat().st_size} bytes, expected at "
                                             f"most {_MAX_MANIFEST_BYTES}")
        manifest = json.loads(path.read_bytes().decode("utf-8"),
                              parse_constant=_reject_constant)
    except (OSError, ValueError, RecursionError) as err:
        raise _manifest_error(directory, f"is unreadable ({err})") from err
    if not isinstance(manifest, dict):
        raise _manifest_error(directory, f"holds {type(manifest).__name__}, expected an object "
                                         f"with keys step, world_size, files")
    for key, low, high in (("step", 0, (1 << 63) - 1), ("world_size", 1, _MAX_WORLD_SIZE)):
        value = manifest.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _manifest_error(directory, f"field '{key}' = {value!r}, expected an integer "
                                             f"in [{low}, {high}]")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise _manifest_error(directory, f"field 'files' = {_short(files)}, expected a "
                                         f"non-empty object of relative path -> sha256")
    for rel, digest in files.items():
        if not _inside(directory, rel):
            raise _manifest_error(directory, f"lists file {rel!r}, expected a relative path "
                                             f"inside the checkpoint")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _manifest_error(directory, f"gives file {rel!r} the checksum "
                                             f"{_short(digest)}, expected 64 hex digits")
    match = _CKPT_NAME.fullmatch(directory.name)
    if match and int(match.group(1)) != manifest["step"]:
        raise _manifest_error(directory, f"field 'step' = {manifest['step']}, expected "
                                         f"{match.group(1)} as in the directory name")
    return manifest


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed in a manifest")


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _inside(directory: Path, rel) -> bool:
    if not isinstance(rel, str) or not rel or "\x00" in rel or os.path.isabs(rel):
        return False
    parts = Path(rel).parts
    return ".." not in parts and rel != MANIFEST


def verify(directory: str | os.PathLike) -> dict:
    """The manifest of a checkpoint whose files all match their checksums.

    Raises:
        CheckpointError: Naming the checkpoint and the missing, damaged or unlisted file.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    for rel, expected in manifest["files"].items():
        path = directory / rel
        if not path.is_file():
            raise CheckpointError(f"checkpoint {directory}: file {rel} is missing")
        actual = _sha256(path)
        if actual != expected:
            raise CheckpointError(f"checkpoint {directory}: file {rel} is damaged "
                                  f"(sha256 {actual[:12]}..., manifest says {expected[:12]}...)")
    if not any(rel.startswith("dense") for rel in manifest["files"]):
        raise CheckpointError(f"checkpoint {directory}: {MANIFEST} lists no dense.* files "
                              f"(the dense weights), expected them")
    return manifest


def _load_npz(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """One rank's shard file: table -> field -> array, every array checked."""
    try:
        with np.load(path, allow_pickle=False) as data:
            tables: dict[str, dict[str, np.ndarray]] = {}
            for key in data.files:
                table, _, field = key.rpartition("/")
                tables.setdefault(table, {})[field] = data[key]
    except (OSError, ValueError, EOFError, KeyError) as err:
        raise CheckpointError(f"shard file {path} cannot be read ({err})") from err
    except Exception as err:  # zipfile.BadZipFile and kin: any damage is a CheckpointError
        raise CheckpointError(f"shard file {path} cannot be read ({type(err).__name__}: "
                              f"{err})") from err
    for table, fields in tables.items():
        _check_snapshot(path, table, fields)
    return tables


def _check_snapshot(path: Path, table: str, fields: dict[str, np.ndarray]) -> None:
    missing = set(_SNAPSHOT_FIELDS) - set(fields)
    if missing:
        raise CheckpointError(f"shard file {path}: table '{table}' lacks {sorted(missing)}")
    n = None
    for name, (kind, rank) in _FIELD_SPECS.items():
        array = fields[name]
        if array.dtype.kind != kind or array.ndim != rank:
            raise CheckpointError(
                f"shard file {path}: table '{table}' field '{name}' has dtype {array.dtype} "
                f"and shape {array.shape}, expected a rank-{rank} array of kind '{kind}'")
        n = array.shape[0] if n is None else n
        if array.shape[0] != n:
            raise CheckpointError(f"shard file {path}: table '{table}' field '{name}' has "
                                  f"{array.shape[0]} entries, expected {n} (one per id)")
        if kind == "f" and not np.isfinite(array).all():
            bad = int(np.flatnonzero(~np.isfinite(array).all(axis=1))[0])
            raise CheckpointError(f"shard file {path}: table '{table}' field '{name}' has a "
                                  f"non-finite value in the row of id {fields['ids'][bad]}, "
                                  f"expected finite numbers")
    if fields["ids"].dtype != np.int64:
        raise CheckpointError(f"shard file {path}: table '{table}' ids have dtype "
                              f"{fields['ids'].dtype}, expected int64")


def _check_no_duplicates(directory: Path, layer: str, shards: list[dict]) -> None:
    for table in shards[0] if shards else {}:
        ids = np.concatenate([s[table]["ids"] for s in shards if table in s])
        unique, counts = np.unique(ids, return_counts=True)
        if len(unique) != len(ids):
            raise CheckpointError(f"checkpoint {directory}: layer '{layer}' table '{table}' "
                                  f"holds id {unique[counts > 1][0]} in more than one row, "
                                  f"expected each id once over all shard files")


def _shard_paths(directory: Path, manifest: dict, layer: str) -> list[Path]:
    saved_size = manifest["world_size"]
    rels = [f"shards/{layer}.rank{r}-of-{saved_size}.npz" for r in range(saved_size)]
    unlisted = [rel for rel in rels if rel not in manifest["files"]]
    if unlisted:
        raise CheckpointError(f"checkpoint {directory}: {MANIFEST} does not list {unlisted[0]}, "
                              f"expected one shard file per rank of the {saved_size} that "
                              f"saved it")
    return [directory / rel for rel in rels]


def _check_finite_variables(directory: Path, objects: dict) -> None:
    for name, obj in objects.items():
        for var in getattr(obj, "variables", ()):
            if var.dtype.is_floating and not bool(tf.reduce_all(tf.math.is_finite(var))):
                raise CheckpointError(f"checkpoint {directory}: {name} variable '{var.name}' "
                                      f"restored with a non-finite value (NaN or Inf), "
                                      f"expected finite numbers")


def restore(directory: str | os.PathLike, model, optimizer=None) -> dict:
    """Restores a checkpoint saved with any world size; returns its manifest.

    The model must be built (called once) so its variables exist. Every file is checked
    (checksums, then shard arrays) before any variable or table is changed.

    Raises:
        CheckpointError: The checkpoint is incomplete, damaged, or does not fit the model.
    """
    directory = Path(directory)
    manifest = verify(directory)
    layers = sharded_layers(model)
    shards = {}
    for layer in layers:
        shards[layer.name] = [_load_npz(p) for p in _shard_paths(directory, manifest, layer.name)]
        _check_no_duplicates(directory, layer.name, shards[layer.name])
    objects = {"model": model}
    if optimizer is not None:
        objects["optimizer"] = optimizer
    try:
        tf.train.Checkpoint(**objects).read(str(directory / "dense")).expect_partial()
    except (tf.errors.OpError, ValueError, AssertionError) as err:
        raise CheckpointError(f"checkpoint {directory}: dense weights do not fit this model "
                              f"({type(err).__name__}: {str(err).splitlines()[0][:300]})") from err
    _check_finite_variables(directory, objects)
    for layer in layers:
        try:
            layer.import_shards(shards[layer.name])
        except (KeyError, ValueError, tf.errors.OpError) as err:
            raise CheckpointError(f"checkpoint {directory}: shards of layer '{layer.name}' do "
                                  f"not fit it ({err})") from err
    return manifest


@dataclasses.dataclass(frozen=True)
class Restored:
    """What :func:`restore_latest_good` restored.

    Attributes:
        directory: The checkpoint directory.
        step: Its training step.
        world_size: How many ranks saved it.
        skipped: ``(directory, reason)`` of each newer checkpoint that was passed over.
    """

    directory: Path
    step: int
    world_size: int
    skipped: tuple[tuple[Path, str], ...] = ()


def restore_latest_good(root: str | os.PathLike, model, optimizer=None,
                        agree: bool = True,
                        on_skip: Callable[[Path, str], None] | None = None) -> Restored | None:
    """Restores the newest checkpoint under root that is complete and undamaged.

    Walks back from the newest ``ckpt-<step>``: one without a manifest (a save that never
    finished) or one that fails :func:`restore` (a file missing, truncated or changed,
    arrays of the wrong type, NaN weights) is skipped with a warning naming it and why,
    and the one before is tried.

    Args:
        root: Directory holding the ``ckpt-<step>`` directories.
        model: The built model to restore into.
        optimizer: Optional trackable optimizer(s) saved with it.
        agree: Check over all ranks that every rank restored the same step (a
            collective: every rank must call this then). Off where ranks may not call
            collectives together (e.g. an elastic reset).
        on_skip: Called with (directory, reason) for each checkpoint passed over; by
            default the reason is logged as a warning.

    Returns:
        What was restored, or None when root holds no checkpoint at all.

    Raises:
        CheckpointError: Checkpoints exist but none is good (the message lists each one
            and why), or the ranks restored different steps.
    """
    skipped: list[tuple[Path, str]] = []
    report = on_skip or (lambda d, why: log.warning("skipping checkpoint %s: %s; falling "
                                                    "back to the previous one", d, why))
    found = None
    for directory in reversed(_checkpoint_dirs(Path(root))):
        if not (directory / MANIFEST).is_file():
            why = f"no {MANIFEST} (a save that did not finish)"
        else:
            try:
                manifest = restore(directory, model, optimizer)
            except CheckpointError as err:
                why = str(err)
            else:
                found = Restored(directory, int(manifest["step"]), int(manifest["world_size"]),
                                 tuple(skipped))
                break
        skipped.append((directory, why))
        report(directory, why)
    if agree:
        _check_ranks_agree(root, found)
    if found is None and skipped:
        listing = "; ".join(f"{d.name}: {why}" for d, why in skipped)
        raise CheckpointError(f"no good checkpoint under {root}: {listing}")
    if found is not None and skipped:
        log.warning("restored %s (step %d) after skipping %d newer checkpoint(s)",
                    found.directory, found.step, len(skipped))
    return found


def _check_ranks_agree(root, found: Restored | None) -> None:
    step = -1 if found is None else found.step
    size = distributed.size()
    # Equal sums of x and x**2 over ranks mean every x is equal (x kept small: no overflow).
    small = step % 1_000_003
    total, squares = distributed.sum_over_ranks([small, small * small])
    if total != small * size or squares != small * small * size:
        raise CheckpointError(f"ranks restored different checkpoints from {root} (this rank: "
                              f"step {step}); check that every rank sees the same files")
