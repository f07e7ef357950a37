"""Contender: TensorFlow Recommenders-Addons 0.8.1 dynamic embedding (runs in .venv-peers).

`de.keras.layers.Embedding(dim)` (its default cuckoo hash table on CPU, default
RandomNormal initializer, `with_unique=True`) trained by `de.DynamicEmbeddingOptimizer`
around an Adagrad optimizer, in one `tf.function` per step, as TFRA's own Keras examples do.

Two Adagrads can be wrapped, chosen with --optimizer:
  keras   `tf.keras.optimizers.Adagrad` (tf-keras 2.16's current optimizer). The wrapper
          creates its accumulator slot with zeros for new ids, not Keras's 0.1, so a new
          id's first update is a full lr-sized step.
  legacy  `tf.keras.optimizers.legacy.Adagrad`: the accumulator of new ids starts at 0.1
          as Adagrad specifies, and the step is faster.
The benchmark runs both and compares against the faster one.

Needs .venv-peers (bash benchmarks/peers/setup_peers.sh); alone:
`.venv-peers/bin/python -m benchmarks.peers.tfra_step --optimizer legacy --batch-size 4096
--features 26 --dim 16 --learning-rate 0.05 --seed 0 --steps 5`.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

from benchmarks.peers.step_worker import StepConfig, Unavailable, worker_main

OPTIMIZERS = ("keras", "legacy")


class TfraEmbedding:
    def __init__(self, config: StepConfig, optimizer: str) -> None:
        from tensorflow_recommenders_addons import dynamic_embedding as de

        self.layer = de.keras.layers.Embedding(
            config.dim,
            initializer=tf.keras.initializers.RandomNormal(stddev=0.05, seed=config.seed),
            name="tfra_embedding",
        )
        adagrad = (
            tf.keras.optimizers.legacy.Adagrad
            if optimizer == "legacy"
            else tf.keras.optimizers.Adagrad
        )
        self.optimizer = de.DynamicEmbeddingOptimizer(adagrad(learning_rate=config.learning_rate))

    @tf.function
    def step(self, ids: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            emb = self.layer(ids)
            loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, axis=[1, 2]) - 1.0))
        variables = self.layer.trainable_variables
        grads = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(grads, variables))
        return loss

    def table_size(self) -> int:
        return int(self.layer.params.size())


def _pop_optimizer(argv: list[str]) -> tuple[str, list[str]]:
    if "--optimizer" not in argv:
        return "legacy", argv
    at = argv.index("--optimizer")
    choice = argv[at + 1] if at + 1 < len(argv) else ""
    if choice not in OPTIMIZERS:
        raise SystemExit(f"tfra_step: --optimizer {choice!r}: expected one of {OPTIMIZERS}")
    return choice, argv[:at] + argv[at + 2:]


def main(argv: list[str]) -> int:
    optimizer, rest = _pop_optimizer(argv)

    def build(config: StepConfig) -> tuple[TfraEmbedding, dict]:
        try:
            import tensorflow_recommenders_addons as tfra
        except ImportError as exc:
            raise Unavailable(
                f"tensorflow_recommenders_addons does not import ({exc}); "
                "run: bash benchmarks/peers/setup_peers.sh"
            ) from exc
        info = {
            "tensorflow": tf.__version__,
            "tfra": tfra.__version__,
            "tfra_optimizer": optimizer,
        }
        return TfraEmbedding(config, optimizer), info

    return worker_main(f"tfra_{optimizer}", build, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
