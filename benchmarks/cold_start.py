"""Cold-start table on MovieLens 100K (../shared/DESIGN.md, "Cold-start evaluation protocol").

For each seed: convert ml-100k with that split seed (80% warm users, 10 random query
ratings per user, users with fewer than 13 ratings dropped), train on the warm users, then
for every cold user adapt on its support set and score its query set. Contenders, all with
the same MeLU tower (item_id, year, genres + age, gender, occupation, zip; dim 16; MLP
64-64; rating head) and sparse Adagrad embeddings:

  maml, fomaml, reptile   MetaModel, k inner SGD steps on the support set
  baseline                CTRModel trained on all warm rows jointly, evaluated as is
  baseline_finetune       the same, fine-tuned on each cold user's support set for the
                          same k steps at the same inner learning rate

Metrics on cold users' query sets: AUC (label = rating >= 4, score = predicted rating,
pooled), MAE of the rating, nDCG@3 per user (relevance = rating). Mean and standard
deviation over the seeds. Reference (MeLU paper, MovieLens-1M new users): MeLU-5 MAE
0.785, nDCG@3 0.881; Wide&Deep MAE 1.069, nDCG@3 0.864.

Usage: python -m benchmarks.cold_start [--quick] [--seeds 0,1,2] [--epochs N]
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from gmeta_tf import data  # noqa: E402
from gmeta_tf.embedding import Adagrad, FeatureConfig, ShardedHashEmbedding, TableConfig  # noqa: E402
from gmeta_tf.meta import (MetaConfig, MetaModel, evaluate_tasks,  # noqa: E402
                           fine_tuned_predictions, task_rows)
from gmeta_tf.models import CTRModel, MeLUTower, RatingHead  # noqa: E402

ML100K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ml-100k"
ITEM_FEATURES = ("item_id", "year", "genres")
USER_FEATURES = ("age", "gender", "occupation", "zip")
DIM, HIDDEN = 16, (64, 64)
TASKS, SUPPORT_SLOTS, QUERY = 32, 64, 10
INNER_STEPS, INNER_LR = 5, 0.05
MEAN_RATING = 3.5
METRICS = ("auc", "mae", "ndcg@3")
CONTENDERS = ("maml", "fomaml", "reptile", "baseline", "baseline_finetune")


def make_embedding(seed: int) -> ShardedHashEmbedding:
    tables = [TableConfig("item", DIM, optimizer=Adagrad(0.05), seed=seed),
              TableConfig("user", DIM, optimizer=Adagrad(0.05), seed=seed)]
    features = [FeatureConfig("item_id", "item"), FeatureConfig("year", "item"),
                FeatureConfig("genres", "item", combiner="mean")]
    features += [FeatureConfig(f, "user") for f in USER_FEATURES]
    return ShardedHashEmbedding(tables, features)


def make_tower(seed: int) -> MeLUTower:
    return MeLUTower(ITEM_FEATURES, USER_FEATURES, DIM, HIDDEN, seed=seed)


def warm_batches(path: str, seed: int, epoch: int):
    return data.read_tasks(path, TASKS, SUPPORT_SLOTS, QUERY, split="warm",
                           shuffle_seed=seed * 1000 + epoch)


def train_meta(path: str, algorithm: str, seed: int, epochs: int) -> MetaModel:
    tf.keras.utils.set_random_seed(seed)
    model = MetaModel(make_embedding(seed), make_tower(seed), RatingHead("rating", MEAN_RATING),
                      MetaConfig(algorithm, inner_steps=INNER_STEPS, inner_lr=INNER_LR))
    outer_lr = 0.01 if algorithm == "reptile" else 1e-3
    model.compile(optimizer=tf.keras.optimizers.Adam(outer_lr))
    step = tf.function(model.train_step, reduce_retracing=True)
    for epoch in range(epochs):
        for batch in warm_batches(path, seed, epoch):
            step(batch)
    return model


def train_baseline(path: str, seed: int, epochs: int) -> CTRModel:
    tf.keras.utils.set_random_seed(seed)
    model = CTRModel(make_embedding(seed), make_tower(seed), RatingHead("rating", MEAN_RATING))
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))
    step = tf.function(lambda b: model.train_step(task_rows(b)), reduce_retracing=True)
    for epoch in range(epochs):
        for batch in warm_batches(path, seed, epoch):
            step(batch)
    return model


def cold_metrics(path: str, predict, head) -> dict:
    cold = data.read_tasks(path, TASKS, None, QUERY, split="cold")
    report = evaluate_tasks(predict, cold, head, k=3, binary_label="label",
                            relevance_label="rating")
    return {m: report.overall[m] for m in METRICS} | {"tasks": report.overall["tasks"]}


def run_seed(seed: int, epochs: int, work: str) -> dict:
    path = os.path.join(work, f"ml100k_seed{seed}")
    manifest = data.convert_movielens(str(ML100K), path, seed=seed)
    out = {}
    for algorithm in ("maml", "fomaml", "reptile"):
        start = time.perf_counter()
        model = train_meta(path, algorithm, seed, epochs)
        predict = tf.function(model.adapted_predictions, reduce_retracing=True)
        out[algorithm] = cold_metrics(path, predict, model.head)
        print(f"seed {seed} {algorithm}: {out[algorithm]} ({time.perf_counter() - start:.0f}s)",
              flush=True)
    baseline = train_baseline(path, seed, epochs)
    for name, steps in (("baseline", 0), ("baseline_finetune", INNER_STEPS)):
        out[name] = cold_metrics(path, fine_tuned_predictions(baseline, steps, INNER_LR),
                                 baseline.head)
        print(f"seed {seed} {name}: {out[name]}", flush=True)
    out["split"] = {k: manifest.split.get(k) for k in ("warm_tasks", "cold_tasks")}
    return out


def summarize(runs: list[dict]) -> dict:
    table = {}
    for c in CONTENDERS:
        table[c] = {}
        for m in METRICS:
            values = np.array([r[c][m] for r in runs])
            table[c][m] = {"mean": round(float(values.mean()), 4),
                           "std": round(float(values.std()), 4)}
    return table


def print_table(table: dict, seeds: list[int]) -> None:
    print(f"\ncold users, mean +- std over seeds {seeds}")
    print(f"{'model':<20}" + "".join(f"{m:>20}" for m in METRICS))
    for c, row in table.items():
        print(f"{c:<20}" + "".join(f"{row[m]['mean']:>12.4f} +-{row[m]['std']:.4f}"
                                   for m in METRICS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, few epochs")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated split/init seeds")
    parser.add_argument("--epochs", type=int, default=None, help="passes over the warm users")
    args = parser.parse_args()
    if not ML100K.is_dir():
        raise SystemExit(f"MovieLens 100K not found at {ML100K}")
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    epochs = args.epochs or (3 if args.quick else 20)
    with tempfile.TemporaryDirectory() as work:
        runs = [run_seed(s, epochs, work) for s in seeds]
    table = summarize(runs)
    print_table(table, seeds)
    best_meta_mae = min(table[c]["mae"]["mean"] for c in ("maml", "fomaml", "reptile"))
    best_base_mae = min(table[c]["mae"]["mean"] for c in ("baseline", "baseline_finetune"))
    print(json.dumps({"benchmark": "cold_start", "dataset": "ml-100k", "seeds": seeds,
                      "epochs": epochs, "inner_steps": INNER_STEPS, "inner_lr": INNER_LR,
                      "table": table, "runs": runs,
                      "meta_beats_baseline_mae": best_meta_mae < best_base_mae,
                      "reference_melu_ml1m": {"melu5_mae": 0.785, "wide_deep_mae": 1.069}}))


if __name__ == "__main__":
    main()
