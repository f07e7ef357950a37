"""Converters from raw data to the task-partitioned format (all streaming, all atomic)."""

from gmeta_tf.data.converters.criteo import convert_criteo
from gmeta_tf.data.converters.csv_mapping import CsvMapping, convert_csv
from gmeta_tf.data.converters.movielens import convert_movielens
from gmeta_tf.data.converters.pipeline import OutputConfig

__all__ = ["CsvMapping", "OutputConfig", "convert_criteo", "convert_csv", "convert_movielens"]
