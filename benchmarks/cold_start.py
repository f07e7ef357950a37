"""Cold-start table on MovieLens 100K (../shared/DESIGN.md, "Cold-start evaluation protocol").

For each seed: convert ml-100k with that split seed (80% warm users, 10 random query
ratings per user, users with fewer than 13 ratings dropped), train on the warm users, then
for every cold user adapt on its support set and score its query set. Contenders, all with
the same tower, data, epochs and k:

  maml, fomaml, reptile   MetaModel, k inner SGD steps on the support set
  baseline                CTRModel trained on all warm rows jointly, evaluated as is
  baseline_finetune       the same, fine-tuned on each cold user's support set for the
                          same k steps on the same fast weights, at its own tuned rate

Metrics on cold users' query sets: AUC (label = rating >= 4, score = predicted rating,
pooled), MAE of the rating, nDCG@3 per user (relevance = rating). Mean and standard
deviation over the seeds. Reference (MeLU paper, MovieLens-1M new users): MeLU-5 MAE
0.785, nDCG@3 0.881; Wide&Deep MAE 1.069, nDCG@3 0.864.

Tuning (``--validate``): the warm users are split again (seeded hash of the user id, 20%
held out); models train on the other warm users and are scored, with the same protocol,
on the held-out warm users' query sets. The cold users are never looked at. The defaults
(``Setup``) were chosen that way, seed 0, 149 held-out users (AUC / MAE / nDCG@3):

- One hash table per feature. The tables used to be shared ("item": item_id, year,
  genres; "user": age, gender, occupation, zip) and features sharing a table share the
  row of equal raw ids: genre 3 was item 3, age group 1 was occupation 1 and gender 1.
- 20 epochs for every contender (the budget), not 5: at 5 epochs the meta models were
  undertrained (fomaml 0.713/0.806/0.833, fine-tuned baseline 0.729/0.783/0.863); at 20
  the baseline fine-tuned at its tuned rate is at its best (10 epochs: 0.738/0.772/0.868;
  20: 0.742/0.770/0.876); at 30 MAML/FOMAML get worse (maml+Meta-SGD 0.725/0.803/0.871,
  fomaml 0.681/0.839/0.864).
- ``resample_query``: each epoch a warm training user's query rows swap with random
  support rows. The outer loop learns (and, first-order, the item embeddings learn) only
  from query rows; with the same 10 query rows every epoch the meta models saw a seventh of
  the labels the baseline trains on. Reptile 0.701/0.822/0.853 -> 0.723/0.799/0.863 (5
  epochs, demographics adapted).
- Meta-SGD, one learned inner rate per weight tensor, for MAML and first-order MAML:
  maml 0.745/0.763/0.865 -> 0.752/0.758/0.873 (per element: 0.750/0.759/0.876, no
  better; inner lr 0.1 or 0.02 without it: no better or worse).
- The baseline's fine-tuning rate tuned like the meta models' rates: 0.02 (0.742/0.770/
  0.876) over 0.05 (0.720/0.798/0.873), 0.01 (0.740/0.773/0.873) and 0.1 (0.692/0.837/0.866).
- Kept: inner lr 0.05, k=5, all tower weights fast (only the decision layers, as MeLU,
  tried at 5 epochs only: fomaml 0.710/0.811/0.831 -> 0.714/0.806/0.836, the fine-tuned
  baseline 0.718/0.799/0.862 -> 0.728/0.785/0.861: no edge for the meta models), outer Adam 1e-3 (5e-3 and 2e-3: no better), Reptile 0.01, no embedding
  rows adapted. Adapting the user's demographic rows (age, gender, occupation, zip, whose
  slow rows are shared by warm and cold users) helped MAML/FOMAML a little without
  Meta-SGD (maml 0.745/0.763/0.865 -> 0.751/0.758/0.870) and not with it (0.753/0.757/
  0.872), while it hurt the baseline's fine-tuning (0.742/0.770/0.876 -> 0.732/0.784/
  0.877), so all contenders adapt the same tower weights only. A user_id row is not used:
  cold users' ids are unknown and read the default (zero) row, while warm users' rows are
  trained on their own query sets in the outer loop (memorized, not transferable).
- ``extra_query=20`` (a larger outer-loop sample per training user, taken from its support
  set): no better over 3 validation seeds (maml 0.750/0.766/0.871 against 0.756/0.759/
  0.868), so off.

Then, over validation seeds 0, 1, 2 (mean AUC / MAE / nDCG@3 of held-out warm users):

- With the above: maml 0.756/0.759/0.868, fomaml 0.745/0.770/0.867, baseline_finetune
  0.749/0.769/0.869.
- Meta-IO used to keep a user's FIRST 64 support rows (file order) every epoch, so a heavy
  user's other rows were never trained on, by any contender; a shuffled epoch now draws
  a random subset each time: maml 0.757/0.762/0.874, baseline_finetune 0.751/0.765/0.870.
- Tried, no better (all contenders alike where the knob is shared): ``pretrain_epochs``
  5 or 10 of joint training before meta-training (maml 0.755/0.760/0.873, 0.752/0.763/
  0.872); ``tasks_per_batch=16`` (maml 0.753/0.764/0.867, baseline_finetune 0.749/0.769/
  0.869); ``hidden=128,64`` (0.754/0.762/0.869, 0.748/0.769/0.869); k=10 (maml 0.747/
  0.766/0.870: its learned rates overshoot; baseline_finetune 0.752/0.765/0.871);
  ``support_slots=0`` (all rows; padding to the heaviest user made it ~8x slower, stopped).
- MAML++ (Antoniou et al. 2019): the annealed multi-step loss over 200 outer steps
  (``multi_step_loss=200``) 0.758/0.761/0.874; with per-step rates per tensor
  (``weight_per_step``) 0.759/0.758/0.876; per step and per element (``element_per_step``)
  0.762/0.756/0.878, kept (against baseline_finetune 0.751/0.765/0.870).

Result (``python -m benchmarks.cold_start``, seeds 0, 1, 2, cold users, mean +- std):

  model               AUC              MAE              nDCG@3
  maml                0.7634 +-0.0025  0.7559 +-0.0139  0.8683 +-0.0075
  fomaml              0.7551 +-0.0034  0.7692 +-0.0148  0.8614 +-0.0094
  reptile             0.7382 +-0.0059  0.7954 +-0.0116  0.8540 +-0.0020
  baseline            0.6782 +-0.0063  0.8524 +-0.0117  0.8651 +-0.0048
  baseline_finetune   0.7606 +-0.0054  0.7583 +-0.0140  0.8669 +-0.0026

MAML beats both baselines on every metric. Against the fine-tuned baseline the margins are
small (``paired_vs_baseline_finetune``, same seed, split and users; > 0 is better): AUC
+0.0028 (seeds +0.0044, +0.0053, -0.0013), MAE 0.0023 lower on all three seeds (+0.0037,
+0.0011, +0.0022), nDCG@3 +0.0014 (+0.0040, -0.0072, +0.0075). First-order MAML and
Reptile beat the plain baseline on AUC and MAE and trail the fine-tuned one (first-order
meta-gradients learn smaller inner rates: ~0.05 against MAML's ~0.07 per element). MAML's
MAE (0.756) is below MeLU's reported 0.785 on MovieLens-1M. The cold users were scored
twice while tuning this: with per-tensor per-step rates (the validation runner-up) maml
was 0.7619/0.7584/0.8703 against the same baseline_finetune (level on MAE); the
per-element choice was made on validation before this table.

Usage: python -m benchmarks.cold_start [--quick] [--seeds 0,1,2] [--epochs N] [--validate]
       [--set key=value ...] (fields of ``Setup``)
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
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
DEMOGRAPHICS = ("age", "gender", "occupation", "zip")
MULTI_HOT = ("genres",)
DIM, HIDDEN = 16, (64, 64)
TASKS, SUPPORT_SLOTS, QUERY = 32, 64, 10
METRICS = ("auc", "mae", "ndcg@3")
META = ("maml", "fomaml", "reptile")
CONTENDERS = (*META, "baseline", "baseline_finetune")
VALIDATION_BUCKETS = 5  # 1 in 5 warm users held out by --validate


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything the contenders share or are tuned on (``--set key=value``).

    Attributes:
        epochs: Passes over the warm users, for every contender.
        inner_steps: k, for the meta models' inner loop and the baseline's fine-tuning.
        inner_lr: The meta models' inner learning rate (initial value under Meta-SGD).
        outer_lr: Adam learning rate of MAML's and first-order MAML's outer loop.
        reptile_lr: Adam learning rate of Reptile's outer loop.
        baseline_lr: Adam learning rate of the baseline.
        finetune_lr: The baseline's fine-tuning rate.
        fast_weights: Tower weights adapted per user, by the meta models and by the
            baseline's fine-tuning; empty: all.
        user_id: The tower reads a user_id embedding (every contender's tower).
        adapt_embeddings: Embedding rows adapted per user (meta and fine-tuning alike).
        learn_inner_lr: Meta-SGD for MAML and first-order MAML ("", "weight": one rate
            per weight tensor, "element": one per weight element; "weight_per_step",
            "element_per_step": one of those for each inner step, as MAML++). Not for Reptile: its
            dense update does not differentiate the query loss, so learned rates follow
            another objective (in validation they fell to ~0.004 at outer rate 0.003, so
            Reptile stopped adapting, and diverged to NaN at 0.01).
        mean_rating: The rating head's offset.
        sparse_lr: Adagrad rate of the embedding tables.
        resample_query: Each epoch, every warm training user's query set swaps rows with
            a random part of its support set (episodic sampling), so the outer loop sees
            the labels of all of its rows over the epochs, not the same 10 each time (the
            baseline trains on all of them anyway). Scored users keep their split.
        extra_query: The meta models' warm training users also move up to this many
            random support rows (at most half) to the query set, each epoch.
        pretrain_epochs: The meta models' first epochs (of ``epochs``) train their
            embedding and tower jointly on all rows, as the baseline does (Adam at
            ``baseline_lr``); the remaining epochs meta-train from there.
        tasks_per_batch: Training users per batch, T (every contender).
        support_slots: Support rows of a training user per epoch (a random subset when it
            has more; 0: all of them). Scored users adapt on all their support rows.
        multi_step_loss: MAML++'s annealed multi-step loss over this many outer steps
            (MAML and first-order MAML).
        hidden: The tower's hidden layer widths (every contender).
    """

    epochs: int = 20
    inner_steps: int = 5
    inner_lr: float = 0.05
    outer_lr: float = 1e-3
    reptile_lr: float = 0.01
    baseline_lr: float = 1e-3
    finetune_lr: float = 0.02
    fast_weights: tuple[str, ...] = ()
    user_id: bool = False
    adapt_embeddings: tuple[str, ...] = ()
    learn_inner_lr: str = "element_per_step"
    mean_rating: float = 3.5
    sparse_lr: float = 0.05
    resample_query: bool = True
    extra_query: int = 0
    pretrain_epochs: int = 0
    tasks_per_batch: int = TASKS
    support_slots: int = SUPPORT_SLOTS
    multi_step_loss: int = 200
    hidden: tuple[int, ...] = HIDDEN

    @property
    def user_features(self) -> tuple[str, ...]:
        return (("user_id",) if self.user_id else ()) + DEMOGRAPHICS


def parse_set(setup: Setup, items: list[str]) -> Setup:
    """``key=value`` overrides of ``Setup`` fields (tuples comma-separated)."""
    fields = {f.name: f for f in dataclasses.fields(Setup)}
    changes = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--set {item!r}: unknown key, expected one of {sorted(fields)}")
        default = getattr(setup, key)
        if isinstance(default, bool):
            changes[key] = value.lower() in ("1", "true", "yes")
        elif isinstance(default, tuple):
            changes[key] = tuple(v for v in value.split(",") if v)
        else:
            changes[key] = type(default)(value)
    return dataclasses.replace(setup, **changes)


def make_embedding(setup: Setup, seed: int) -> ShardedHashEmbedding:
    """One table per feature: features sharing a table would share the rows of equal ids
    (genre 3 and item 3, age group 1 and occupation 1)."""
    names = ITEM_FEATURES + setup.user_features
    tables = [TableConfig(n, DIM, optimizer=Adagrad(setup.sparse_lr), seed=seed) for n in names]
    features = [FeatureConfig(n, n, combiner="mean" if n in MULTI_HOT else None) for n in names]
    return ShardedHashEmbedding(tables, features)


def make_tower(setup: Setup, seed: int) -> MeLUTower:
    return MeLUTower(ITEM_FEATURES, setup.user_features, DIM, tuple(int(u) for u in setup.hidden),
                     seed=seed)


def held_out(task_id: tf.Tensor, seed: int) -> tf.Tensor:
    """True for the warm users ``--validate`` scores (a seeded hash of the user id)."""
    key = tf.strings.as_string(task_id + 1_000_003 * (seed + 1))
    return tf.strings.to_hash_bucket_fast(key, VALIDATION_BUCKETS) == 0


def select_tasks(batch: dict, keep: tf.Tensor) -> dict:
    """The tasks of a batch where ``keep`` ``[T]`` is True."""
    out = {"task_id": tf.boolean_mask(batch["task_id"], keep)}
    for role in ("support", "query"):
        out[role] = {k: tf.boolean_mask(v, keep) for k, v in batch[role].items()}
    return out


def tasks_of(path: str, split: str, seed: int, validate: bool, train: bool, support,
             shuffle_seed, tasks: int = TASKS) -> tf.data.Dataset:
    """Task batches of a split; under ``validate``, the warm users are divided again."""
    ds = data.read_tasks(path, tasks, support, QUERY, split=split, shuffle_seed=shuffle_seed)
    if not validate:
        return ds
    ds = ds.map(lambda b: select_tasks(b, held_out(b["task_id"], seed) != train))
    return ds.filter(lambda b: tf.size(b["task_id"]) > 0)


def resampled_query(batch: dict, seed: tf.Tensor) -> dict:
    """Swaps each task's query rows with as many random real rows of its support set."""
    support, query = batch["support"], batch["query"]
    noise = tf.random.stateless_uniform(tf.shape(support["mask"]), seed)
    picked = tf.math.top_k(noise - 2.0 * (1.0 - support["mask"]),
                           k=tf.shape(query["mask"])[1]).indices            # [T, Q]
    swap = (tf.gather(support["mask"], picked, batch_dims=1) * query["mask"]) > 0
    tasks = tf.broadcast_to(tf.range(tf.shape(picked)[0])[:, None], tf.shape(picked))
    at = tf.stack([tasks, picked], axis=-1)                                  # [T, Q, 2]
    new_support, new_query = {}, {}
    for name in support:
        drawn = tf.gather(support[name], picked, batch_dims=1)
        cond = tf.reshape(swap, tf.concat([tf.shape(swap), tf.ones(tf.rank(drawn) - 2, tf.int32)],
                                          0))
        new_query[name] = tf.where(cond, drawn, query[name])
        new_support[name] = tf.tensor_scatter_nd_update(support[name], at,
                                                        tf.where(cond, query[name], drawn))
    return {"task_id": batch["task_id"], "support": new_support, "query": new_query}


def moved_to_query(batch: dict, extra: int, seed: tf.Tensor) -> dict:
    """Moves up to ``extra`` random support rows of each task to its query set (never more
    than half of its support rows): a larger outer-loop sample per training task."""
    support, query = batch["support"], batch["query"]
    noise = tf.random.stateless_uniform(tf.shape(support["mask"]), seed)
    k = tf.minimum(extra, tf.shape(support["mask"])[1])
    picked = tf.math.top_k(noise - 2.0 * (1.0 - support["mask"]), k=k).indices  # [T, k]
    half = tf.cast(tf.reduce_sum(support["mask"], axis=1), tf.int32) // 2
    move = tf.cast(tf.range(k)[None, :] < half[:, None], tf.float32)         # [T, k]
    tasks = tf.broadcast_to(tf.range(tf.shape(picked)[0])[:, None], tf.shape(picked))
    at = tf.stack([tasks, picked], axis=-1)
    new_support = dict(support)
    new_support["mask"] = tf.tensor_scatter_nd_update(
        support["mask"], at, tf.gather(support["mask"], picked, batch_dims=1) * (1.0 - move))
    new_query = {}
    for name in query:
        drawn = tf.gather(support[name], picked, batch_dims=1)
        if name == "mask":
            drawn = drawn * move
        new_query[name] = tf.concat([query[name], drawn], axis=1)
    return {"task_id": batch["task_id"], "support": new_support, "query": new_query}


def training_batches(path: str, seed: int, epoch: int, validate: bool,
                     resample: bool = False, extra_query: int = 0,
                     tasks: int = TASKS, support: int = SUPPORT_SLOTS) -> tf.data.Dataset:
    ds = tasks_of(path, "warm", seed, validate, True, support or None, seed * 1000 + epoch, tasks)
    if resample:
        ds = ds.enumerate().map(lambda i, b: resampled_query(
            b, tf.stack([tf.constant(seed * 1000 + epoch, tf.int64), i])))
    if extra_query:
        ds = ds.enumerate().map(lambda i, b: moved_to_query(
            b, extra_query, tf.stack([tf.constant(seed * 1000 + epoch + 500, tf.int64), i])))
    return ds


def scored_batches(path: str, seed: int, validate: bool) -> tf.data.Dataset:
    if validate:
        return tasks_of(path, "warm", seed, True, False, None, None)
    return tasks_of(path, "cold", seed, False, False, None, None)


def meta_config(setup: Setup, algorithm: str) -> MetaConfig:
    return MetaConfig(algorithm, inner_steps=setup.inner_steps, inner_lr=setup.inner_lr,
                      learn_inner_lr=bool(setup.learn_inner_lr) and algorithm != "reptile",
                      inner_lr_per_element=setup.learn_inner_lr.startswith("element"),
                      inner_lr_per_step=setup.learn_inner_lr.endswith("per_step"),
                      fast_weights=setup.fast_weights, adapt_embeddings=setup.adapt_embeddings,
                      multi_step_loss=setup.multi_step_loss if algorithm != "reptile" else 0)


def train_meta(path: str, algorithm: str, setup: Setup, seed: int, validate: bool) -> MetaModel:
    tf.keras.utils.set_random_seed(seed)
    embedding, tower = make_embedding(setup, seed), make_tower(setup, seed)
    head = RatingHead("rating", setup.mean_rating)
    if setup.pretrain_epochs:
        joint = CTRModel(embedding, tower, head)
        fit_jointly(joint, path, setup, seed, validate, setup.pretrain_epochs)
    model = MetaModel(embedding, tower, head, meta_config(setup, algorithm))
    outer_lr = setup.reptile_lr if algorithm == "reptile" else setup.outer_lr
    model.compile(optimizer=tf.keras.optimizers.Adam(outer_lr))
    step = tf.function(model.train_step, reduce_retracing=True)
    for epoch in range(setup.pretrain_epochs, setup.epochs):
        for batch in training_batches(path, seed, epoch, validate, setup.resample_query,
                                      setup.extra_query, setup.tasks_per_batch,
                                      setup.support_slots):
            step(batch)
    return model


def fit_jointly(model: CTRModel, path: str, setup: Setup, seed: int, validate: bool,
                epochs: int) -> CTRModel:
    """Trains on all rows (support and query) of the warm training users, Adam."""
    model.compile(optimizer=tf.keras.optimizers.Adam(setup.baseline_lr))
    step = tf.function(lambda b: model.train_step(task_rows(b)), reduce_retracing=True)
    for epoch in range(epochs):
        for batch in training_batches(path, seed, epoch, validate, setup.resample_query,
                                      tasks=setup.tasks_per_batch,
                                      support=setup.support_slots):
            step(batch)
    return model


def train_baseline(path: str, setup: Setup, seed: int, validate: bool) -> CTRModel:
    tf.keras.utils.set_random_seed(seed)
    model = CTRModel(make_embedding(setup, seed), make_tower(setup, seed),
                     RatingHead("rating", setup.mean_rating))
    return fit_jointly(model, path, setup, seed, validate, setup.epochs)


def scored(path: str, seed: int, validate: bool, predict, head) -> dict:
    report = evaluate_tasks(predict, scored_batches(path, seed, validate), head, k=3,
                            binary_label="label", relevance_label="rating")
    return {m: report.overall[m] for m in METRICS} | {"tasks": report.overall["tasks"]}


def run_seed(seed: int, setup: Setup, work: str, contenders: tuple[str, ...],
             validate: bool) -> dict:
    path = os.path.join(work, f"ml100k_seed{seed}")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        data.convert_movielens(str(ML100K), path, seed=seed)
    manifest = data.Manifest.load(path)
    out = {}
    for algorithm in (a for a in META if a in contenders):
        start = time.perf_counter()
        model = train_meta(path, algorithm, setup, seed, validate)
        predict = tf.function(model.adapted_predictions, reduce_retracing=True)
        out[algorithm] = scored(path, seed, validate, predict, model.head)
        if model.inner_lr_variables:
            out[algorithm]["inner_lr"] = {n: float(tf.reduce_mean(v))
                                          for n, v in model.inner_lr_variables.items()}
        print(f"seed {seed} {algorithm}: {out[algorithm]} ({time.perf_counter() - start:.0f}s)",
              flush=True)
    if {"baseline", "baseline_finetune"} & set(contenders):
        start = time.perf_counter()
        baseline = train_baseline(path, setup, seed, validate)
        for name, steps in (("baseline", 0), ("baseline_finetune", setup.inner_steps)):
            if name not in contenders:
                continue
            predict = fine_tuned_predictions(baseline, steps, setup.finetune_lr,
                                             setup.fast_weights, setup.adapt_embeddings)
            out[name] = scored(path, seed, validate, predict, baseline.head)
            print(f"seed {seed} {name}: {out[name]} ({time.perf_counter() - start:.0f}s)",
                  flush=True)
    out["split"] = {k: manifest.split.get(k) for k in ("warm_tasks", "cold_tasks")}
    return out


def summarize(runs: list[dict], contenders: tuple[str, ...]) -> dict:
    table = {}
    for c in contenders:
        table[c] = {}
        for m in METRICS:
            values = np.array([r[c][m] for r in runs])
            table[c][m] = {"mean": round(float(values.mean()), 4),
                           "std": round(float(values.std()), 4)}
    return table


def print_table(table: dict, seeds: list[int], users: str) -> None:
    print(f"\n{users} users, mean +- std over seeds {seeds}")
    print(f"{'model':<20}" + "".join(f"{m:>20}" for m in METRICS))
    for c, row in table.items():
        print(f"{c:<20}" + "".join(f"{row[m]['mean']:>12.4f} +-{row[m]['std']:.4f}"
                                   for m in METRICS))


def paired_differences(runs: list[dict], contenders: tuple[str, ...],
                       reference: str = "baseline_finetune") -> dict:
    """Per meta model and metric: its value minus the reference's on the same seed (same
    split, users and initial weights), each seed's and their mean. Signed so that > 0 is
    better (MAE: reference minus model)."""
    out = {}
    if reference not in contenders:
        return out
    for c in (c for c in META if c in contenders):
        out[c] = {}
        for m in METRICS:
            sign = -1.0 if m == "mae" else 1.0
            diffs = [round(sign * (r[c][m] - r[reference][m]), 4) for r in runs]
            out[c][m] = {"per_seed": diffs, "mean": round(float(np.mean(diffs)), 4),
                         "better_on_seeds": sum(d > 0 for d in diffs)}
    return out


def meta_beats_baselines(table: dict) -> dict:
    """Per metric: does the best meta model beat both baselines (higher AUC and nDCG,
    lower MAE)?"""
    out = {}
    for m in METRICS:
        sign = -1.0 if m == "mae" else 1.0
        meta = [sign * table[c][m]["mean"] for c in META if c in table]
        base = [sign * table[c][m]["mean"] for c in ("baseline", "baseline_finetune")
                if c in table]
        if meta and base:
            out[m] = max(meta) > max(base)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, few epochs")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated split/init seeds")
    parser.add_argument("--epochs", type=int, default=None, help="passes over the warm users")
    parser.add_argument("--validate", action="store_true",
                        help="score held-out warm users instead of the cold users (tuning)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override fields of Setup")
    parser.add_argument("--work", help="keep converted datasets here (reused across runs)")
    args = parser.parse_args()
    if not ML100K.is_dir():
        raise SystemExit(f"MovieLens 100K not found at {ML100K}")
    setup = parse_set(Setup(), args.set)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    if args.epochs or args.quick:
        setup = dataclasses.replace(setup, epochs=args.epochs or 3)
    contenders = tuple(c for c in CONTENDERS if c in args.contenders.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or tmp
        os.makedirs(work, exist_ok=True)
        runs = [run_seed(s, setup, work, contenders, args.validate) for s in seeds]
    table = summarize(runs, contenders)
    print_table(table, seeds, "held-out warm" if args.validate else "cold")
    print(json.dumps({"benchmark": "cold_start", "dataset": "ml-100k", "seeds": seeds,
                      "scored": "held-out warm users" if args.validate else "cold users",
                      "setup": dataclasses.asdict(setup), "table": table, "runs": runs,
                      "meta_beats_baselines": meta_beats_baselines(table),
                      "paired_vs_baseline_finetune": paired_differences(runs, contenders),
                      "reference_melu_ml1m": {"melu5_mae": 0.785, "wide_deep_mae": 1.069}}))


if __name__ == "__main__":
    main()
