"""The reference predictors' fits, each against the code before it on the same rows: the
factorisation's grid (``references.held_out_grid``) on a thread per core against the same
grid in one loop, and the logistic regression (``references.fit_linear``) with its
gradient summed over a batch's columns against the sum over every hashed column.

    python -m benchmarks.reference_fits [--quick] [--repeats R] [--users N] [--items N]
        [--only factorisation|logistic]

The data: a click log in the shape of ``make demo``'s (by default 28,000 users and 2,000
items, about 690,000 training rows; clicks from a user taste and an item appeal, 3
factors), with the protocol's validation users (10 query rows each) and, beside them, the
held-out folds of training users. The grid: the clicks' factor widths x L2 x item biases x
fold-in priors (``MF_FACTORS_CLICKS``, ``MF_REGS_CLICKS``, ``MF_ITEM_BIASES``,
``FOLD_IN_PRIORS``: 36 fits of every training row, as ``gmeta eval`` fits them for the
demo) x the fold-in strengths. Contenders, alternated within each repeat:

- ``threads``: ``held_out_grid`` as shipped (``references.in_parallel``: a thread per core,
  numpy's BLAS held to one thread meanwhile);
- ``loop``: the same function with ``in_parallel`` replaced by a plain loop and BLAS's
  threads left as numpy sets them: the code before.

The rows are read, the groups laid out and numpy warmed before any timed window; each
window holds one whole grid. Reported (one JSON line): each contender's seconds per grid
(median and every repeat), the ratio loop / threads of the medians, whether the losses
and the fits were the same bit for bit, the largest relative difference of a loss, and
whether both chose the same setting. They can differ in the last bits: with more than one
thread of its own, OpenBLAS may split a long sum (an item's many rows) between them, and
the loop runs with numpy's default threads, the threads with one each.

The logistic regression reads the same log's user and item ids (two sparse features, the
demo's training rows) and fits its whole grid of L2 penalties and epochs. Contenders,
alternated within each repeat: ``batch_columns`` (as shipped: a batch's Adagrad step sums
its gradient over the columns the batch touches) and ``all_columns`` (the step before: a
``bincount`` over all 2^20 hashed columns, allocated and scanned every batch of 256
rows). Reported (a second JSON line): seconds per fit of the grid, the ratio of medians,
and whether the fitted weights and the choice were the same bit for bit (the same sums in
the same order, so they must be).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from gmeta_tf.machine import machine  # noqa: E402
from gmeta_tf.training import references as R  # noqa: E402


def click_log(users: int, items: int, seed: int = 0):
    """``(tasks, items, labels)`` of a click log: 15-34 impressions a user."""
    rng = np.random.default_rng(seed)
    taste, appeal = rng.normal(0, 1, (users, 3)), rng.normal(0, 1, (items, 3))
    popularity = rng.zipf(1.3, items).astype(float)
    popularity /= popularity.sum()
    counts = rng.integers(15, 35, users)
    tasks = np.repeat(np.arange(users), counts)
    seen = rng.choice(items, len(tasks), p=popularity)
    logit = np.einsum("rf,rf->r", taste[tasks], appeal[seen]) - 1.0
    labels = (rng.random(len(tasks)) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    return tasks, seen, labels


@contextlib.contextmanager
def one_loop():
    """``references.in_parallel`` as a plain loop (the code before it)."""
    saved = R.in_parallel
    R.in_parallel = lambda fn, items: [fn(item) for item in items]
    try:
        yield
    finally:
        R.in_parallel = saved


def all_columns_gradient(ids: np.ndarray, terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``LinearModel._column_gradient`` as it was: a ``bincount`` over all 2^20 hashed
    columns (``fit_linear``'s models have the default 2^20), then the touched ones read out
    of it."""
    flat = ids.ravel()
    touched = np.unique(flat)
    return touched, np.bincount(flat, weights=terms.ravel(), minlength=1 << 20)[touched]


@contextlib.contextmanager
def all_columns():
    """``LinearModel``'s Adagrad step with its gradient summed as it was
    (``all_columns_gradient``)."""
    saved = R.LinearModel.__dict__["_column_gradient"]  # the staticmethod itself
    R.LinearModel._column_gradient = staticmethod(all_columns_gradient)
    try:
        yield
    finally:
        R.LinearModel._column_gradient = saved


def logistic(tasks, items, labels, valid_users, repeats: int) -> dict:
    """The logistic regression's fit, as shipped against the code before (one JSON dict)."""
    rows = {"user": tasks, "item": items, "click": labels}
    train = {k: v[~valid_users] for k, v in rows.items()}
    valid = {k: v[valid_users] for k, v in rows.items()}
    data = R.ReferenceData("binary", "click", ("item",), ("user", "item"))
    R.fit_linear(data, {k: v[:5000] for k, v in train.items()}, valid, max_epochs=1)  # warm
    seconds = {"all_columns": [], "batch_columns": []}
    fits = {}
    for _ in range(repeats):
        for name in ("all_columns", "batch_columns"):
            with all_columns() if name == "all_columns" else contextlib.nullcontext():
                start = time.perf_counter()
                model, chosen = R.fit_linear(data, train, valid)
                seconds[name].append(round(time.perf_counter() - start, 2))
            fits[name] = (model, chosen)
    (before, before_chosen), (after, after_chosen) = fits["all_columns"], fits["batch_columns"]
    median = {name: round(statistics.median(s), 2) for name, s in seconds.items()}
    return {"benchmark": "reference_fits", "reference": "logistic regression",
            "training_rows": len(train["click"]), "validation_rows": len(valid["click"]),
            "chosen": after_chosen, "seconds": seconds, "median_seconds": median,
            "all_over_batch_columns": round(median["all_columns"] / median["batch_columns"], 2),
            "identical": bool(np.array_equal(before.w, after.w) and before.b == after.b
                              and before_chosen == after_chosen)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="5,000 users, 2 repeats, a third of the grid")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--users", type=int, default=28_000)
    parser.add_argument("--items", type=int, default=2_000)
    parser.add_argument("--only", choices=("factorisation", "logistic"),
                        help="measure one reference (default: both)")
    args = parser.parse_args()
    if args.repeats < 1 or args.users < 100 or args.items < 10:
        parser.error("expected --repeats >= 1, --users >= 100, --items >= 10")
    users, repeats = (5_000, 2) if args.quick else (args.users, args.repeats)
    tasks, items, labels = click_log(users, args.items)
    if args.only != "factorisation":
        print(json.dumps({**logistic(tasks, items, labels, tasks < users // 10, repeats),
                          "cores": len(os.sched_getaffinity(0)), "machine": machine()}),
              flush=True)
    if args.only == "logistic":
        return
    protocol = R.HeldOutProtocol(query=10, support=40, min_rows=13, max_rows=100)
    valid_users = tasks < users // 10
    valid = protocol.folds_of(tasks[valid_users], items[valid_users], labels[valid_users])
    valid_tasks = [fold_task for _, fold_task, _ in valid]
    valid_labels = np.concatenate([fold_labels for _, _, fold_labels in valid])
    train = ~valid_users
    t_tasks, t_items, t_labels = tasks[train], items[train], labels[train]
    held_out = protocol.folds_of(t_tasks, t_items, t_labels)[:1]  # one fold: the held-out path
    widths = R.MF_FACTORS_CLICKS[:1] if args.quick else R.MF_FACTORS_CLICKS
    grid = [(w, r, b, p) for w in widths for r in R.MF_REGS_CLICKS
            for b in R.MF_ITEM_BIASES for p in R.FOLD_IN_PRIORS]

    def fit(rows, setting):
        rows = slice(None) if rows is None else rows
        return R.FactorModel(t_tasks[rows], t_items[rows], t_labels[rows], factors=setting[0],
                             reg=setting[1], item_bias=setting[2])

    def run():
        start = time.perf_counter()
        losses, models, _ = R.held_out_grid(fit, grid, R.MF_FOLD_IN, valid_tasks,
                                            valid_labels, held_out, kind="binary")
        return time.perf_counter() - start, losses, models

    fit(None, grid[0])  # numpy and the groups' code warmed before any window
    seconds = {"threads": [], "loop": []}
    results = {}
    for _ in range(repeats):
        for name in ("loop", "threads"):
            with one_loop() if name == "loop" else contextlib.nullcontext():
                took, losses, models = run()
            seconds[name].append(round(took, 2))
            results[name] = (losses, models)
    (loop_losses, loop_fits), (thread_losses, thread_fits) = results["loop"], results["threads"]
    identical = loop_losses == thread_losses and all(
        np.array_equal(loop_fits[k].factors, thread_fits[k].factors)
        and np.array_equal(loop_fits[k].biases, thread_fits[k].biases) for k in loop_fits)
    largest = max(abs(loop_losses[k] - thread_losses[k]) / abs(loop_losses[k])
                  for k in loop_losses)
    median = {name: round(statistics.median(s), 2) for name, s in seconds.items()}
    print(json.dumps({
        "benchmark": "reference_fits", "reference": "factorisation", "users": users, "items": args.items,
        "training_rows": int(train.sum()), "fits": len({g[:3] for g in grid}) * (1 + len(held_out)),
        "cores": len(os.sched_getaffinity(0)), "seconds": seconds,
        "median_seconds": median, "loop_over_threads": round(median["loop"] / median["threads"], 2),
        "identical": bool(identical), "largest_relative_loss_difference": largest,
        "same_choice": min(loop_losses, key=loop_losses.get) == min(thread_losses,
                                                                      key=thread_losses.get),
        "machine": machine()}))


if __name__ == "__main__":
    main()
