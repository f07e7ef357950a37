"""Meta-learning: MetaModel (MAML, first-order MAML, Reptile), inner loop, evaluation."""

from gmeta_tf.meta.meta_config import ALGORITHMS, MetaConfig
from gmeta_tf.meta.meta_model import MetaModel, single_task_batch
from gmeta_tf.meta.task_adapter import TaskAdapter, resolve_fast_weights
from gmeta_tf.meta.task_batch import RoleBatch, embed_tasks, role_batches, task_rows

__all__ = [
    "ALGORITHMS", "MetaConfig", "MetaModel", "RoleBatch", "TaskAdapter", "embed_tasks",
    "resolve_fast_weights", "role_batches", "single_task_batch", "task_rows",
]
