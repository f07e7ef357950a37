"""Hash-based sparse embeddings: tables, Keras layers (single process and sharded by
all-to-all), fused sparse optimizers."""

from gmeta_tf.embedding.config import FeatureConfig, TableConfig
from gmeta_tf.embedding.hash_embedding import HashEmbedding
from gmeta_tf.embedding.hash_table import HashTable
from gmeta_tf.embedding.mix_cache import MixCacheConfig, MixCachedHashTable
from gmeta_tf.embedding.sharded_hash_embedding import PulledRows, ShardedHashEmbedding
from gmeta_tf.embedding.sparse_optimizers import SGD, Adagrad, Adam, SparseOptimizer
from gmeta_tf.embedding.update_trigger import dense_variables, embedding_triggers

__all__ = [
    "HashEmbedding", "HashTable", "ShardedHashEmbedding", "TableConfig", "FeatureConfig",
    "SGD", "Adagrad", "Adam", "SparseOptimizer", "dense_variables", "embedding_triggers",
    "MixCacheConfig", "MixCachedHashTable", "PulledRows",
]
