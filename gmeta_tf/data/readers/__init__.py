"""File readers behind one interface (see ``base``)."""

from gmeta_tf.data.readers.base import ColumnReader, ReaderCrashed, make_reader, reader_names

__all__ = ["ColumnReader", "ReaderCrashed", "make_reader", "reader_names"]
