"""The manifest of a task-partitioned dataset: schema, files with their counts, split record.

A dataset directory looks like::

    out_dir/
      manifest.json
      warm/part-00000.parquet ...   (or .orc)
      cold/part-00000.parquet ...

``manifest.json`` holds the schema (feature names, kinds, dims, label ranges), the file
format, the cold-start split that produced the data (seed and parameters, task counts and
how many tasks were dropped and why) and, per file: its split, row and task counts, its
size and SHA-256, and its blocks. A block is a run of whole tasks (one Parquet row group);
blocks are the unit that ranks share out, so no task is ever split between ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from gmeta_tf.data import filesystem as fs
from gmeta_tf.data.errors import DAMAGED, DataError
from gmeta_tf.data.schema import Schema

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "gmeta-tasks"
FORMAT_VERSION = 1
FILE_FORMATS = ("parquet", "orc")


@dataclasses.dataclass
class FileEntry:
    """One data file of the dataset.

    Attributes:
        path: Path relative to the dataset directory.
        split: The split the file belongs to ("warm" or "cold").
        rows: Number of rows.
        tasks: Number of (whole) tasks.
        bytes: File size.
        sha256: Hex SHA-256 of the file's bytes.
        blocks: ``[rows, tasks]`` per block, in file order.
    """

    path: str
    split: str
    rows: int
    tasks: int
    bytes: int
    sha256: str
    blocks: list[list[int]]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FileEntry":
        """Reads one entry of the manifest's ``files``, checking every field's type.

        Raises:
            DataError: A field is missing or has the wrong type or a negative count.
        """
        entry = cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})
        for name in ("path", "split", "sha256"):
            if not isinstance(getattr(entry, name), str) or not getattr(entry, name):
                raise DataError(f"manifest entry field {name!r} is not allowed",
                                value=getattr(entry, name), expected="a non-empty string")
        for name in ("rows", "tasks", "bytes"):
            if not _is_count(getattr(entry, name)):
                raise DataError(f"manifest entry {entry.path!r} field {name!r} is not allowed",
                                value=getattr(entry, name), expected="an integer >= 0")
        if not isinstance(entry.blocks, list) or not all(
                isinstance(b, list) and len(b) == 2 and all(map(_is_count, b))
                for b in entry.blocks):
            raise DataError(f"manifest entry {entry.path!r} field 'blocks' is not allowed",
                            value=entry.blocks, expected="a list of [rows, tasks] integer pairs")
        return entry


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclasses.dataclass
class Manifest:
    """Everything a reader needs to know about a dataset before opening a data file."""

    schema: Schema
    file_format: str
    files: list[FileEntry]
    split: dict[str, Any]

    def files_of(self, split: str | None) -> list[FileEntry]:
        """The files of one split ("warm", "cold"), or all files for None."""
        known = sorted({f.split for f in self.files})
        if split is not None and split not in known:
            raise DataError(f"no split {split!r} in dataset", expected=f"one of {known}")
        return [f for f in self.files if split is None or f.split == split]

    def per_split(self) -> dict[str, dict[str, int]]:
        """Per split, in file order: its ``files``, ``rows``, ``tasks`` and ``blocks``."""
        counts: dict[str, dict[str, int]] = {}
        for f in self.files:
            c = counts.setdefault(f.split, {"files": 0, "rows": 0, "tasks": 0, "blocks": 0})
            c["files"] += 1
            c["rows"] += f.rows
            c["tasks"] += f.tasks
            c["blocks"] += len(f.blocks)
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "file_format": self.file_format,
            "schema": self.schema.to_list(),
            "split": self.split,
            "files": [dataclasses.asdict(f) for f in self.files],
        }

    def save(self, directory: str) -> None:
        with open(fs.join(directory, MANIFEST_NAME), "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, directory: str) -> "Manifest":
        """Reads ``directory/manifest.json``.

        Raises:
            DataError: The manifest is missing, not JSON, or not a gmeta-tasks manifest.
        """
        path = fs.join(directory, MANIFEST_NAME)
        if not fs.exists(path):
            raise DataError("no manifest: not a gmeta-tasks dataset directory (a pipeline's "
                            "dataset is made by gmeta data prepare, or by gmeta train)",
                            file=path)
        try:
            with fs.open_binary(path) as f:
                d = json.loads(f.read())
            if d.get("format") != FORMAT_NAME:
                raise DataError("not a gmeta-tasks manifest", file=path, value=d.get("format"),
                                expected=repr(FORMAT_NAME))
            if d["file_format"] not in FILE_FORMATS:
                raise DataError("unknown file format", file=path, value=d["file_format"],
                                expected=f"one of {FILE_FORMATS}")
            return cls(Schema.from_list(d["schema"]), d["file_format"],
                       [FileEntry.from_dict(e) for e in d["files"]], d.get("split", {}))
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            if isinstance(e, DataError):
                if e.file is None:  # raised while parsing: name the manifest
                    raise DataError(str(e), file=path) from e
                raise
            raise DataError(f"malformed manifest: {e!r}", file=path) from e


def sha256_of(path: str, chunk_bytes: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with fs.open_binary(path) as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def verify_file(directory: str, entry: FileEntry, checksum: bool) -> str:
    """Checks that a data file exists, has its recorded size and (optionally) checksum.

    Returns:
        The file's full path.

    Raises:
        DataError: The file is missing, truncated/extended, or its bytes changed.
    """
    path = fs.join(directory, entry.path)
    if not fs.exists(path):
        raise DataError("data file listed in the manifest is missing" + DAMAGED, file=path)
    actual = fs.size(path)
    if actual != entry.bytes:
        raise DataError("file size differs from the manifest (truncated or replaced?)" + DAMAGED,
                        file=path, value=actual, expected=f"{entry.bytes} bytes")
    if checksum:
        digest = sha256_of(path)
        if digest != entry.sha256:
            raise DataError("checksum mismatch: file is corrupt or was modified" + DAMAGED, file=path,
                            value=digest[:16], expected=f"sha256 {entry.sha256[:16]}...")
    return path
