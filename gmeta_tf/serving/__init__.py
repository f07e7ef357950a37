"""Serving: trained models exported as SavedModels that stock TensorFlow runs (no op
library), with an optional signature adapting a meta model to a new task."""

from gmeta_tf.serving.saved_model_export import (ADAPT_SIGNATURE, SERVING_SIGNATURE,
                                                 ServingModule, export_pipeline,
                                                 export_saved_model, feature_specs)
from gmeta_tf.serving.static_embedding import FrozenTable, StaticEmbedding

__all__ = [
    "ADAPT_SIGNATURE", "SERVING_SIGNATURE", "FrozenTable", "ServingModule", "StaticEmbedding",
    "export_pipeline", "export_saved_model", "feature_specs",
]
