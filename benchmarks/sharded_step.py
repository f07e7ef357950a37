"""Sharded embedding step at 1 and 2 ranks, and the bytes its all-to-alls move.

    horovodrun -np 2 -H localhost:2 python -m benchmarks.sharded_step [--quick]
        [--vsi-vs-raw REPEATS]

Each rank trains ShardedHashEmbedding (one table, dim 16, Adagrad 0.05) on its own batch of
the embedding-step benchmark (65,536 rows x 26 Zipf(1.1) features; loss = MSE of the sum
of all embeddings against 1). Rank 0 first measures the same step in a plain single
process (size 1, no collectives). Then, on that Zipf batch and on a 4,096-row batch of
the Criteo sample, it reports the all-to-all bytes of one step:

- vsi: what the exchanges really sent (counted by gmeta_tf.distributed): unique ids (plus
  a per-table header and their occurrence counts, packed two per int64), rows back,
  gradients back, plus the splits;
- raw: every id occurrence sent with its row and its gradient (no dedup), plus splits;
- min: each rank's unique ids once (8 bytes) plus their row and gradient once (4 x dim
  bytes each), plus splits; min_global does the same over the union of the ranks' batches.

The last line is JSON with samples_per_s_{1,2}_ranks, a2a_bytes_vsi, a2a_bytes_raw,
a2a_bytes_min and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from benchmarks.embedding_batches import BatchSpec, make_batch
from gmeta_tf import distributed, ops
from gmeta_tf.embedding import Adagrad, FeatureConfig, ShardedHashEmbedding, TableConfig

DIM = 16
CRITEO_TRAIN = Path(__file__).resolve().parents[1].parent / "shared/data/criteo/train.tsv"


def make_layer() -> ShardedHashEmbedding:
    return ShardedHashEmbedding([TableConfig("ids", DIM, optimizer=Adagrad(0.05))],
                                [FeatureConfig("ids", "ids")])


def make_step(layer):
    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            emb = layer({"ids": ids})["ids"]
            loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, axis=[1, 2]) - 1.0))
        tape.gradient(loss, layer.trainable_variables)
        return loss

    return step


def make_raw_step(layer):
    """The same step with raw ids on the wire (no Virtual Sparse Id): every id occurrence
    goes to its owner, which looks each one up and sends a row back per occurrence; the
    backward sends a gradient per occurrence, applied on the owner. The same table op,
    optimizer, loss and collectives as ``make_step``; only the dedup is missing."""
    shard, size = layer.shards["ids"], layer.world_size

    @tf.function
    def step(ids):
        flat = tf.reshape(ids, [-1])
        owner = tf.cast(ops.partition_of(flat, size), tf.int32)
        order = tf.argsort(owner, stable=True)
        splits = tf.math.bincount(owner, minlength=size, maxlength=size)
        asked, asked_splits = distributed.alltoall(tf.gather(flat, order), splits)
        rows = shard.lookup_or_insert(asked, step=layer.step.assign_add(1))
        back, _ = distributed.alltoall(tf.reshape(rows, [-1]), asked_splits * DIM,
                                       kind="alltoall_grad")  # no autodiff through it
        emb = tf.scatter_nd(order[:, None], tf.reshape(back, [-1, DIM]), [tf.size(flat), DIM])
        with tf.GradientTape() as tape:
            tape.watch(emb)
            summed = tf.reduce_sum(tf.reshape(emb, [tf.shape(ids)[0], -1]), axis=1)
            loss = tf.reduce_mean(tf.square(summed - 1.0))
        grads = tf.gather(tape.gradient(loss, emb), order)
        received, _ = distributed.alltoall(tf.reshape(grads, [-1]), splits * DIM,
                                           kind="alltoall_grad")
        shard.apply_gradients(asked, tf.reshape(received, [-1, DIM]) * layer.gradient_scale,
                              step=layer.step)
        return loss

    return step


def paired_vsi_vs_raw(spec: BatchSpec, steps: int, repeats: int) -> dict:
    """samples/s of the VSI step and the raw-id step: each built once and traced on a
    warm-up batch, then timed in every repeat on that repeat's fresh batches (the same for
    both, order alternating); the paired ratio is the median of the within-repeat ratios."""
    rates = {"vsi": [], "raw": []}
    made = {}
    for name in rates:  # each built once and traced on the warm-up batch
        layer = make_layer()
        layer.build(None)
        made[name] = (make_step if name == "vsi" else make_raw_step)(layer)
        made[name](tf.constant(rank_batch(spec, 0)))
    for rep in range(repeats):
        # Fresh batches each repeat, the same for both contenders.
        batches = [tf.constant(rank_batch(spec, 1 + rep * steps + i)) for i in range(steps)]
        for name in (("vsi", "raw") if rep % 2 == 0 else ("raw", "vsi")):
            step = made[name]
            distributed.barrier()
            start = time.perf_counter()
            for ids in batches:
                step(ids).numpy()
            distributed.barrier()
            elapsed = time.perf_counter() - start
            rates[name].append(distributed.size() * spec.batch_size * steps / elapsed)
            if distributed.is_chief():
                print(f"rep {rep} {name}: {rates[name][-1]:,.0f} samples/s", flush=True)
    return {"samples_per_s_vsi": round(statistics.median(rates["vsi"])),
            "samples_per_s_raw": round(statistics.median(rates["raw"])),
            "vsi_vs_raw": round(statistics.median(v / r for v, r in zip(rates["vsi"],
                                                                          rates["raw"])), 3),
            "samples_per_s_all_repeats": {k: [round(x) for x in v] for k, v in rates.items()}}


def rank_batch(spec: BatchSpec, step: int) -> np.ndarray:
    """Each rank its own batch of the benchmark; step 0 is the warm-up."""
    return make_batch(spec, step * distributed.size() + distributed.rank())


def timed_steps(spec: BatchSpec, steps: int) -> list[float]:
    layer = make_layer()
    step = make_step(layer)
    step(tf.constant(rank_batch(spec, 0)))  # warm-up: tracing, first growth
    times = []
    for i in range(1, steps + 1):
        ids = tf.constant(rank_batch(spec, i))
        distributed.barrier()
        start = time.perf_counter()
        step(ids).numpy()
        distributed.barrier()
        times.append(time.perf_counter() - start)
    return times


def step_bytes(ids: np.ndarray) -> dict[str, int]:
    """All-to-all bytes of one training step on ids (this rank's batch), summed over ranks."""
    layer = make_layer()
    step = make_step(layer)
    before = distributed.collective_counts()
    step(tf.constant(ids))
    after = distributed.collective_counts()
    size = distributed.size()
    splits = 3 * size * 4  # three exchanges, each sending one int32 split per rank
    n_raw, n_unique = ids.size, np.unique(ids).size
    sent = (after["alltoall_bytes"] - before["alltoall_bytes"]
            + after["alltoall_grad_bytes"] - before["alltoall_grad_bytes"])
    local = [sent + splits,
             n_raw * (8 + 8 * DIM) + splits,
             n_unique * (8 + 8 * DIM) + splits]
    vsi, raw, minimum = (int(v) for v in distributed.sum_over_ranks(local))
    return {"vsi": vsi, "raw": raw, "min": minimum,
            "raw_ids": int(distributed.sum_over_ranks([n_raw])[0])}


def global_unique(batches: list[np.ndarray]) -> int:
    return int(np.unique(np.concatenate([b.ravel() for b in batches])).size)


def criteo_batch(rows: int) -> np.ndarray | None:
    """This rank's `rows` rows of the Criteo sample: 26 categorical columns hashed to ids."""
    if not CRITEO_TRAIN.is_file():
        return None
    start = distributed.rank() * rows
    lines = CRITEO_TRAIN.read_text().splitlines()[start:start + rows]
    cats = [[f"C{j}={v}" for j, v in enumerate(line.split("\t")[14:40], start=1)]
            for line in lines]
    hashed = tf.strings.to_hash_bucket_fast(tf.constant(cats), 2**63 - 1)
    return hashed.numpy().astype(np.int64)


def bytes_report(name: str, ids: np.ndarray) -> dict:
    b = step_bytes(ids)
    u_global = global_unique([distributed.allgather(ids)])
    min_global = u_global * (8 + 8 * DIM) + 3 * distributed.size() * 4 * distributed.size()
    return {
        f"{name}_ids": b["raw_ids"], f"{name}_unique_global": u_global,
        f"{name}_a2a_bytes_vsi": b["vsi"], f"{name}_a2a_bytes_raw": b["raw"],
        f"{name}_a2a_bytes_min": b["min"], f"{name}_a2a_bytes_min_global": min_global,
        f"{name}_vsi_over_min": round(b["vsi"] / b["min"], 4),
        f"{name}_raw_over_vsi": round(b["raw"] / b["vsi"], 3),
        f"{name}_raw_over_min": round(b["raw"] / b["min"], 3),
    }


def single_process_figure(args) -> float:
    """samples/s of the same step as a plain single process (rank 0 launches it)."""
    command = [sys.executable, "-m", "benchmarks.sharded_step", "--single",
               "--steps", str(args.steps), "--batch-size", str(args.batch_size)]
    # A plain process: none of horovodrun's rank variables may leak into it.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD", "OMPI", "PMI"))}
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env,
                         cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batch, 3 steps")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=65536)
    parser.add_argument("--criteo-rows", type=int, default=4096)
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--vsi-vs-raw", type=int, metavar="REPEATS", default=0,
                        help="only time the VSI step against the raw-id step, paired over "
                             "REPEATS repeats (what benchmarks.cluster runs)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.batch_size, args.criteo_rows = 3, 4096, 512
    distributed.init()
    spec = BatchSpec(batch_size=args.batch_size)
    if args.vsi_vs_raw:
        report = {"benchmark": "sharded_step", "ranks": distributed.size(),
                  "batch_per_rank": args.batch_size, "steps": args.steps,
                  "repeats": args.vsi_vs_raw, **paired_vsi_vs_raw(spec, args.steps,
                                                                 args.vsi_vs_raw)}
        if distributed.is_chief():
            print(json.dumps(report), flush=True)
        return
    if args.single:
        times = timed_steps(spec, args.steps)
        print(json.dumps({"samples_per_s": args.batch_size / statistics.median(times)}))
        return
    size = distributed.size()
    report = {"benchmark": "sharded_step", "ranks": size, "batch_per_rank": args.batch_size,
              "features": spec.features, "dim": DIM, "steps": args.steps}
    if size > 1:
        if distributed.is_chief():
            report["samples_per_s_1_rank"] = round(single_process_figure(args))
        distributed.barrier()
    times = timed_steps(spec, args.steps)
    report[f"samples_per_s_{size}_ranks"] = round(size * args.batch_size / statistics.median(times))
    report["median_step_s"] = round(statistics.median(times), 4)
    zipf = bytes_report("zipf", rank_batch(spec, 0))
    report.update(zipf)
    criteo = criteo_batch(args.criteo_rows)
    if criteo is not None:
        report.update(bytes_report("criteo", criteo))
    report["a2a_bytes_vsi"] = zipf["zipf_a2a_bytes_vsi"]
    report["a2a_bytes_raw"] = zipf["zipf_a2a_bytes_raw"]
    report["a2a_bytes_min"] = zipf["zipf_a2a_bytes_min"]
    report["vsi_within_5pct_of_min"] = zipf["zipf_vsi_over_min"] <= 1.05
    if "samples_per_s_1_rank" in report:
        report["scaling_2_vs_1"] = round(report["samples_per_s_2_ranks"]
                                         / report["samples_per_s_1_rank"], 3)
    if distributed.is_chief():
        print(json.dumps(report))


if __name__ == "__main__":
    main()
