"""One interface over every file reader: read a row range of some columns as numpy chunks.

A reader knows nothing about tasks; ``TaskBatcher`` turns its chunks into task batches.
Readers are picked by name:

* ``"arrow"`` (the default, ``"auto"``): pyarrow, Parquet by row group and ORC by stripe.
  Fastest and sound for both formats.
* ``"tfio_iotensor"``: tensorflow-io ``IOTensor.from_parquet`` sliced column by column.
  Parquet only (tensorflow-io has no ORC IOTensor).
* ``"tfio_dataset"``: tensorflow-io ``IODataset.from_parquet`` / ``from_orc``, one row at a
  time. Its ORC path crashes the process on files above ~1,000 rows (tensorflow/io#1782),
  so it runs in a child process and a crash becomes a ``ReaderCrashed`` error.
"""

from __future__ import annotations

import abc
from typing import Iterator

import numpy as np

from gmeta_tf.data.errors import DataError

Chunk = dict[str, np.ndarray]
CHUNK_ROWS = 1 << 16


class ReaderCrashed(DataError):
    """A guarded reader's child process died (for example tensorflow-io's ORC segfault)."""


class ColumnReader(abc.ABC):
    """Reads row ranges of named columns from one file format."""

    name: str = ""
    formats: tuple[str, ...] = ()

    def __init__(self, file_format: str) -> None:
        if file_format not in self.formats:
            raise DataError(f"reader {self.name!r} cannot read {file_format} files",
                            value=file_format, expected=f"one of {self.formats}")
        self.file_format = file_format

    @abc.abstractmethod
    def read(self, path: str, start: int, stop: int, columns: list[str]) -> Iterator[Chunk]:
        """Yields consecutive chunks covering rows ``[start, stop)`` of ``path``.

        Each chunk maps every requested column to a 1-D numpy array of equal length.
        """

    def close(self) -> None:  # noqa: B027 (a reader that caches no handle keeps this no-op)
        """Releases cached file handles."""


def reader_names() -> tuple[str, ...]:
    return ("auto", "arrow", "tfio_iotensor", "tfio_dataset")


def make_reader(name: str, file_format: str) -> ColumnReader:
    """The reader called ``name`` for ``file_format``; "auto" is the fastest sound one."""
    from gmeta_tf.data.readers.arrow import ArrowReader
    from gmeta_tf.data.readers.tfio import TfioDatasetReader, TfioIOTensorReader

    readers = {"auto": ArrowReader, "arrow": ArrowReader, "tfio_iotensor": TfioIOTensorReader,
               "tfio_dataset": TfioDatasetReader}
    if name not in readers:
        raise DataError("unknown reader", value=name, expected=f"one of {reader_names()}")
    return readers[name](file_format)
