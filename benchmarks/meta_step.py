"""Meta step throughput: G-Meta's batched step against the conventional task-by-task pipeline.

One outer step of second-order MAML on T tasks per rank (MeLU-sized: 7 sparse features
incl. multi-hot genres, dim 32, MLP 64-64, S=20 support and Q=10 query rows per task,
item ids Zipf over 1,682 items, fresh users every step), sparse Adagrad, dense Adam:

  gmeta     MetaModel.train_step under tf.function: the T tasks' ids in ONE embedding call
            (ids deduplicated once; two all-to-alls forward, ids out and rows back, one
            back), the inner loop batched over tasks, dense gradients all-reduced once.
  per_task  the conventional pipeline, each task step compiled with tf.function and fed one
            task at a time: look up the support set's embeddings (its own all-to-alls), k
            inner steps, look up the query set's embeddings (another), query loss, push the
            embedding gradients (one all-to-all back per lookup); dense gradients summed
            over the tasks, all-reduced and applied once (same optimizer).
  eager     the per-task pipeline without tf.function (the MeLU reference code's style),
            for context.

Same tower, data and optimizers for all. Figures are tasks/s over all ranks (T x ranks x
steps / time). Usage (also under ``horovodrun -np 2 -H localhost:2``):

    python -m benchmarks.meta_step [--quick] [--tasks 32] [--steps N] [--paired REPEATS]

--paired R times gmeta, per_task and per_task_graph (the per-task loop traced into ONE
tf.function: T tasks unrolled, each lookup and push still its own exchange) at k=5 over R
repeats and reports paired ratios; benchmarks.cluster runs it across hosts.

The last stdout line (rank 0) is a JSON object; ``ratio_vs_per_task`` is gmeta / per_task
at k=5 (the target is >= 5 at 2 ranks).
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
from gmeta_tf.embedding import Adagrad, FeatureConfig, ShardedHashEmbedding, TableConfig  # noqa: E402
from gmeta_tf.meta import MetaConfig, MetaModel, RoleBatch  # noqa: E402
from gmeta_tf.models import MeLUTower, RatingHead, embedding_inputs  # noqa: E402

DIM, HIDDEN = 32, (64, 64)
SUPPORT, QUERY = 20, 10
USER_FEATURES = ("user_id", "age", "gender", "occupation")
ITEM_FEATURES = ("item_id", "year", "genres")
TARGET_RATIO = 5.0


def make_batch(num_tasks: int, step: int, rank: int) -> dict:
    """Synthetic MeLU-like tasks: each task a fresh user rating Zipf-popular items."""
    rng = np.random.default_rng([step, rank])
    users = (step * 1_000_000 + rank * 10_000 + np.arange(num_tasks)).astype(np.int64)

    def role(n):
        items = np.minimum(rng.zipf(1.2, (num_tasks, n)), 1682).astype(np.int64)
        genres = np.where(rng.random((num_tasks, n, 3)) < 0.6, items[..., None] % 19 +
                          np.arange(3), -1).astype(np.int64)
        user = np.repeat(users[:, None], n, 1)
        return {"user_id": user, "age": user % 7, "gender": user % 2, "occupation": user % 21,
                "item_id": items, "year": 1920 + items % 80, "genres": genres,
                "rating": rng.integers(1, 6, (num_tasks, n)).astype(np.float32),
                "mask": np.ones((num_tasks, n), np.float32)}

    return {"support": role(SUPPORT), "query": role(QUERY)}


def make_model(inner_steps: int) -> MetaModel:
    tables = [TableConfig("user", DIM, optimizer=Adagrad(0.05)),
              TableConfig("item", DIM, optimizer=Adagrad(0.05))]
    features = [FeatureConfig(f, "user") for f in USER_FEATURES]
    features += [FeatureConfig("item_id", "item"), FeatureConfig("year", "item"),
                 FeatureConfig("genres", "item", combiner="mean")]
    model = MetaModel(ShardedHashEmbedding(tables, features),
                      MeLUTower(ITEM_FEATURES, USER_FEATURES, DIM, HIDDEN),
                      RatingHead("rating", 3.5),
                      MetaConfig("maml", inner_steps=inner_steps, inner_lr=5e-3))
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))
    return model


def _role(model: MetaModel, rows: dict, n: int) -> RoleBatch:
    """One task's role (rows [n]) embedded by its own lookup, as a T=1 RoleBatch."""
    names = model.tower.sparse_features
    emb = model.embedding(embedding_inputs({k: rows[k][0] for k in names}, names), training=True)
    return RoleBatch({k: v[None] for k, v in emb.items()}, rows["rating"], rows["mask"], {})


def per_task_step_fn(model: MetaModel):
    """The conventional pipeline's step for ONE task: two lookups, two pushes."""
    adapter, rates = model.adapter, model.inner_learning_rates()
    dense = model.slow_variables

    def task_step(task: dict) -> list:
        with tf.GradientTape() as tape:
            support = _role(model, task["support"], SUPPORT)
            params = model.tower.params()
            fast = adapter.initial(params, 1, {})
            adapted = adapter.adapt(params, fast, support, rates, first_order=False).fast
            query = _role(model, task["query"], QUERY)
            loss = tf.reduce_mean(adapter.task_losses(params, adapted, query))
        grads = tape.gradient(loss, dense + model.embedding.trainable_variables)
        return grads[: len(dense)]

    return task_step


def conventional_step(model: MetaModel, task_step, apply_fn, batch: dict, num_tasks: int):
    """Feeds the tasks one by one, then all-reduces and applies the mean dense gradient."""
    total = None
    for t in range(num_tasks):
        task = {r: {k: v[t:t + 1] for k, v in batch[r].items()} for r in ("support", "query")}
        grads = task_step(task)
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    apply_fn([g / num_tasks for g in total])


def one_graph_step_fn(model: MetaModel, num_tasks: int):
    """The per-task pipeline traced whole into ONE tf.function: the T task steps unrolled
    in the graph (each task's lookups and pushes still their own exchanges), then the
    dense all-reduce and update. It removes the per-call overhead of ``per_task``, so what
    still separates it from ``gmeta`` is the number of exchanges."""
    task_step, apply = per_task_step_fn(model), make_apply_fn(model)

    @tf.function
    def step(batch):
        total = None
        for t in range(num_tasks):  # a Python loop: unrolled when traced
            task = {r: {k: v[t:t + 1] for k, v in batch[r].items()} for r in ("support", "query")}
            grads = task_step(task)
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        apply([g / num_tasks for g in total])

    return step


def make_apply_fn(model: MetaModel):
    def apply(grads):
        grads = distributed.allreduce_gradients(grads)
        model.optimizer.apply_gradients(zip(grads, model.slow_variables))

    return apply


def _time(run_step, steps: int, num_tasks: int, warmup: int = 2) -> float:
    for s in range(warmup):
        run_step(s)
    distributed.barrier()
    start = time.perf_counter()
    for s in range(warmup, warmup + steps):
        run_step(s)
    distributed.barrier()
    return num_tasks * distributed.size() * steps / (time.perf_counter() - start)


def measure_paired(inner_steps: int, num_tasks: int, steps: int, repeats: int) -> dict:
    """gmeta, per_task and one_graph, each built and traced once (2 warm-up steps), then
    timed over ``steps`` steps in each of ``repeats`` repeats (order rotated per repeat);
    tasks/s are medians, ``*_vs_*`` ratios the median of the within-repeat ratios."""
    rank = distributed.rank()
    batches = [make_batch(num_tasks, s, rank) for s in range(steps + 2)]
    runners = {}
    model = make_model(inner_steps)
    step = tf.function(model.train_step)
    runners["gmeta"] = lambda b: step(b)
    model = make_model(inner_steps)
    task_step, apply_fn = tf.function(per_task_step_fn(model)), tf.function(make_apply_fn(model))
    runners["per_task"] = (lambda b, m=model, ts=task_step, ap=apply_fn:
                           conventional_step(m, ts, ap, b, num_tasks))
    model = make_model(inner_steps)
    graph_step = one_graph_step_fn(model, num_tasks)
    runners["per_task_graph"] = lambda b: graph_step(b)
    for run in runners.values():  # warm-up: tracing, first table growth
        for b in batches[:2]:
            run(b)
    names = list(runners)
    rates = {n: [] for n in names}
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            distributed.barrier()
            start = time.perf_counter()
            for b in batches[2:]:
                runners[name](b)
            distributed.barrier()
            rates[name].append(num_tasks * distributed.size() * steps
                               / (time.perf_counter() - start))
        if distributed.is_chief():
            print(f"k={inner_steps} rep {rep}: " + ", ".join(f"{n} {rates[n][-1]:.1f}"
                                                           for n in names), flush=True)
    med = statistics.median
    return {**{f"tasks_per_s_{n}": round(med(r), 1) for n, r in rates.items()},
            "gmeta_vs_per_task": round(med(a / b for a, b in zip(rates["gmeta"],
                                                                  rates["per_task"])), 3),
            "gmeta_vs_per_task_graph": round(med(a / b for a, b in zip(
                rates["gmeta"], rates["per_task_graph"])), 3),
            "per_task_graph_vs_per_task": round(med(a / b for a, b in zip(
                rates["per_task_graph"], rates["per_task"])), 3),
            "tasks_per_s_all_repeats": {n: [round(x, 1) for x in r] for n, r in rates.items()}}


def measure(inner_steps: int, num_tasks: int, steps: int, eager_steps: int) -> dict:
    rank = distributed.rank()
    batches = {}

    def batch_of(s):
        if s not in batches:
            batches[s] = make_batch(num_tasks, s, rank)
        return batches[s]

    for s in range(steps + 2):
        batch_of(s)
    out = {}
    model = make_model(inner_steps)
    step = tf.function(model.train_step)
    out["gmeta"] = _time(lambda s: step(batch_of(s)), steps, num_tasks)

    model = make_model(inner_steps)
    task_step, apply_fn = tf.function(per_task_step_fn(model)), tf.function(make_apply_fn(model))
    out["per_task"] = _time(lambda s: conventional_step(model, task_step, apply_fn, batch_of(s),
                                                        num_tasks), steps, num_tasks)
    if eager_steps:
        model = make_model(inner_steps)
        task_step, apply_fn = per_task_step_fn(model), make_apply_fn(model)
        out["eager"] = _time(lambda s: conventional_step(model, task_step, apply_fn, batch_of(s),
                                                         num_tasks), eager_steps, num_tasks,
                             warmup=1)
    return {f"tasks_per_s_{k}": round(v, 1) for k, v in out.items()} | {
        "ratio_vs_per_task": round(out["gmeta"] / out["per_task"], 2),
        **({"ratio_vs_eager": round(out["gmeta"] / out["eager"], 2)} if "eager" in out else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--tasks", type=int, default=32, help="tasks per rank per step (T)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per contender")
    parser.add_argument("--paired", type=int, metavar="REPEATS", default=0,
                        help="only gmeta vs per_task vs per_task_graph (the per-task loop as "
                             "one tf.function) at k=5, paired over REPEATS repeats (what "
                             "benchmarks.cluster runs)")
    args = parser.parse_args()
    if args.tasks < 1:
        parser.error(f"--tasks={args.tasks}, expected >= 1")
    steps = args.steps or (3 if args.quick else 10)
    if args.paired:
        report = {"benchmark": "meta_step", "ranks": distributed.size(),
                  "tasks_per_rank": args.tasks, "inner_steps": 5, "timed_steps": steps,
                  "repeats": args.paired, **measure_paired(5, args.tasks, steps, args.paired)}
        if distributed.is_chief():
            print(json.dumps(report), flush=True)
        return
    eager_steps = 1 if args.quick else 2
    report = {"benchmark": "meta_step", "ranks": distributed.size(), "tasks_per_rank": args.tasks,
              "support": SUPPORT, "query": QUERY, "algorithm": "maml", "timed_steps": steps}
    for k in (1, 5):
        report[f"k{k}"] = measure(k, args.tasks, steps, eager_steps)
        if distributed.is_chief():
            print(f"k={k}: {report[f'k{k}']}", flush=True)
    report["ratio_vs_per_task"] = report["k5"]["ratio_vs_per_task"]
    report["target_ratio"] = TARGET_RATIO
    report["meets_target"] = report["ratio_vs_per_task"] >= TARGET_RATIO
    if distributed.is_chief():
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
