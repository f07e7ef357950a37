"""Fused sparse optimizers: applied in place, inside the op library, to the rows of the ids
a batch touched, with their slots stored beside each row in the table.

The formulas are Keras's (tf_keras.optimizers) so a hash table and a dense variable given
the same gradients end with the same values. Adam is lazy: a row's moments and bias
correction advance only on steps that touch it, with the global step for correction.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from gmeta_tf.embedding import table_ops


@dataclasses.dataclass(frozen=True)
class SparseOptimizer:
    """Base: hyper-parameters plus the table layout (slots per row) they need."""

    learning_rate: float = 0.01
    name: ClassVar[str] = ""
    num_slots: ClassVar[int] = 0

    def __post_init__(self):
        if not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0):
            raise ValueError(
                f"{type(self).__name__}.learning_rate must be a positive number, "
                f"got {self.learning_rate!r}"
            )

    @property
    def slot_init(self) -> float:
        return 0.0

    def apply(self, handle, ids, grads, step, row_handles=None) -> tf.Tensor:
        """Applies one step to the rows of ids (duplicates summed); returns rows updated.
        ``row_handles``: the lookup's, sparing the probes (optional)."""
        return table_ops.apply_gradients(handle, ids, grads, self.name, self.learning_rate,
                                         step=step, row_handles=row_handles)


@dataclasses.dataclass(frozen=True)
class SGD(SparseOptimizer):
    name: ClassVar[str] = "sgd"
    num_slots: ClassVar[int] = 0


@dataclasses.dataclass(frozen=True)
class Adagrad(SparseOptimizer):
    initial_accumulator_value: float = 0.1
    epsilon: float = 1e-7
    name: ClassVar[str] = "adagrad"
    num_slots: ClassVar[int] = 1

    @property
    def slot_init(self) -> float:
        return self.initial_accumulator_value

    def apply(self, handle, ids, grads, step, row_handles=None) -> tf.Tensor:
        return table_ops.apply_gradients(
            handle, ids, grads, self.name, self.learning_rate, epsilon=self.epsilon, step=step,
            row_handles=row_handles,
        )


@dataclasses.dataclass(frozen=True)
class Adam(SparseOptimizer):
    learning_rate: float = 0.001
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    name: ClassVar[str] = "adam"
    num_slots: ClassVar[int] = 2

    def apply(self, handle, ids, grads, step, row_handles=None) -> tf.Tensor:
        return table_ops.apply_gradients(
            handle,
            ids,
            grads,
            self.name,
            self.learning_rate,
            epsilon=self.epsilon,
            beta1=self.beta_1,
            beta2=self.beta_2,
            step=step,
            row_handles=row_handles,
        )


_BY_NAME = {cls.name: cls for cls in (SGD, Adagrad, Adam)}
#: The optimizers' names, as configs give them.
NAMES = tuple(_BY_NAME)


def get(spec) -> SparseOptimizer:
    """An optimizer from an instance, a name ('adagrad') or a dict {'name': ..., **params}."""
    if isinstance(spec, SparseOptimizer):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if isinstance(spec, dict):
        params = dict(spec)
        name = params.pop("name", None)
        if name not in _BY_NAME:
            raise ValueError(f"sparse optimizer name must be one of {sorted(_BY_NAME)}, got {name!r}")
        return _BY_NAME[name](**params)
    raise TypeError(f"cannot make a sparse optimizer from {spec!r}")
