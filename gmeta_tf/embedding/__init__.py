"""Hash-based sparse embeddings: tables, the Keras layer, fused sparse optimizers."""

from gmeta_tf.embedding.hash_embedding import HashEmbedding
from gmeta_tf.embedding.hash_table import HashTable
from gmeta_tf.embedding.sparse_optimizers import SGD, Adagrad, Adam, SparseOptimizer

__all__ = ["HashEmbedding", "HashTable", "SGD", "Adagrad", "Adam", "SparseOptimizer"]
