"""Towers (MeLU, DLRM/DeepFM), heads, and the plain (non-meta) CTR model."""

from gmeta_tf.models.ctr_model import CTRModel
from gmeta_tf.models.dlrm_tower import DLRMTower
from gmeta_tf.models.embedding_inputs import embedding_inputs
from gmeta_tf.models.ensemble_tower import EnsembleTower
from gmeta_tf.models.heads import BinaryHead, Head, RatingHead, make_head
from gmeta_tf.models.label_prior import LabelPrior
from gmeta_tf.models.melu_tower import MeLUTower
from gmeta_tf.models.tower import Tower

__all__ = [
    "BinaryHead", "CTRModel", "DLRMTower", "EnsembleTower", "Head", "LabelPrior", "MeLUTower",
    "RatingHead", "Tower", "embedding_inputs", "make_head",
]
