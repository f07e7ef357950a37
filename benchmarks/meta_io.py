"""Meta-IO readers side by side, against the rate a meta training step consumes rows.

1. Generates a raw CSV of synthetic users (default 100,000 tasks, ~2.0M rows) and converts
   it with ``gmeta_tf.data.convert_csv`` to Parquet and to ORC (conversion rows/s).
2. Reads the warm split of each into task batches (T=32 tasks, S=20 support, Q=5 query
   slots) with every reader, in file order:
     arrow           pyarrow, Parquet by row group / ORC by stripe (the default, "auto")
     tfio_iotensor   tensorflow-io IOTensor.from_parquet sliced per column (no ORC IOTensor)
     tfio_dataset    tensorflow-io IODataset (one row at a time); its ORC path runs in a
                     guarded child process because it crashes (tensorflow/io#1782)
   and, as the raw peer figure, tensorflow-io's plain ``IODataset.from_parquet().batch(8192)``
   scan. Slow readers stop after a time budget; rows/s counts real (unpadded) rows.
3. Measures how fast the real meta training step consumes the same batches:
   ``MetaModel.train_step`` under tf.function (second-order MAML, k=1) with a MeLU tower
   over a ``ShardedHashEmbedding`` (one table per sparse feature, dim 16, sparse Adagrad;
   genres mean-pooled; MLP 64-64-1 adapted per task; binary head on ``label``; dense Adam),
   fed the reader's batches of T whole tasks (see ``make_meta_model``).

Usage: python -m benchmarks.meta_io [--quick] [--tasks N] [--rows-per-task R] [--keep DIR]
The last stdout line is one JSON object; ``ratio_vs_consumption`` is the default reader's
rows/s over the step's consumption rows/s (target >= 3: training never waits for data).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from gmeta_tf import data  # noqa: E402
from gmeta_tf.data import synthetic  # noqa: E402
from gmeta_tf.embedding import Adagrad, FeatureConfig, ShardedHashEmbedding, TableConfig  # noqa: E402
from gmeta_tf.meta import MetaConfig, MetaModel  # noqa: E402
from gmeta_tf.models import BinaryHead, MeLUTower  # noqa: E402

T, S, Q = 32, 20, 5
TARGET_RATIO = 3.0
ITEM_FEATURES = ("item_id", "category", "genres")
USER_FEATURES = ("user_id", "age")
DIM = 16


def log(msg: str) -> None:
    print(msg, flush=True)


# -- data ------------------------------------------------------------------------------------


def make_datasets(work: str, tasks: int, rows_per_task: int) -> dict:
    """Raw CSV -> Parquet and ORC datasets; returns paths and conversion figures."""
    raw = os.path.join(work, "raw.csv")
    t0 = time.perf_counter()
    rows = synthetic.write_raw_csv(raw, tasks, rows_per_task, seed=0)
    out = {"rows": rows, "tasks": tasks, "raw_csv_bytes": os.path.getsize(raw),
           "generate_s": round(time.perf_counter() - t0, 2), "convert_rows_per_s": {}, "paths": {}}
    log(f"generated {rows:,} rows of {tasks:,} tasks in {out['generate_s']} s")
    for fmt in ("parquet", "orc"):
        path = os.path.join(work, fmt)
        t0 = time.perf_counter()
        data.convert_csv(raw, path, synthetic.CSV_MAPPING, split=synthetic.DEFAULT_SPLIT,
                         output=data.OutputConfig(file_format=fmt, rows_per_file=1 << 19,
                                                  rows_per_block=1 << 16))
        dt = time.perf_counter() - t0
        out["convert_rows_per_s"][fmt] = round(rows / dt)
        out["paths"][fmt] = path
        log(f"converted to {fmt} in {dt:.1f} s ({rows / dt:,.0f} rows/s)")
    return out


# -- readers ---------------------------------------------------------------------------------


def real_rows(batch: dict) -> int:
    """Rows of a batch that are data, not padding."""
    return int(batch["support"]["mask"].numpy().sum() + batch["query"]["mask"].numpy().sum())


def time_task_batches(path: str, reader: str, budget_s: float) -> dict:
    """Rows/s of read_tasks with one reader (file order), stopping after ``budget_s``."""
    try:
        ds = data.read_tasks(path, T, S, Q, split="warm", reader=reader, verify="size")
        rows, batches, complete, t0 = 0, 0, True, time.perf_counter()
        for batch in ds:
            rows += real_rows(batch)
            batches += 1
            if time.perf_counter() - t0 > budget_s:
                complete = False
                break
        dt = time.perf_counter() - t0
        return {"status": "ok", "rows_per_s": round(rows / dt), "rows": rows, "batches": batches,
                "complete_epoch": complete}
    except (data.DataError, tf.errors.OpError) as e:
        message = str(e).splitlines()[0]
        status = "crashed" if "died in its child process" in message else "error"
        start = message.find("ReaderCrashed: ")  # drop tf.data's wrapper text
        return {"status": status, "rows_per_s": 0, "error": message[max(start, 0):][:300]}


def time_tfio_plain_scan(path: str, budget_s: float) -> dict:
    """The peer as people use it: IODataset.from_parquet(...).batch(8192), raw rows, no tasks."""
    import tensorflow_io as tfio

    manifest = data.Manifest.load(path)
    files = [os.path.join(path, f.path) for f in manifest.files_of("warm")]
    columns = manifest.schema.columns()
    rows, t0 = 0, time.perf_counter()
    for f in files:
        for batch in tfio.IODataset.from_parquet(f, columns=columns).batch(8192):
            rows += int(batch["task_id"].shape[0])
            if time.perf_counter() - t0 > budget_s:
                break
        if time.perf_counter() - t0 > budget_s:
            break
    return {"status": "ok", "rows_per_s": round(rows / (time.perf_counter() - t0)), "rows": rows}


def compare_readers(paths: dict, budget_s: float) -> dict:
    results: dict = {"parquet": {}, "orc": {}}
    for fmt, reader in [("parquet", "arrow"), ("orc", "arrow"), ("parquet", "tfio_iotensor"),
                        ("parquet", "tfio_dataset"), ("orc", "tfio_dataset")]:
        results[fmt][reader] = time_task_batches(paths[fmt], reader, budget_s)
        log(f"{fmt:8s} {reader:14s} {results[fmt][reader]}")
    results["orc"]["tfio_iotensor"] = {"status": "unsupported", "rows_per_s": 0,
                                       "error": "tensorflow-io has no IOTensor for ORC"}
    results["parquet"]["tfio_dataset_plain_scan"] = time_tfio_plain_scan(paths["parquet"], budget_s)
    log(f"parquet  tfio plain IODataset.batch(8192) scan {results['parquet']['tfio_dataset_plain_scan']}")
    return results


# -- the meta training step ----------------------------------------------------------------


def make_meta_model(inner_steps: int = 1, inner_lr: float = 0.1) -> MetaModel:
    """The real meta step: MeLU tower over ShardedHashEmbedding, second-order MAML.

    One hash table (dim 16, sparse Adagrad) per sparse feature, genres mean-pooled; tower
    [item_id, category, genres | user_id, age] -> 64 -> 64 -> 1 (MeLU's tower reads no
    dense feature, so ``price`` is not used); binary head on ``label``; k=1 inner SGD step
    on the whole tower, dense Adam 1e-3.
    """
    names = (*ITEM_FEATURES, *USER_FEATURES)
    tables = [TableConfig(n, DIM, optimizer=Adagrad(0.05)) for n in names]
    features = [FeatureConfig(n, n, combiner="mean" if n == "genres" else None) for n in names]
    model = MetaModel(ShardedHashEmbedding(tables, features),
                      MeLUTower(ITEM_FEATURES, USER_FEATURES, DIM, (64, 64)),
                      BinaryHead("label"),
                      MetaConfig("maml", inner_steps=inner_steps, inner_lr=inner_lr))
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))
    return model


def consumption_rate(path: str, steps: int) -> dict:
    """Rows/s the MetaModel train step consumes, on batches of T tasks as the reader yields
    them, held in memory (no I/O in the loop)."""
    batches = list(data.read_tasks(path, T, S, Q, split="warm", shuffle_seed=0).take(16))
    model = make_meta_model()
    step = tf.function(model.train_step, reduce_retracing=True)
    losses = [float(step(b)["loss"]) for b in batches[:3]]  # compile + warm up
    rows, t0 = 0, time.perf_counter()
    for i in range(steps):
        b = batches[i % len(batches)]
        out = step(b)
        rows += real_rows(b)
    float(out["loss"])  # wait for the last step
    dt = time.perf_counter() - t0
    log(f"MetaModel meta step: {steps / dt:.1f} steps/s, {rows / dt:,.0f} rows/s, first losses "
        f"{[round(v, 3) for v in losses]}")
    return {"rows_per_s": round(rows / dt), "steps_per_s": round(steps / dt, 2),
            "rows_per_step": round(rows / steps, 1)}


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10,000 tasks, short budgets")
    p.add_argument("--tasks", type=int)
    p.add_argument("--rows-per-task", type=int, default=20)
    p.add_argument("--budget-s", type=float, help="time limit per slow reader")
    p.add_argument("--steps", type=int, help="timed training steps")
    p.add_argument("--keep", help="write the datasets here and keep them")
    args = p.parse_args(argv)
    tasks = args.tasks or (10_000 if args.quick else 100_000)
    budget = args.budget_s or (5.0 if args.quick else 20.0)
    steps = args.steps or (30 if args.quick else 150)
    work = args.keep or tempfile.mkdtemp(prefix="meta_io_bench_")
    os.makedirs(work, exist_ok=True)
    try:
        prepared = make_datasets(work, tasks, args.rows_per_task)
        readers = compare_readers(prepared["paths"], budget)
        consumption = consumption_rate(prepared["paths"]["parquet"], steps)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    default = readers["parquet"]["arrow"]["rows_per_s"]
    result = {
        "benchmark": "meta_io", "quick": args.quick, "rows": prepared["rows"], "tasks": tasks,
        "batch": {"tasks": T, "support": S, "query": Q},
        "convert_rows_per_s": prepared["convert_rows_per_s"],
        "readers_rows_per_s": {fmt: {r: v["rows_per_s"] for r, v in rs.items()}
                               for fmt, rs in readers.items()},
        "readers": readers,
        "consumption": consumption,
        "consumption_step": "MetaModel.train_step: MAML k=1, MeLU tower 64-64 over "
                            "ShardedHashEmbedding dim 16 (benchmarks/meta_io.make_meta_model)",
        "default_reader": "arrow (parquet)",
        "default_rows_per_s": default,
        "ratio_vs_consumption": round(default / max(consumption["rows_per_s"], 1), 2),
        "ratio_orc_arrow_vs_consumption": round(readers["orc"]["arrow"]["rows_per_s"]
                                                / max(consumption["rows_per_s"], 1), 2),
        "ratio_vs_tfio_iotensor": round(default / max(readers["parquet"]["tfio_iotensor"]["rows_per_s"], 1), 2),
        "ratio_vs_tfio_dataset": round(default / max(readers["parquet"]["tfio_dataset"]["rows_per_s"], 1), 2),
        "target_ratio": TARGET_RATIO,
    }
    result["meets_target"] = result["ratio_vs_consumption"] >= TARGET_RATIO
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
