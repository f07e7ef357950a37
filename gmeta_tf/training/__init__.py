"""Training, evaluation and dataset preparation of a pipeline config (``gmeta train``,
``gmeta eval``, ``gmeta data prepare``)."""

from gmeta_tf.training.dataset_prep import prepare_dataset
from gmeta_tf.training.devices import Placement, configure_devices
from gmeta_tf.training.evaluation import comparison, comparison_dict, format_table
from gmeta_tf.training.model_builder import Models, build_models
from gmeta_tf.training.trainer import TrainResult, Trainer

__all__ = [
    "Models", "Placement", "TrainResult", "Trainer", "build_models", "comparison",
    "comparison_dict", "configure_devices", "format_table", "prepare_dataset",
]
