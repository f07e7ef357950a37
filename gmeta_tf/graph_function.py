"""How the library's Python steps become TensorFlow graphs: ``tf.function`` without AutoGraph.

The library's traced code (the meta step's inner and outer loops, the baseline's step,
evaluation, the hybrid trainer's phases, the served signatures) has no Python control
flow on tensor values: its loops run over Python ranges and lists (the inner steps, the
roles, the tables) and its branches test Python values, so AutoGraph has nothing to
convert. It still rewrote every function such a step calls, source parse to source
emit, each time a process traced its first step: about half of a MovieLens meta step's
first-call time (``python -m benchmarks.step_tracing`` measures it, with AutoGraph on
beside it). Tensor-valued Python control flow in code traced this way fails at its
trace (``OperatorNotAllowedInGraphError``), never silently: write ``tf.cond`` or
``tf.while_loop`` where a branch depends on a tensor.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

# The setting every graph function of the library is traced with; benchmarks.step_tracing
# sets it to True in the process of its peer contender, nothing else changes it.
AUTOGRAPH = False


def graph_function(fn: Callable | None = None, **options):
    """``tf.function(fn, **options)`` with the library's AutoGraph setting; usable as a
    decorator, bare or with options (``@graph_function(reduce_retracing=True)``)."""
    if fn is None:
        return lambda f: tf.function(f, autograph=AUTOGRAPH, **options)
    return tf.function(fn, autograph=AUTOGRAPH, **options)
