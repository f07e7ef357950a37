"""Meta-learning: MetaModel (MAML, first-order MAML, Reptile), inner loop, evaluation."""

from gmeta_tf.meta.evaluation import (EvaluationReport, evaluate_tasks, fine_tuned_adaptation,
                                     fine_tuned_predictions, query_predictions)
from gmeta_tf.meta.meta_config import ALGORITHMS, MetaConfig
from gmeta_tf.meta.meta_model import MetaModel, single_task_batch
from gmeta_tf.meta.task_adapter import (AdaptedQuery, TaskAdapter, adapted_outputs, adapted_query,
                                        resolve_fast_weights)
from gmeta_tf.meta.task_batch import RoleBatch, embed_tasks, role_batches, task_rows

__all__ = [
    "ALGORITHMS", "AdaptedQuery", "EvaluationReport", "MetaConfig", "MetaModel", "RoleBatch",
    "TaskAdapter", "adapted_outputs", "adapted_query", "embed_tasks", "evaluate_tasks",
    "fine_tuned_adaptation", "fine_tuned_predictions", "query_predictions",
    "resolve_fast_weights", "role_batches", "single_task_batch", "task_rows",
]
