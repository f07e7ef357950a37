"""Hybrid training (PERSIA) and MixCache (ScaleFreeCTR), side by side with synchronous training.

    horovodrun -np 2 -H localhost:2 python -m benchmarks.hybrid [--quick] [--repeats R]
        [--only {zipf,speed,cache,criteo}] [--batch-size B] [--epochs E] [--replicates N]
        [--fixed-init] [--s0-replicates K]

--only zipf runs part 1 alone, --only criteo part 2 alone, --only cache the cache figures
alone (part 1 with hybrid_s0, hybrid_s4 and their cached contenders only), --only speed
the uncached contenders (sync, hybrid s = 0, 1, 2, 4) each built and traced once, then
timed on fresh batches in every repeat (what benchmarks.cluster runs across hosts).

Part 1, throughput on the Zipf benchmark batch (benchmarks/embedding_batches.py: global
batch 65536 x 26 ids, Zipf(1.1), one id range per feature; --quick: 8192), one sharded
table of dim 16 (Adagrad 0.05) under a DLRM-style MLP (416 -> 64 -> 1, Adam 1e-3, labels
drawn per step). Each rank trains on its half of each global batch. Contenders, each from
empty tables on the same 6 batches (batch 0 warms up and traces, batches 1-5 are timed):

    sync          the plain ShardedHashEmbedding step (exchange in the call, update in backward)
    hybrid_s{0,1,2,4}  HybridTrainer with staleness 0 (synchronous schedule), 1, 2, 4
    hybrid_s0_cache1, hybrid_s0_cache5   hybrid s=0 with a MixCache holding 1% / 5% of the
                  ids the run sees (split over the owners), min_count 1, never rebalanced:
                  lookups admit by exact frequency (gmeta_tf.embedding.hash_table)
    hybrid_s4_cache1   hybrid s=4 with the 1% cache

samples/s = timed samples / wall time, the median over --repeats (default 7; each repeat
runs every contender once, starting one further along the list). `ratio_X_vs_Y` is the
ratio of the medians, `ratio_paired_X_vs_Y` the median of the ratios within a repeat (the
drift of a shared machine between repeats cancels; the target's figure).
Cache hit rate (id occurrences served from the cache, all 6 batches, both owners) is set
against an oracle caching the most frequent 1% / 5% of the run's distinct ids, computed
here on the same batches: `cache_hit_vs_oracle`. A cache that learns its ids as they come
cannot serve an id's first occurrence: `cache_hit_bound_first_sight` is the oracle's hit
rate with each of its ids' first occurrence missed, a reference for what is within reach
(not a hard ceiling: a cache whose ids change over time can beat any static set).

Figures (2 ranks, batch 65536; hit rates are deterministic, samples/s are from a machine
of 2 cores shared with other work, load ~3, so +-20%):

    cache   hit rate  oracle  cache_hit_vs_oracle  first-sight reference
    1%      0.5468    0.5489  0.9962               0.9931
    5%      0.5942    0.6242  0.9519               0.9697
    (min_count 2 instead of 1: 0.9962 / 0.9504)

The sync figures just below were taken while the synchronous contender made a new
tf.function on every fit call, and so re-traced its step inside its timed window (the
hybrid contenders did not): they understate sync, and the hybrid / sync ratios in them
are too high. Since then every contender's step is made once and traced on its warm-up
batch, outside the timed window; the current figures (--only speed, and across hosts
benchmarks.cluster) are in the README. Kept for the cache figures and history:

Throughput, nothing else running (load from the benchmark itself, ~3-4), two runs of

    horovodrun -np 2 -H localhost:2 python -m benchmarks.hybrid --only zipf   (7 repeats, 2 min)
    samples/s (medians)  sync 218k / 213k, hybrid_s0 227k / 236k, s1 240k / 231k,
                         s2 233k / 241k, s4 235k / 233k,
                         s0_cache1 210k / 217k, s0_cache5 208k / 208k, s4_cache1 221k / 220k
    paired hybrid / sync        s0 1.06 / 1.10, s1 1.08 / 1.11, s2 1.07 / 1.11, s4 1.04 / 1.11
    paired hybrid s / hybrid s0  s1 1.03 / 0.99, s2 1.00 / 1.05, s4 0.99 / 0.97

Single repeats vary by +-10%, hence 7: a 3-repeat run put hybrid s4 at 0.98x sync (ratio
of medians), four 7-repeat runs at 1.02-1.10x (ratio of medians; paired 1.04 and 1.11 in
the two runs above).

Hybrid is faster than the synchronous step, but through its split-phase step (pull,
dense, push as three graphs); the overlap itself adds nothing measurable here, since both
ranks already keep both cores busy and there is little idle time for the pulls to fill (on
GPUs and a network, the all-to-alls' latency is what it hides). Before the dense step used
the op library's parallel gather (with tf.gather's IndexedSlices gradient) every hybrid
contender was 0.89-0.92x sync in the same conditions. On CPU a cache costs ~10% (every
unique id probes the cache index first); it pays on a GPU, where hits skip host memory.

Before lookups admitted by exact frequency (only ids new to the table entered on first
sight; the 5% cache re-filled from a full export of the shard every step): 0.9795 /
0.9396 of the oracle, and s0_cache5 ran at 85k-89k samples/s in the same conditions.

Part 2, quality on ../shared/data/criteo (issue #7: dev AUC of hybrid s=4 within 0.002 of
synchronous): a DLRM tower (gmeta_tf.models.DLRMTower, 26 categorical features in one
sharded table of dim 8, 13 log-transformed integers) trained for --epochs epochs (default
8) by sync and by hybrid s=4 (global batch 256, 28 steps an epoch), for --replicates
training runs (default 32). Replicate r starts from initial state r (the tower's weights
and the table's new rows are seeded by r) and trains on batch order 3 + r; within a
replicate both contenders start from the same state and see the same batches: paired.
Reported: the mean dev AUC of both; the mean paired difference hybrid - sync with its
standard error over the replicates (sd / sqrt(replicates), `dev_auc_diff_stderr`), a 95% t
interval and each replicate's pair; as the noise the pairing removes, the sd and range of
sync's AUC over the replicates. Dev has only 409 rows, a sample itself: bootstrap standard
errors of the mean difference resampling its rows (paired; runs fixed, then runs
resampled too) say how much of the figure is this dev set's draw, which more replicates
cannot remove. An extra view, not the issue's figure: the same comparison on dev + test
pooled (800 labelled rows, neither trained on), `devtest_*`. Sanity: the first
--s0-replicates replicates (default 1) also train hybrid s=0, which must be sync exactly:
`dev_auc_s0_minus_sync`, `score_max_abs_diff_s0_vs_sync`. --fixed-init starts every
replicate from initial state 0 (only the batch order varies), the design of the first
figures below.

Why 8 epochs: sync's dev AUC, mean over orders 3-8 after each epoch 1-12, is 0.6326
0.6694 0.6778 0.6766 0.6787 0.6830 0.6862 0.6871 0.6864 0.6862 0.6792 0.6750: still
rising at 4, highest at 8, then overfitting.

Figures (2 ranks; deterministic: a re-run gives the same AUCs; wall time on 2 cores):

    horovodrun -np 2 -H localhost:2 python -m benchmarks.hybrid --only criteo   (6.6 min)
    8 epochs, 32 replicates   dev AUC sync 0.6890, hybrid s=4 0.6886 (staleness mean 3.96)
      paired diff hybrid - sync  -0.00039, stderr 0.00055, 95% [-0.0015, +0.0007]
      per replicate  -0.0002 -0.0029 +0.0047 -0.0058 -0.0016 -0.0010 +0.0010 +0.0009
                     +0.0036 -0.0031 -0.0001 +0.0016 -0.0030 +0.0031 -0.0026 +0.0019
                     +0.0010 +0.0005 -0.0058 -0.0054 -0.0016 +0.0026 +0.0035 -0.0006
                     +0.0024 -0.0079 +0.0023 -0.0012 -0.0004 +0.0026 +0.0019 -0.0029
      sync over replicates: sd 0.0088, range 0.0389 (the noise the pairing removes)
      bootstrap stderr of the diff: dev rows 0.0014, runs and rows 0.0016
      dev+test (800 rows): 0.7060 vs 0.7055, diff -0.00054, stderr 0.00036 (runs),
                 0.0012 (runs and rows)
      hybrid s=0 - sync: 0 (every score identical)

    ... --only criteo --fixed-init --replicates 16   (the first design: initial state 0)
    8 epochs, 16 orders   dev AUC sync 0.6873, hybrid s=4 0.6850
      paired diff -0.00236, stderr 0.00037, 95% [-0.0031, -0.0016]
      dev+test (800 rows): diff -0.00188, stderr 0.00037
    ... --fixed-init --replicates 16 --epochs 4
      paired diff +0.00250, stderr 0.00021, 95% [+0.0021, +0.0029]; dev+test -0.00120

Why the initial state varies: with one initial state the paired difference is that
state's, and the state is as arbitrary as the batch order. Over six initial states x
batch orders 3-6 (a one-off run outside this script) the mean dev difference per state
was -0.0022 -0.0003 +0.0017 -0.0017 -0.0003 -0.0014: state 0, the one the first design
fixed, was the least favourable of the six, and the sd over states (0.0014) dwarfs the
stderr over orders within one (0.0004). Changes that do not touch staleness at all move
this dev set as much: starting the rows of the 1,024 most frequent ids at zero instead of
their seeded initial values (at s=0, state 0, orders 3-6) read +0.0068 against sync on
dev (and -0.0014 on test). So a difference of 0.002 on dev is only resolved by averaging
over whole training runs; the stderr above is that average's.

What staleness costs, and what did not reduce it: s=0 is sync bit for bit, and with one
initial state the cost grew with s (orders 3-8: s=1 -0.0006, s=2 -0.0013, s=4 -0.0026),
so s=4 does cost a little; over runs it is -0.0004 +- 0.0006 on dev and -0.0005 +- 0.0004
on dev+test. Delay compensation of the stale row gradients (DC-ASGD: the owner adds
lambda * g * g * (w_now - w_pulled)) was tried on 1,200 rows held out of train, orders 3-6,
initial state 0: hybrid s=4 - sync was -0.0015 without it, -0.0022 / -0.0025 / -0.0037
with lambda 100 / 1000 / 10000, and -0.0018 / -0.0019 / -0.0022 with the Gauss-Newton
diagonal from labels sampled from the model (B * g~^2; lambda 0.5 / 1 / 2): no better, so
it is not in the trainer. What looks more promising, prototyped outside the trainer:
training the 1,024 most frequent ids (70% of the lookups) synchronously, replicated on
every rank with all-reduced gradients, and only the rest with staleness s=4. Over 8
replicates (states 0-7, orders 3-10) it read +0.0009 on dev and -0.0002 on test against
sync, where plain s=4 read -0.0006 / -0.0008 (at s=0 it equals sync: +0.0001 / 0.0000);
within noise (stderr ~0.001), so not built. On this 7,200-row sample s=4 is a seventh of
an epoch of missing updates, far more than on a full-size data set.

The last stdout line (rank 0) is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from benchmarks.arguments import comma_separated
from benchmarks.embedding_batches import BatchSpec, make_batch
from gmeta_tf import distributed
from gmeta_tf.embedding import (
    Adagrad,
    FeatureConfig,
    MixCacheConfig,
    ShardedHashEmbedding,
    TableConfig,
    table_ops,
)
from gmeta_tf.training.hybrid import HybridTrainer

REPO = Path(__file__).resolve().parent.parent
CRITEO = REPO.parent / "shared" / "data" / "criteo"
NUM_BATCHES = 6
FEATURES = 26
DIM = 16
CACHE_FRACTIONS = {"cache1": 0.01, "cache5": 0.05}
# Re-fill period of each cache (steps; 0: never). Lookups admit by exact frequency, ids
# that turn hot included, so neither cache needs one.
REBALANCE_EVERY = {"cache1": 0, "cache5": 0}
# Occurrences before an id may enter: 1, so no slot idles while the cache fills (a full
# cache admits only ids more frequent than its coldest anyway).
CACHE_MIN_COUNT = 1
CONTENDERS = ("sync", "hybrid_s0", "hybrid_s1", "hybrid_s2", "hybrid_s4", "hybrid_s0_cache1",
              "hybrid_s0_cache5", "hybrid_s4_cache1")
SPEED_CONTENDERS = ("sync", "hybrid_s0", "hybrid_s1", "hybrid_s2", "hybrid_s4")
CACHE_CONTENDERS = ("hybrid_s0", "hybrid_s4", "hybrid_s0_cache1", "hybrid_s0_cache5",
                    "hybrid_s4_cache1")
ORACLE_TARGET = 0.95
ZIPF_REPEATS = 7  # --repeats of part 1: hybrid's edge (~5%) is inside one repeat's noise
# Part 2: batch orders are seeds 3, 4, ... (3-5 were the orders of the first figures).
CRITEO_FIRST_SEED = 3
# --replicates: each one a fresh initial state (seed r: tower weights and table rows) and
# batch order (seed 3 + r), trained both ways. The per-replicate difference has sd ~0.003,
# so 32 give a standard error ~0.0005.
CRITEO_REPLICATES = 32
CRITEO_EPOCHS = 8   # --epochs: where sync's mean dev AUC peaks (still rising at 4)
CRITEO_S0_REPLICATES = 1  # replicates that also train hybrid s=0 (the sanity figure)


def log(msg: str) -> None:
    if distributed.is_chief():
        print(msg, flush=True)


# ---- shared training loops --------------------------------------------------------------

def sync_step(emb, loss_fn, dense, optimizer):
    """The synchronous step: the layer's own exchange and fused update, as in CTRModel.
    Made once per contender, so its warm-up batch traces it outside the timed window (as
    the hybrid contenders' trainers trace theirs)."""

    @tf.function(reduce_retracing=True)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(emb(batch, training=True), batch)
        grads = tape.gradient(loss, dense + emb.trainable_variables)
        optimizer.apply_gradients(zip(distributed.allreduce_gradients(grads[:len(dense)]), dense))
        return loss

    return step


class Contender:
    """A fresh model (empty tables, seeded dense weights) trained one way."""

    def __init__(self, name: str, emb: ShardedHashEmbedding, loss_fn, dense, optimizer):
        self.name = name
        self.emb, self.loss_fn, self.dense, self.optimizer = emb, loss_fn, dense, optimizer
        staleness = int(name.split("_s")[1].split("_")[0]) if name.startswith("hybrid") else None
        self.trainer = (None if staleness is None else
                        HybridTrainer(emb, loss_fn, dense, optimizer, staleness=staleness))
        self.sync_step = (sync_step(emb, loss_fn, dense, optimizer) if self.trainer is None
                          else None)

    def fit(self, batches) -> None:
        if self.trainer is None:
            for batch in batches:
                self.sync_step(batch)
        else:
            self.trainer.fit(batches)


# ---- part 1: Zipf throughput and cache hit rate -----------------------------------------

class ZipfTower(tf.keras.layers.Layer):
    """An MLP over the 26 rows of a sample (416 -> hidden... -> 1)."""

    def __init__(self, hidden_units: tuple[int, ...] = (64,), **kwargs):
        super().__init__(**kwargs)
        self.hidden = [tf.keras.layers.Dense(n, activation="relu") for n in hidden_units]
        self.out = tf.keras.layers.Dense(1)

    def call(self, rows):  # [B, 26, 16]
        x = tf.reshape(rows, [-1, FEATURES * DIM])
        for layer in self.hidden:
            x = layer(x)
        return tf.squeeze(self.out(x), -1)


def zipf_batches(spec: BatchSpec) -> list[np.ndarray]:
    return [make_batch(spec, step) for step in range(NUM_BATCHES)]


def local_zipf(global_ids: np.ndarray, step: int) -> dict:
    size, rank = distributed.size(), distributed.rank()
    n = global_ids.shape[0]
    lo, hi = rank * n // size, (rank + 1) * n // size
    labels = np.random.default_rng([7, step]).integers(0, 2, n).astype(np.float32)
    return {"ids": tf.constant(global_ids[lo:hi]), "label": tf.constant(labels[lo:hi])}


def oracle_hit_rates(batches: list[np.ndarray]) -> tuple[dict, dict, int]:
    """Hit rate of a static cache of the run's most frequent ids, per cache fraction, and
    the same with each of those ids' first occurrence missed (a reference for a cache that
    learns its ids as they come)."""
    ids = np.concatenate([b.ravel() for b in batches])
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    rates, first_sight = {}, {}
    for k, f in CACHE_FRACTIONS.items():
        top = int(f * counts.size)
        rates[k] = float(counts[:top].sum() / ids.size)
        first_sight[k] = float((counts[:top].sum() - top) / ids.size)
    return rates, first_sight, int(counts.size)


def make_zipf_contender(name: str, distinct_ids: int,
                        hidden_units: tuple[int, ...] = (64,)) -> Contender:
    caches = None
    for key, fraction in CACHE_FRACTIONS.items():
        if name.endswith(key):  # per owner: its share of fraction x the ids the run sees
            capacity = math.ceil(fraction * distinct_ids / distributed.size())
            caches = {"ids": MixCacheConfig(capacity=capacity, min_count=CACHE_MIN_COUNT,
                                            rebalance_every=REBALANCE_EVERY[key])}
    tf.keras.utils.set_random_seed(0)
    emb = ShardedHashEmbedding([TableConfig("ids", DIM, optimizer=Adagrad(0.05))],
                               [FeatureConfig("ids", "ids")], caches=caches, name=f"emb_{name}")
    emb.build(None)
    tower = ZipfTower(hidden_units)
    tower(tf.zeros([1, FEATURES, DIM]))
    distributed.broadcast_variables(tower.trainable_variables)

    def loss_fn(embedded, batch):
        logits = tower(embedded["ids"])
        return tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"], logits=logits))

    return Contender(name, emb, loss_fn, tower.trainable_variables,
                     tf.keras.optimizers.Adam(1e-3))


def free_tables(emb: ShardedHashEmbedding) -> None:
    """Frees a finished contender's tables now: traced functions keep the layer (and so
    its tables) alive, and 16 contenders' tables of ~2M rows each exhaust the host."""
    for shard in emb.shards.values():
        table_ops.destroy_table(shard.handle)
    gc.collect()


def global_hit_rate(stats: dict) -> float:
    """Hits / lookups summed over the ranks (each rank owns its share of the ids)."""
    local = tf.constant([float(stats["hits"]), float(stats["lookups"])], tf.float64)
    hits, lookups = (distributed.allreduce_gradients([local])[0] * distributed.size()).numpy()
    return float(hits / lookups) if lookups else 0.0


def run_zipf(spec: BatchSpec, repeats: int, contenders: tuple[str, ...] = CONTENDERS) -> dict:
    batches = zipf_batches(spec)
    oracle, first_sight, distinct = oracle_hit_rates(batches)
    log(f"[zipf] batch {spec.batch_size} x {FEATURES}, {NUM_BATCHES} batches, {distinct} "
        f"distinct ids; oracle hit rate {oracle}")
    local = [local_zipf(b, s) for s, b in enumerate(batches)]
    timed_samples = spec.batch_size * (NUM_BATCHES - 1)
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    hit_rates: dict[str, float] = {}
    for rep in range(repeats):
        # Each repeat runs every contender once, starting one further along the list, so
        # no contender always runs first or right after the same neighbour.
        for name in contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]:
            contender = make_zipf_contender(name, distinct)
            contender.fit(local[:1])  # warm-up: tracing, first table growth
            distributed.barrier()
            start = time.perf_counter()
            contender.fit(local[1:])
            distributed.barrier()
            elapsed = time.perf_counter() - start
            rates[name].append(timed_samples / elapsed)
            stats = contender.emb.cache_stats().get("ids")
            if stats is not None and rep == 0:  # the same every repeat (deterministic)
                hit_rates[name] = global_hit_rate(stats)
            log(f"[zipf] rep {rep} {name}: {timed_samples / elapsed:,.0f} samples/s"
                + (f", cache hit rate {hit_rates[name]:.4f}" if stats else ""))
            free_tables(contender.emb)
    median = {name: statistics.median(r) for name, r in rates.items()}
    out = {f"samples_per_s_{name}": round(v, 1) for name, v in median.items()}
    for name in contenders:
        bases = (["hybrid_s4"] if name == "hybrid_s4_cache1" else ["hybrid_s0"] if "cache" in name
                 else ["sync", "hybrid_s0"] if name != "hybrid_s0" else ["sync"])
        for base in bases if name != "sync" else []:
            if base in median and base != name:
                out[f"ratio_{name}_vs_{base}"] = round(median[name] / median[base], 3)
                # Paired: the median over repeats of the two rates' ratio within a repeat
                # (the machine's drift between repeats cancels).
                out[f"ratio_paired_{name}_vs_{base}"] = round(statistics.median(
                    a / b for a, b in zip(rates[name], rates[base])), 3)
    out["batch_size"] = spec.batch_size
    out["distinct_ids"] = distinct
    out["cache_capacity_per_owner"] = {
        key: math.ceil(f * distinct / distributed.size()) for key, f in CACHE_FRACTIONS.items()}
    out["cache_rebalance_every"] = {"1%": REBALANCE_EVERY["cache1"],
                                    "5%": REBALANCE_EVERY["cache5"]}
    out["cache_min_count"] = CACHE_MIN_COUNT
    out["cache_hit_rate"] = {"1%": round(hit_rates["hybrid_s0_cache1"], 4),
                             "5%": round(hit_rates["hybrid_s0_cache5"], 4),
                             "1%_hybrid_s4": round(hit_rates["hybrid_s4_cache1"], 4)}
    out["oracle_hit_rate"] = {"1%": round(oracle["cache1"], 4), "5%": round(oracle["cache5"], 4)}
    out["cache_hit_vs_oracle"] = {
        "1%": round(hit_rates["hybrid_s0_cache1"] / oracle["cache1"], 4),
        "5%": round(hit_rates["hybrid_s0_cache5"] / oracle["cache5"], 4)}
    out["cache_hit_bound_first_sight"] = {
        "1%": round(first_sight["cache1"], 4), "5%": round(first_sight["cache5"], 4),
        "1%_vs_oracle": round(first_sight["cache1"] / oracle["cache1"], 4),
        "5%_vs_oracle": round(first_sight["cache5"] / oracle["cache5"], 4)}
    out["samples_per_s_all_repeats"] = {k: [round(x, 1) for x in v] for k, v in rates.items()}
    return out


def run_speed(spec: BatchSpec, repeats: int, contenders: tuple[str, ...] = SPEED_CONTENDERS,
              timed_batches: int = NUM_BATCHES - 1,
              hidden_units: tuple[int, ...] = (64,)) -> dict:
    """--only speed: each contender built once and traced on its warm-up batch, then timed
    in every repeat on that repeat's fresh batches (the same for every contender; order
    rotated per repeat). Tracing stays out of every timed window, and costs once per
    contender, not once per repeat."""
    steps = 1 + repeats * timed_batches
    local = [local_zipf(make_batch(spec, s), s) for s in range(steps)]
    made = {name: make_zipf_contender(name, 0, hidden_units) for name in contenders}
    for contender in made.values():
        contender.fit(local[:1])  # warm-up: tracing, first table growth
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    # Of a hybrid contender's timed window, the share its main thread spent in dense steps
    # (forward, backward, the all-reduce, the optimizer) and waiting for pulled rows.
    shares: dict[str, dict[str, list[float]]] = {
        name: {"dense": [], "wait_for_rows": []} for name in contenders
        if made[name].trainer is not None}
    timed_samples = spec.batch_size * timed_batches
    for rep in range(repeats):
        window = local[1 + rep * timed_batches:1 + (rep + 1) * timed_batches]
        for name in contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]:
            trainer = made[name].trainer
            before = trainer.metrics() if trainer is not None else None
            distributed.barrier()
            start = time.perf_counter()
            made[name].fit(window)
            distributed.barrier()
            elapsed = time.perf_counter() - start
            rates[name].append(timed_samples / elapsed)
            if trainer is not None:
                after = trainer.metrics()
                for part, key in (("dense", "dense_s"), ("wait_for_rows", "wait_for_rows_s")):
                    shares[name][part].append((after[key] - before[key]) / elapsed)
            log(f"[speed] rep {rep} {name}: {rates[name][-1]:,.0f} samples/s")
    out = {f"samples_per_s_{n}": round(statistics.median(r), 1) for n, r in rates.items()}
    out["window_share_median"] = {n: {part: round(statistics.median(v), 3)
                                      for part, v in parts.items()}
                                  for n, parts in shares.items()}
    for name in contenders:
        for base in ("sync", "hybrid_s0"):
            if name != base and base in rates and not (base == "hybrid_s0" and name == "sync"):
                out[f"ratio_paired_{name}_vs_{base}"] = round(statistics.median(
                    a / b for a, b in zip(rates[name], rates[base])), 3)
    out["batch_size"] = spec.batch_size
    out["hidden_units"] = list(hidden_units)
    out["timed_batches_per_repeat"] = timed_batches
    out["samples_per_s_all_repeats"] = {k: [round(x, 1) for x in v] for k, v in rates.items()}
    return out


# ---- part 2: Criteo dev AUC, sync vs hybrid s=4 -----------------------------------------

def read_criteo(path: Path) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from gmeta_tf.data import hashing

    ints = [f"I{i}" for i in range(1, 14)]
    cats = [f"C{i}" for i in range(1, 27)]
    types = {"label": pa.float64(), **{c: pa.float64() for c in ints},
             **{c: pa.string() for c in cats}}
    table = pacsv.read_csv(
        path, read_options=pacsv.ReadOptions(column_names=["label", *ints, *cats]),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True))
    dense = np.stack([np.log1p(np.maximum(np.nan_to_num(
        table.column(c).to_numpy(zero_copy_only=False), nan=0.0), 0.0)) for c in ints], 1)
    out = {c: hashing.to_ids(table.column(c), c) for c in cats}
    out["dense"] = dense.astype(np.float32)
    out["label"] = table.column("label").to_numpy(zero_copy_only=False).astype(np.float32)
    return out


def criteo_batches(data: dict, global_batch: int, epochs: int, seed: int = 3) -> list[dict]:
    n = data["label"].size
    size, rank = distributed.size(), distributed.rank()
    batches = []
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(n)
        for start in range(0, n - global_batch + 1, global_batch):
            idx = order[start:start + global_batch]
            idx = idx[rank * global_batch // size:(rank + 1) * global_batch // size]
            batches.append({k: tf.constant(v[idx]) for k, v in data.items()})
    return batches


def t_quantile_975(df: int) -> float:
    """Student's t 97.5% quantile (two-sided 95%), tabulated to df 30, normal beyond."""
    table = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201,
             2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074,
             2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
    return table[df - 1] if 1 <= df <= len(table) else 1.96


def paired(a: list[float], b: list[float]) -> dict:
    """Mean of b - a over the replicates, its standard error (sample sd / sqrt(n)) and a
    95% Student-t interval."""
    diffs = np.subtract(b, a)
    n = diffs.size
    stderr = float(diffs.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    half = t_quantile_975(n - 1) * stderr if n > 1 else float("nan")
    return {"mean": float(diffs.mean()), "stderr": stderr,
            "ci95": [float(diffs.mean() - half), float(diffs.mean() + half)], "diffs": diffs}


def bootstrap_stderr(labels: np.ndarray, a: list[np.ndarray], b: list[np.ndarray],
                     resample_runs: bool, replicates: int = 1000) -> float:
    """Bootstrap standard error of the mean over training runs of AUC(b) - AUC(a),
    resampling the scored rows (the same rows for every run and both contenders: paired)
    and, if resample_runs, the runs too."""
    from gmeta_tf.meta.metrics import auc

    rng = np.random.default_rng(0)
    n, runs = labels.size, len(a)
    means = []
    for _ in range(replicates):
        rows = rng.integers(0, n, n)
        picked = rng.integers(0, runs, runs) if resample_runs else range(runs)
        means.append(np.mean([auc(labels[rows], b[o][rows]) - auc(labels[rows], a[o][rows])
                              for o in picked]))
    return float(np.std(means, ddof=1))


def run_criteo(epochs: int, global_batch: int, replicates: int, s0_replicates: int,
               fixed_init: bool = False) -> dict:
    from gmeta_tf.meta.metrics import auc
    from gmeta_tf.models import BinaryHead, DLRMTower

    start = time.perf_counter()
    train, dev = read_criteo(CRITEO / "train.tsv"), read_criteo(CRITEO / "dev.tsv")
    test = read_criteo(CRITEO / "test.tsv")
    cats = [f"C{i}" for i in range(1, 27)]
    # Scored: dev (the headline) and test; "dev+test" pools both (800 labelled rows never
    # trained on) for a second, less noisy view of the same paired comparison.
    evals = {"dev": dev, "test": test}
    eval_tensors = {k: {c: tf.constant(v) for c, v in d.items()} for k, d in evals.items()}
    devtest_labels = np.concatenate([dev["label"], test["label"]])
    # Replicate r: initial state r (0 for all with fixed_init) and batch order 3 + r.
    runs = [(0 if fixed_init else r, CRITEO_FIRST_SEED + r) for r in range(replicates)]
    names = ("sync", "hybrid_s4")
    aucs: dict[str, dict[str, list[float]]] = {k: {n: [] for n in names}
                                               for k in ("dev", "devtest")}
    devtest_scores: dict[str, list[np.ndarray]] = {n: [] for n in names}
    s0: dict[str, list[float]] = {"dev_auc_diff": [], "score_max_abs_diff": []}
    result: dict = {}
    # Paired runs: each replicate trained both ways from the same initial state (tables
    # start empty, new rows are a function of (init, id); the tower's initial weights are
    # seeded by init, then broadcast from rank 0) on the same batches.
    for i, (init, seed) in enumerate(runs):
        batches = criteo_batches(train, global_batch, epochs, seed=seed)
        scores: dict[str, dict[str, np.ndarray]] = {}
        for name in names + (("hybrid_s0",) if i < s0_replicates else ()):
            tf.keras.utils.set_random_seed(init)
            emb = ShardedHashEmbedding([TableConfig("cat", 8, optimizer=Adagrad(0.05),
                                                    seed=init)],
                                       [FeatureConfig(c, "cat") for c in cats],
                                       name=f"criteo_{name}_{init}_{seed}")
            emb.build(None)
            tower = DLRMTower(cats, 8, {"dense": 13}, bottom_units=(32,), top_units=(64, 32))
            tower.build(None)
            distributed.broadcast_variables(tower.trainable_variables)
            head = BinaryHead("label")

            def loss_fn(embedded, batch, tower=tower, head=head):
                logits = tower({**embedded, "dense": batch["dense"]})
                return tf.reduce_mean(head.row_loss(batch["label"], logits))

            contender = Contender(name, emb, loss_fn, tower.trainable_variables,
                                  tf.keras.optimizers.Adam(1e-3))
            contender.fit(batches)

            @tf.function(reduce_retracing=True)
            def predict(features, emb=emb, tower=tower, head=head):
                embedded = emb({c: features[c] for c in cats}, training=False)
                return head.predict(tower({**embedded, "dense": features["dense"]}))

            # Every rank scores all of each set (the lookups are collective).
            scores[name] = {k: predict(t).numpy() for k, t in eval_tensors.items()}
            if contender.trainer is not None and name == "hybrid_s4":
                metrics = contender.trainer.metrics()
                result[f"staleness_max_{name}"] = metrics["staleness_max"]
                result[f"staleness_mean_{name}"] = round(metrics["staleness_mean"], 3)
            free_tables(emb)
        for name in names:
            devtest_scores[name].append(np.concatenate([scores[name]["dev"],
                                                        scores[name]["test"]]))
            aucs["dev"][name].append(auc(dev["label"], scores[name]["dev"]))
            aucs["devtest"][name].append(auc(devtest_labels, devtest_scores[name][-1]))
        if "hybrid_s0" in scores:
            s0["dev_auc_diff"].append(auc(dev["label"], scores["hybrid_s0"]["dev"])
                                      - aucs["dev"]["sync"][-1])
            s0["score_max_abs_diff"].append(max(
                float(np.max(np.abs(scores["hybrid_s0"][k] - scores["sync"][k]))) for k in evals))
        log(f"[criteo] init {init} order {seed} ({i + 1}/{replicates}): dev AUC sync "
            f"{aucs['dev']['sync'][-1]:.4f} hybrid_s4 {aucs['dev']['hybrid_s4'][-1]:.4f} (diff "
            f"{aucs['dev']['hybrid_s4'][-1] - aucs['dev']['sync'][-1]:+.4f}); dev+test diff "
            f"{aucs['devtest']['hybrid_s4'][-1] - aucs['devtest']['sync'][-1]:+.4f}"
            + (f"; s0 - sync {s0['dev_auc_diff'][-1]:+.6f}" if "hybrid_s0" in scores else "")
            + f" [{time.perf_counter() - start:.0f} s]")
    dev_diff = paired(aucs["dev"]["sync"], aucs["dev"]["hybrid_s4"])
    devtest_diff = paired(aucs["devtest"]["sync"], aucs["devtest"]["hybrid_s4"])
    sync_dev = np.asarray(aucs["dev"]["sync"])
    # dev_auc_diff_stderr above is the spread over training runs on this one dev set. The
    # rows scored are a sample too: bootstrap standard errors resampling them (paired),
    # with the runs fixed, then with the runs resampled as well. Chief only (cheap, but
    # the ranks would all compute the same).
    boot = {}
    if distributed.is_chief():
        n_dev = dev["label"].size
        dev_scores = {n: [x[:n_dev] for x in v] for n, v in devtest_scores.items()}
        boot = {
            "dev_auc_diff_stderr_dev_rows": bootstrap_stderr(
                dev["label"], dev_scores["sync"], dev_scores["hybrid_s4"], False),
            "dev_auc_diff_stderr_runs_and_rows": bootstrap_stderr(
                dev["label"], dev_scores["sync"], dev_scores["hybrid_s4"], True),
            "devtest_auc_diff_stderr_runs_and_rows": bootstrap_stderr(
                devtest_labels, devtest_scores["sync"], devtest_scores["hybrid_s4"], True),
        }
    result.update({
        "dev_auc_sync": round(float(sync_dev.mean()), 4),
        "dev_auc_hybrid_s4": round(float(np.mean(aucs["dev"]["hybrid_s4"])), 4),
        "dev_auc_diff_hybrid_s4_minus_sync": round(dev_diff["mean"], 5),
        # Standard error of the mean paired difference over the replicates, and its 95%
        # interval.
        "dev_auc_diff_stderr": round(dev_diff["stderr"], 5),
        "dev_auc_diff_ci95": [round(x, 5) for x in dev_diff["ci95"]],
        **{k: round(v, 5) for k, v in boot.items() if k.startswith("dev_")},
        # [initial state, batch order] of each replicate.
        "criteo_replicates": [list(r) for r in runs],
        "criteo_fixed_init": fixed_init,
        "dev_auc_per_replicate": {k: [round(x, 4) for x in v] for k, v in aucs["dev"].items()},
        "dev_auc_diff_per_replicate": [round(float(d), 4) for d in dev_diff["diffs"]],
        # How much the run alone moves sync's AUC (sd and range over the replicates);
        # pairing removes most of it from the difference (compare dev_auc_diff_stderr).
        "dev_auc_sync_sd_over_replicates": round(float(sync_dev.std(ddof=1)), 4)
        if sync_dev.size > 1 else None,
        "dev_auc_sync_spread_over_replicates": round(float(np.ptp(sync_dev)), 4),
        # Sanity: s=0 hybrid is synchronous training (the same scores to float tolerance).
        "dev_auc_s0_minus_sync": (round(float(np.mean(s0["dev_auc_diff"])), 6)
                                  if s0["dev_auc_diff"] else None),
        "score_max_abs_diff_s0_vs_sync": (float(max(s0["score_max_abs_diff"]))
                                          if s0["score_max_abs_diff"] else None),
        "s0_replicates": min(s0_replicates, replicates),
        # The same comparison on dev + test pooled (800 labelled rows; not the figure).
        "devtest_auc_sync": round(float(np.mean(aucs["devtest"]["sync"])), 4),
        "devtest_auc_hybrid_s4": round(float(np.mean(aucs["devtest"]["hybrid_s4"])), 4),
        "devtest_auc_diff_hybrid_s4_minus_sync": round(devtest_diff["mean"], 5),
        "devtest_auc_diff_stderr": round(devtest_diff["stderr"], 5),
        **{k: round(v, 5) for k, v in boot.items() if k.startswith("devtest_")},
        "devtest_auc_diff_per_replicate": [round(float(d), 4) for d in devtest_diff["diffs"]],
        "criteo_dev_rows": int(dev["label"].size),
        "criteo_devtest_rows": int(devtest_labels.size),
        "criteo_epochs": epochs,
        "criteo_steps": len(batches),
        "criteo_global_batch": global_batch,
        "criteo_wall_s": round(time.perf_counter() - start, 1),
    })
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="batch 8192, 1 repeat; criteo: 2 epochs, 3 replicates")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"criteo epochs per run (default {CRITEO_EPOCHS})")
    parser.add_argument("--replicates", type=int, default=None,
                        help=f"criteo replicates (initial state r, batch order 3 + r), each "
                             f"trained sync and hybrid s=4 "
                             f"(default {CRITEO_REPLICATES})")
    parser.add_argument("--fixed-init", action="store_true",
                        help="criteo: every replicate starts from initial state 0 (only the "
                             "batch order varies; the design of the first figures)")
    parser.add_argument("--s0-replicates", type=int, default=CRITEO_S0_REPLICATES,
                        help="criteo replicates that also train hybrid s=0 (sanity: equals "
                             "sync)")
    parser.add_argument("--only", choices=("zipf", "speed", "cache", "criteo"), default=None,
                        help="run one part: zipf (part 1), speed (part 1's uncached "
                             "contenders: sync, hybrid s=0,1,2,4), cache (part 1's cache "
                             "contenders and their uncached bases), criteo (part 2)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="part 1's global batch (default 65536; --quick 8192)")
    parser.add_argument("--timed-batches", type=int, default=NUM_BATCHES - 1,
                        help="--only speed: batches in each contender's timed window per "
                             "repeat (default %(default)s); a pipelined contender fills and "
                             "drains its pipeline once per window, so a short window holds "
                             "more of that than of its steady state")
    parser.add_argument("--hidden", default="64", type=comma_separated(int, minimum=1),
                        help="--only speed: the tower's hidden layer widths, comma-separated "
                             "(default %(default)s; DLRM's top MLPs are wider, e.g. 512,256): "
                             "what hybrid training hides behind the exchanges is this dense "
                             "work")
    args = parser.parse_args()
    if args.timed_batches < 1:
        parser.error(f"--timed-batches must be >= 1, got {args.timed_batches}")
    hidden = tuple(args.hidden)
    distributed.init()
    spec = BatchSpec(batch_size=args.batch_size or (8192 if args.quick else 65536),
                     features=FEATURES)
    repeats = args.repeats or (1 if args.quick else ZIPF_REPEATS)
    epochs = args.epochs or (2 if args.quick else CRITEO_EPOCHS)
    replicates = args.replicates or (3 if args.quick else CRITEO_REPLICATES)
    report = {"benchmark": "hybrid", "world_size": distributed.size(), "quick": args.quick,
              "repeats": repeats, "only": args.only}
    if args.only == "speed":
        report.update(run_speed(spec, repeats, timed_batches=args.timed_batches,
                                hidden_units=hidden))
    elif args.only in (None, "zipf", "cache"):
        report.update(run_zipf(spec, repeats,
                               CACHE_CONTENDERS if args.only == "cache" else CONTENDERS))
    if args.only in (None, "criteo"):
        if CRITEO.is_dir():
            report.update(run_criteo(epochs, global_batch=256, replicates=replicates,
                                     s0_replicates=args.s0_replicates,
                                     fixed_init=args.fixed_init))
        else:
            report["criteo"] = f"skipped: {CRITEO} not found"
    report["meets_target"] = {
        "hybrid_faster_than_sync": (
            report["ratio_paired_hybrid_s4_vs_sync"] > 1
            if "ratio_paired_hybrid_s4_vs_sync" in report else None),
        "cache_hit_vs_oracle_1%": (report["cache_hit_vs_oracle"]["1%"] >= ORACLE_TARGET
                                   if "cache_hit_vs_oracle" in report else None),
        "cache_hit_vs_oracle_5%": (report["cache_hit_vs_oracle"]["5%"] >= ORACLE_TARGET
                                   if "cache_hit_vs_oracle" in report else None),
        "dev_auc_within_0.002": (abs(report["dev_auc_diff_hybrid_s4_minus_sync"]) <= 0.002
                                 if "dev_auc_sync" in report else None),
        # Stricter: the whole 95% interval of the mean paired difference within +-0.002.
        "dev_auc_within_0.002_ci95": (max(map(abs, report["dev_auc_diff_ci95"])) <= 0.002
                                      if report.get("dev_auc_diff_ci95") else None),
    }
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if distributed.is_chief():
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
