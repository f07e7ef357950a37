"""Where the embedding step of benchmarks/embedding_step.py goes, phase by phase.

The step of that benchmark (batch 65536 x 26 Zipf(1.1) ids, dim 16, Adagrad) taken apart
into its ops, each phase in a tf.function of its own run to completion before the next
starts, on the same batches in the same order (so the table grows as it does there):

  dedup      ops.dedup of the batch's raw ids
  lookup     lookup-or-insert of the unique ids (with counts and step)
  gather     the unique rows expanded to the batch layout
  loss       the loss and its gradient with respect to the expanded rows
  fold       the row gradients summed per unique id (the gather's gradient)
  apply      the fused Adagrad step on the unique rows

The phases' sum is close to, not equal to, the fused step (which overlaps nothing either,
but pays one function call instead of six). Figures are medians over --steps steps after
one warm-up step, in milliseconds: wall time (``<phase>_ms``) and the process's CPU time,
all threads together (``<phase>_cpu_ms``), which other load on the machine moves less.

Usage: python -m benchmarks.embedding_profile [--steps N] [--batch-size B] [--seed S]
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from benchmarks.embedding_batches import BatchSpec, make_batch

FEATURES = 26
DIM = 16
LEARNING_RATE = 0.05
PHASES = ("dedup", "lookup", "gather", "loss", "fold", "apply")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.embedding_profile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=65536)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="TensorFlow's intra-op pool size (0: its default, one per core); "
                             "1 measures the work alone, without parallelism")
    args = parser.parse_args(argv)

    import tensorflow as tf

    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)

    from gmeta_tf import ops
    from gmeta_tf.embedding import Adagrad, HashTable

    table = HashTable(DIM, optimizer=Adagrad(learning_rate=LEARNING_RATE), seed=args.seed)
    spec = BatchSpec(args.batch_size, FEATURES, args.seed)

    @tf.function
    def dedup(ids):
        return ops.dedup(tf.reshape(ids, [-1]))

    # The layer's lookup returns row handles that its update takes back (no second probe).
    with_handles = hasattr(table, "lookup_for_update")

    @tf.function
    def lookup(unique_ids, counts, step):
        if with_handles:
            return tuple(table.lookup_for_update(unique_ids, step=step, counts=counts))
        return table.lookup_or_insert(unique_ids, step=step, counts=counts), tf.zeros([0], tf.int64)

    @tf.function
    def gather(rows, inverse):
        return ops.gather_rows(rows, inverse)

    @tf.function
    def loss_grad(emb):
        with tf.GradientTape() as tape:
            tape.watch(emb)
            shaped = tf.reshape(emb, [args.batch_size, FEATURES, DIM])
            loss = tf.reduce_mean(tf.square(tf.reduce_sum(shaped, axis=[1, 2]) - 1.0))
        return tape.gradient(loss, emb)

    @tf.function
    def fold(d_emb, inverse, num_rows):
        return ops.scatter_add_rows(d_emb, inverse, num_rows)

    @tf.function
    def apply(unique_ids, d_rows, step, handles):
        if with_handles:
            return table.apply_gradients(unique_ids, d_rows, step=step, row_handles=handles)
        return table.apply_gradients(unique_ids, d_rows, step=step)

    cpu = {}

    def timed(fn, *a):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn(*a)
        for t in tf.nest.flatten(out):
            t.numpy()  # waits for the phase to finish
        cpu[fn] = time.process_time() - start_cpu
        return out, time.perf_counter() - start

    records = []
    for step in range(1 + args.steps):
        ids = tf.constant(make_batch(spec, step))
        t = {}
        d, t["dedup"] = timed(dedup, ids)
        s = tf.constant(step + 1, tf.int64)
        (rows, handles), t["lookup"] = timed(lookup, d.unique_ids, d.counts, s)
        emb, t["gather"] = timed(gather, rows, d.inverse)
        d_emb, t["loss"] = timed(loss_grad, emb)
        d_rows, t["fold"] = timed(fold, d_emb, d.inverse, tf.shape(rows)[0])
        _, t["apply"] = timed(apply, d.unique_ids, d_rows, s, handles)
        for phase, fn in zip(PHASES, (dedup, lookup, gather, loss_grad, fold, apply)):
            t[f"{phase}_cpu"] = cpu[fn]
        t["unique"] = int(d.unique_ids.shape[0])
        records.append(t)
        print(f"step {step}: " + ", ".join(f"{k} {1e3 * t[k]:.1f}ms" for k in PHASES),
              file=sys.stderr, flush=True)
    timed_records = records[1:]
    summary = {"benchmark": "embedding_profile", "batch": args.batch_size,
               "intra_op_threads": args.intra_op_threads,
               "features": FEATURES, "dim": DIM, "steps": args.steps,
               "unique_ids_per_step_median": statistics.median(r["unique"] for r in timed_records),
               "loadavg_1min": os.getloadavg()[0]}
    for phase in PHASES:
        for key in (phase, f"{phase}_cpu"):
            summary[f"{key}_ms"] = round(1e3 * statistics.median(r[key] for r in timed_records), 1)
    summary["total_ms"] = round(sum(summary[f"{p}_ms"] for p in PHASES), 1)
    summary["total_cpu_ms"] = round(sum(summary[f"{p}_cpu_ms"] for p in PHASES), 1)
    summary["table_size"] = int(table.size())
    print("wall " + " ".join(f"{p} {summary[f'{p}_ms']}" for p in PHASES)
          + f" total {summary['total_ms']} ms")
    print("cpu  " + " ".join(f"{p} {summary[f'{p}_cpu_ms']}" for p in PHASES)
          + f" total {summary['total_cpu_ms']} ms")
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main(sys.argv[1:]))
