"""Checks a data file against the manifest before any row of it is used."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq

from gmeta_tf.data import filesystem as fs
from gmeta_tf.data.errors import DAMAGED, DataError, one_line
from gmeta_tf.data.manifest import FileEntry, Manifest, verify_file


def file_schema(path: str, file_format: str) -> pa.Schema:
    """The Arrow schema in a Parquet or ORC footer.

    Raises:
        DataError: The file cannot be opened or is not a valid file of that format.
    """
    try:
        with fs.open_binary(path) as f:
            if file_format == "parquet":
                return pq.read_schema(f)
            return orc.ORCFile(f).schema
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"not a readable {file_format} file: {one_line(e)}{DAMAGED}", file=path) from e


def check_data_file(directory: str, entry: FileEntry, manifest: Manifest,
                    checksum: bool = True) -> str:
    """Verifies presence, size, checksum (optional), row count and schema of one file.

    Returns:
        The file's full path.

    Raises:
        DataError: naming the file and, for schema problems, the column and its type.
    """
    path = verify_file(directory, entry, checksum)
    actual = file_schema(path, manifest.file_format)
    for field in manifest.schema.arrow_schema():
        if field.name not in actual.names:
            raise DataError("column missing from data file", file=path, column=field.name,
                            expected=f"{field.type} as in the manifest")
        got = actual.field(field.name).type
        if got != field.type:
            raise DataError("column type differs from the manifest", file=path,
                            column=field.name, value=str(got), expected=str(field.type))
    return path
