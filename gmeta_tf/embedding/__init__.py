"""Hash-based sparse embeddings: one table type (with an optional MixCache of hot rows
inside), the Keras layer over tables sharded by all-to-all (one process is world size
1), fused sparse optimizers."""

from gmeta_tf.embedding.config import FeatureConfig, MixCacheConfig, TableConfig
from gmeta_tf.embedding.hash_table import HashTable
from gmeta_tf.embedding.sharded_hash_embedding import (
    HashEmbedding,
    PulledRows,
    ShardedHashEmbedding,
)
from gmeta_tf.embedding.sparse_optimizers import SGD, Adagrad, Adam, SparseOptimizer
from gmeta_tf.embedding.update_trigger import dense_variables, embedding_triggers

__all__ = [
    "HashEmbedding", "HashTable", "ShardedHashEmbedding", "TableConfig", "FeatureConfig", "MixCacheConfig",
    "SGD", "Adagrad", "Adam", "SparseOptimizer", "dense_variables", "embedding_triggers",
    "PulledRows",
]
