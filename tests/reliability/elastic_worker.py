"""A rank of the elastic test, run under ``horovodrun --min-np 1 --max-np 2
--host-discovery-script ...`` (or as one plain process for the reference run).

    python -m tests.reliability.elastic_worker OUT_DIR COMMIT_DIR [--hosts-file F]

Trains the sharded-embedding TinyCtrModel on global batches that are a pure function of
the step (each rank takes its contiguous share under the current world size), committing
every COMMIT_EVERY steps. With ``--hosts-file`` rank 0 rewrites the file the discovery
script prints at the steps in PLAN (2 ranks -> 1 -> 2) and every rank waits at that
commit until Horovod resets the job. Each rank appends ``step size rank`` to
OUT_DIR/steps.rank<r>.log as it goes and writes its final shard and dense weights to
OUT_DIR/final.rank<r>-of-<size>.npz.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from gmeta_tf import distributed, elastic
from gmeta_tf.embedding import Adagrad, dense_variables
from tests.embedding.sharded_worker import TinyCtrModel

STEPS, COMMIT_EVERY, GLOBAL_BATCH = 18, 3, 32
PLAN = {6: 1, 12: 2}  # at this committed step, ask the discovery script for that many slots
WAIT_SECONDS = 120


def global_batch(step: int) -> tuple[dict, np.ndarray]:
    """The batch of a step: the same on every rank and in every attempt at the step."""
    rng = np.random.default_rng([7, step])
    pool = np.arange(-400, 400, dtype=np.int64)
    lengths = rng.integers(0, 4, GLOBAL_BATCH)
    g = tf.RaggedTensor.from_row_lengths(rng.choice(pool, int(lengths.sum())), lengths)
    return ({"f1": rng.choice(pool, GLOBAL_BATCH), "f2": rng.choice(pool, (GLOBAL_BATCH, 2)),
             "g": g}, rng.normal(size=GLOBAL_BATCH).astype(np.float32))


def all_ids(steps: int) -> np.ndarray:
    """Every id the batches of steps [0, steps) look up (all tables)."""
    ids = []
    for step in range(steps):
        features, _ = global_batch(step)
        ids += [features["f1"], features["f2"].ravel(), features["g"].flat_values.numpy()]
    return np.unique(np.concatenate(ids))


def local_share(features: dict, labels: np.ndarray) -> tuple[dict, np.ndarray]:
    size, rank = distributed.size(), distributed.rank()
    lo, hi = rank * GLOBAL_BATCH // size, (rank + 1) * GLOBAL_BATCH // size
    return {k: v[lo:hi] for k, v in features.items()}, labels[lo:hi]


def make_step(model, optimizer):
    @tf.function(reduce_retracing=True)
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features, training=True) - labels))
        dense = dense_variables(model)
        grads = tape.gradient(loss, dense + model.embedding.trainable_variables)
        optimizer.apply_gradients(zip(distributed.allreduce_gradients(grads[:len(dense)]), dense))
        return loss

    return step


def build_without_collectives(model: TinyCtrModel) -> None:
    """Creates the variables from shapes: calling the model would run an all-to-all, and a
    rank that joins later runs this alone, before the elastic state syncs it."""
    model.embedding.build(None)
    model.hidden.build([None, 4 + 2 * 4 + 3])  # f1, f2 (two ids), mean of g
    model.out.build([None, 8])


def wait_for_reset(state: elastic.ShardedModelState) -> None:
    """Every rank polls for the host change until Horovod raises to reset the job."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.5)
        state.check_host_updates()
    raise RuntimeError(f"no host change reached the job within {WAIT_SECONDS}s")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("commit_dir", type=Path)
    parser.add_argument("--hosts-file", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    faulthandler.dump_traceback_later(240, exit=False)  # where a hang sits
    distributed.init()
    tf.keras.utils.set_random_seed(0)
    model = TinyCtrModel(Adagrad(0.1))
    optimizer = tf.keras.optimizers.Adagrad(0.1)
    build_without_collectives(model)
    state = elastic.ShardedModelState(model, optimizer, args.commit_dir)

    @elastic.run
    def train(state: elastic.ShardedModelState) -> None:
        step_fn = make_step(model, optimizer)
        size, rank = distributed.size(), distributed.rank()
        log = open(args.out_dir / f"steps.rank{os.environ.get('HOROVOD_RANK', 0)}.log", "a")
        while state.step < STEPS:
            step_fn(*local_share(*global_batch(state.step)))
            state.step += 1
            log.write(f"{state.step} {size} {rank}\n")
            log.flush()
            if state.step % COMMIT_EVERY == 0:
                state.commit()
                wanted = PLAN.get(state.step)
                if args.hosts_file and wanted and wanted != size:
                    if rank == 0:
                        args.hosts_file.write_text(f"localhost:{wanted}\n")
                    wait_for_reset(state)

    train(state)
    arrays = {f"dense/{i}": v.numpy() for i, v in enumerate(dense_variables(model))}
    for table, snap in model.embedding.export_shards().items():
        for field, value in snap.items():
            arrays[f"table/{table}/{field}"] = value
    np.savez(args.out_dir / f"final.rank{distributed.rank()}-of-{distributed.size()}.npz",
             resets=np.array(state.resets), **arrays)


if __name__ == "__main__":
    main(sys.argv[1:])
