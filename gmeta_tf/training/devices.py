"""Device placement: hash tables in host memory, the dense tower on this rank's GPU.

With GPUs, each rank sees only the GPU of its local rank (the usual Horovod layout, one
process per GPU); the tower's variables and math go there, while the tables (CPU-only
kernels of the op library) stay in host memory. Horovod then all-reduces the dense
gradients, which live on the GPU, with NCCL when it was built with
``HOROVOD_GPU_OPERATIONS=NCCL`` (the Docker GPU image does so).
"""

from __future__ import annotations

import dataclasses
import logging

import tensorflow as tf

from gmeta_tf import distributed

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Device strings of the tables and of the dense tower."""

    tables: str
    dense: str

    @classmethod
    def cpu(cls) -> "Placement":
        return cls("/CPU:0", "/CPU:0")

    @property
    def uses_gpu(self) -> bool:
        return "GPU" in self.dense


def configure_devices(use_gpu: bool = True) -> Placement:
    """Pins this rank to its local GPU when there is one; returns the placement.

    Must run before TensorFlow initializes its devices (before building any model).
    """
    gpus = tf.config.list_physical_devices("GPU") if use_gpu else []
    if not gpus:
        return Placement.cpu()
    gpu = gpus[distributed.local_rank() % len(gpus)]
    try:
        tf.config.set_visible_devices(gpu, "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as err:  # devices already initialized: keep TF's choice
        log.warning("could not pin GPU %s (%s); using TensorFlow's default", gpu.name, err)
    return Placement("/CPU:0", "/GPU:0")
