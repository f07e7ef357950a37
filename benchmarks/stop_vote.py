"""What stopping every rank at the same step costs a training step.

    horovodrun -np 2 -H localhost:2 python -m benchmarks.stop_vote [--repeats 8] [--steps 300]
        [--batch 128]

A signal (Ctrl-C, a scheduler's SIGTERM) reaches ranks at different moments or only some
of them, so the ranks of a training loop vote on stopping and stop together
(``gmeta_tf.training.stop_vote``). Four contenders, each the same small dense step (an
MLP of the Criteo pipeline's shape, 429 inputs -> 256 -> 128 -> 64 -> 1, --batch rows a
rank (default 128, the pipeline's), Adam; the smaller the step, the more a fixed cost
per step shows), gradients averaged over the ranks by one grouped all-reduce:

    plain         no vote
    paced         as shipped: ``StopVote.after_step()`` after every step, an all-reduce
                  of its own every k steps, k the steps that take about 0.25 s
    every_step    an all-reduce vote of its own after every step (``distributed.any_rank``)
    in_allreduce  the vote as one number more in the step's gradient all-reduce, its
                  outcome kept in a variable read after every step (tried, not shipped)

Each is traced and warmed up (20 steps) before any timing. A repeat times --steps steps of
each contender, the order rotated between repeats; the figures are the median step time
over the repeats and the paired ratios (median over repeats of the ratio within a repeat).
The last stdout line (rank 0) is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from gmeta_tf import distributed  # noqa: E402
from gmeta_tf.machine import machine  # noqa: E402
from gmeta_tf.training.stop_vote import StopVote  # noqa: E402

INPUTS, UNITS = 429, (256, 128, 64)
CONTENDERS = ("plain", "paced", "every_step", "in_allreduce")
VOTES_TAKEN = [0]  # by the paced contender, in the timed steps


def _plain_allreduce(grads: list) -> list:
    """The gradient all-reduce without the vote (``allreduce_gradients`` before it)."""
    if distributed.size() == 1:
        return grads
    import horovod.tensorflow as hvd

    return hvd.grouped_allreduce(grads, op=hvd.Average)


def _step_function(allreduce):
    model = tf.keras.Sequential([tf.keras.layers.Dense(u, activation="relu") for u in UNITS]
                                + [tf.keras.layers.Dense(1)])
    model.build((None, INPUTS))
    optimizer = tf.keras.optimizers.Adam(1e-3)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = tf.squeeze(model(x), -1)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, logits))
        grads = allreduce(tape.gradient(loss, model.trainable_variables))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def _contender(name: str):
    """One training step of the contender, as the training loop runs it (a callable)."""
    if name == "in_allreduce":
        with tf.init_scope():
            vote, agreed = tf.Variable(0.0, trainable=False), tf.Variable(0.0, trainable=False)

        def carrying(grads):
            if distributed.size() == 1:
                return grads
            import horovod.tensorflow as hvd

            reduced = hvd.grouped_allreduce(grads + [tf.cast(vote, grads[0].dtype)],
                                            op=hvd.Average)
            agreed.assign(tf.cast(reduced[-1] > 0, tf.float32))
            return reduced[:-1]

        step = _step_function(carrying)

        def read_after(x, y):
            loss = step(x, y)
            if agreed.numpy() > 0:
                raise AssertionError("no rank voted to stop")
            return loss
        return read_after
    step = _step_function(_plain_allreduce)
    if name == "plain":
        return step
    if name == "paced":
        votes = StopVote()

        def paced(x, y):
            loss = step(x, y)
            if votes.after_step():
                raise AssertionError("no rank voted to stop")
            VOTES_TAKEN[0] += votes.size > 1 and votes._steps == 0
            return loss
        return paced

    def every_step(x, y):
        loss = step(x, y)
        if distributed.any_rank(False):
            raise AssertionError("no rank voted to stop")
        return loss
    return every_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=128, help="rows a rank per step")
    args = parser.parse_args()
    distributed.init()
    rank, size = distributed.rank(), distributed.size()
    rng = np.random.default_rng(rank)
    x = tf.constant(rng.normal(size=(args.batch, INPUTS)).astype(np.float32))
    y = tf.constant((rng.random(args.batch) < 0.25).astype(np.float32))
    steps = {name: _contender(name) for name in CONTENDERS}
    for step in steps.values():  # traced and warmed up before any timing
        for _ in range(20):
            step(x, y).numpy()
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    VOTES_TAKEN[0] = 0
    for repeat in range(args.repeats):
        turn = repeat % len(CONTENDERS)
        order = CONTENDERS[turn:] + CONTENDERS[:turn]
        for name in order:
            distributed.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = steps[name](x, y)
            loss.numpy()
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    if rank != 0:
        return
    medians = {name: statistics.median(t) for name, t in times.items()}
    ratios = {f"ratio_paired_{name}_vs_plain": statistics.median(
        a / b for a, b in zip(times[name], times["plain"])) for name in CONTENDERS[1:]}
    print(json.dumps({"benchmark": "stop_vote", "ranks": size, "batch_per_rank": args.batch,
                      "steps": args.steps, "repeats": args.repeats,
                      "step_ms_median": {k: round(v, 4) for k, v in medians.items()},
                      "step_ms": {k: [round(v, 4) for v in t] for k, t in times.items()},
                      **{k: round(v, 4) for k, v in ratios.items()},
                      "paced_votes_per_step": round(VOTES_TAKEN[0] / (args.steps * args.repeats),
                                                    4),
                      "machine": machine()}))


if __name__ == "__main__":
    main()
