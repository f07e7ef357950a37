"""Embedding training step, side by side: gmeta-tf's HashEmbedding, TFRA, plain TensorFlow.

One step: batch 65536 x 26 sparse features, dim 16, ids Zipf(a=1.1) with a disjoint id
range per feature and fresh ids every step (tables keep growing), loss = mean over the batch
of (sum of the sample's 26 x 16 embedding values - 1)^2, Adagrad lr 0.05. One warm-up step,
then --steps timed steps; the figure is batch / median step time.

Contenders, each in a process of its own, driven in lock step (step i of each in turn, one
process at a time: benchmarks/peers/step_driver.py) on bit-identical batches
(benchmarks/embedding_batches.py, checked by digest):
  gmeta         gmeta_tf.embedding.HashEmbedding, Adagrad fused into the backward op
  tf_hashtable  tf.lookup.experimental.MutableHashTable + variables + ResourceSparseApplyAdagradV2
  tfra          TFRA 0.8.1 de.keras.layers.Embedding + de.DynamicEmbeddingOptimizer(Adagrad),
                from .venv-peers (made on first use by benchmarks/peers/setup_peers.sh); run
                with Keras's and with the legacy Adagrad, compared against the faster one

Usage: python -m benchmarks.embedding_step [--quick] [--steps N] [--batch-size B]
                                           [--seed S] [--only gmeta,tfra,tf_hashtable]
The last stdout line is one JSON object (samples_per_s_*, ratio_vs_tfra, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from benchmarks.arguments import comma_separated
from benchmarks.embedding_batches import BatchSpec, batch_digest, make_batch
from benchmarks.peers.step_driver import run_lockstep
from benchmarks.peers.step_worker import (
    StepConfig,
    Unavailable,
    config_argv,
    worker_main,
)

REPO = Path(__file__).resolve().parent.parent
PEERS_VENV = Path(os.environ.get("GMETA_PEERS_VENV", REPO / ".venv-peers"))
PEERS_SETUP = REPO / "benchmarks" / "peers" / "setup_peers.sh"

FEATURES = 26
DIM = 16
LEARNING_RATE = 0.05
TARGET_RATIO_VS_TFRA = 5.0
QUICK_BATCH = 4096
CONTENDERS = ("gmeta", "tf_hashtable", "tfra")
TFRA_OPTIMIZERS = ("legacy", "keras")
WORKER_FLAG = "--worker-gmeta"


# --- the project's contender (runs in a worker process of the main venv) ----------------


class GmetaEmbedding:
    """gmeta-tf's layer in a tf.function step; the gradient call applies Adagrad."""

    def __init__(self, config: StepConfig) -> None:
        import tensorflow as tf

        from gmeta_tf.embedding import Adagrad, HashEmbedding

        self.tf = tf
        self.layer = HashEmbedding(
            dim=config.dim, optimizer=Adagrad(learning_rate=config.learning_rate), seed=config.seed
        )
        self.step = tf.function(self._step)

    def _step(self, ids):
        tf = self.tf
        with tf.GradientTape() as tape:
            emb = self.layer(ids)
            loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb, axis=[1, 2]) - 1.0))
        # Computing the gradient is what updates the table (optimizer fused into backward);
        # the anchor's zero gradient needs no optimizer. Depend on it so it always runs.
        grads = tape.gradient(loss, self.layer.trainable_variables)
        with tf.control_dependencies([g for g in grads if g is not None]):
            return tf.identity(loss)

    def table_size(self) -> int:
        return int(self.layer.table_size())


def build_gmeta(config: StepConfig) -> tuple[GmetaEmbedding, dict]:
    try:
        import tensorflow as tf

        contender = GmetaEmbedding(config)
    except Exception as exc:
        raise Unavailable(
            f"gmeta_tf.embedding.HashEmbedding is not usable here ({type(exc).__name__}: "
            f"{exc}); build it with: bash scripts/setup.sh"
        ) from exc
    return contender, {"tensorflow": tf.__version__}


# --- orchestration ------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.embedding_step",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--quick", action="store_true",
                        help=f"batch {QUICK_BATCH} instead of 65536 (under a minute)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps after 1 warm-up")
    parser.add_argument("--batch-size", type=int, default=None, help="default 65536")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=",".join(CONTENDERS),
                        type=comma_separated(choices=CONTENDERS),
                        help=f"comma-separated subset of {','.join(CONTENDERS)}")
    parser.add_argument("--tfra-optimizers", default=",".join(TFRA_OPTIMIZERS),
                        type=comma_separated(choices=TFRA_OPTIMIZERS),
                        help="Adagrads wrapped for TFRA: legacy, keras or both")
    args = parser.parse_args(argv)
    if args.steps < 5:
        parser.error(f"--steps {args.steps}: at least 5 timed steps are needed for a median")
    if args.batch_size is None:
        args.batch_size = QUICK_BATCH if args.quick else 65536
    return args


def log(message: str) -> None:
    print(f"[embedding_step] {message}", file=sys.stderr, flush=True)


def ensure_peers_venv() -> Path | None:
    """Python of .venv-peers, set up on first use; None (with a note) if that fails."""
    log(f"checking peers venv {PEERS_VENV} (bash {PEERS_SETUP.relative_to(REPO)})")
    done = subprocess.run(
        ["bash", str(PEERS_SETUP)], check=False, cwd=REPO, stdout=sys.stderr, stderr=sys.stderr,
        env={**os.environ, "GMETA_PEERS_VENV": str(PEERS_VENV)},
    )
    python = PEERS_VENV / "bin" / "python"
    if done.returncode != 0 or not python.exists():
        log(f"peers venv set-up failed (exit {done.returncode}); TFRA is not measured")
        return None
    return python


def worker_commands(args: argparse.Namespace, config: StepConfig) -> dict[str, list[str]]:
    """Command line of each contender's worker; TFRA's run in .venv-peers."""
    argv = [*config_argv(config), "--serve"]
    main_python = [sys.executable, "-m"]
    commands: dict[str, list[str]] = {}
    if "gmeta" in args.only:
        commands["gmeta"] = [*main_python, "benchmarks.embedding_step", WORKER_FLAG, *argv]
    if "tf_hashtable" in args.only:
        commands["tf_hashtable"] = [*main_python, "benchmarks.peers.tf_hashtable_step", *argv]
    if "tfra" in args.only:
        python = ensure_peers_venv()
        for optimizer in args.tfra_optimizers if python else []:
            commands[f"tfra_{optimizer}"] = [
                str(python), "-m", "benchmarks.peers.tfra_step", "--optimizer", optimizer, *argv
            ]
    return commands


def run_contenders(args: argparse.Namespace, config: StepConfig) -> dict[str, dict]:
    commands = worker_commands(args, config)
    env = {**os.environ}
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    results = run_lockstep(commands, config, REPO, env, log) if commands else {}
    if "tfra" in args.only and not any(name.startswith("tfra_") for name in commands):
        results["tfra"] = {"unavailable": "peers venv could not be set up"}
    return results


def batch_facts(config: StepConfig) -> dict:
    """What every contender must agree on: batch digests, unique ids, final table size."""
    spec = BatchSpec(config.batch_size, config.features, config.seed)
    batches = [make_batch(spec, s) for s in range(config.warmup_steps + config.steps)]
    return {
        "digests": [batch_digest(b) for b in batches],
        "unique": [int(np.unique(b).size) for b in batches],
        "table_size": int(np.unique(np.concatenate([b.ravel() for b in batches])).size),
    }


def summarize(config: StepConfig, results: dict[str, dict], facts: dict) -> dict:
    measured = {k: v for k, v in results.items() if "samples_per_s" in v}
    tfra = [k for k in measured if k.startswith("tfra_")]
    best_tfra = max(tfra, key=lambda k: measured[k]["samples_per_s"]) if tfra else None
    figures = dict(measured)
    if best_tfra:
        figures["tfra"] = measured[best_tfra]

    def per(key: str, name: str) -> float | int | None:
        return figures[name][key] if name in figures else None

    def ratio(name: str) -> float | None:
        if "gmeta" in figures and name in figures:
            return figures["gmeta"]["samples_per_s"] / figures[name]["samples_per_s"]
        return None

    def paired_ratio(name: str) -> float | None:
        if "gmeta" in figures and name in figures:
            pairs = zip(figures[name]["step_seconds"], figures["gmeta"]["step_seconds"])
            return statistics.median(peer / ours for peer, ours in pairs)
        return None

    summary: dict = {
        "benchmark": "embedding_step",
        "batch": config.batch_size, "features": config.features, "dim": config.dim,
        "optimizer": f"adagrad lr={config.learning_rate}", "zipf_a": 1.1, "seed": config.seed,
        "warmup_steps": config.warmup_steps, "steps": config.steps,
        "ids_per_step": config.batch_size * config.features,
        "unique_ids_per_step": facts["unique"],
        "unique_ids_per_step_median": statistics.median(facts["unique"]),
        "expected_table_size": facts["table_size"],
    }
    for name in ("gmeta", "tfra", "tf_hashtable"):
        summary[f"samples_per_s_{name}"] = per("samples_per_s", name)
    summary["ratio_vs_tfra"] = ratio("tfra")
    summary["ratio_vs_tf_hashtable"] = ratio("tf_hashtable")
    # The same step of two contenders ran seconds apart: the median of per-step time ratios
    # is the figure least moved by outside load.
    summary["paired_ratio_vs_tfra"] = paired_ratio("tfra")
    summary["paired_ratio_vs_tf_hashtable"] = paired_ratio("tf_hashtable")
    summary["target_ratio_vs_tfra"] = TARGET_RATIO_VS_TFRA
    ratio_vs_tfra = summary["ratio_vs_tfra"]
    summary["meets_target"] = (
        ratio_vs_tfra >= TARGET_RATIO_VS_TFRA if ratio_vs_tfra is not None else None
    )
    summary["tfra_variant"] = best_tfra
    for name in sorted(figures):
        for key in ("ids_per_s", "median_step_s", "mean_step_s", "table_size"):
            summary[f"{key}_{name}"] = figures[name][key]
        summary[f"final_loss_{name}"] = figures[name]["losses"][-1]
    summary["step_seconds"] = {k: v["step_seconds"] for k, v in measured.items()}
    summary["versions"] = {
        k: {v: r[v] for v in ("tensorflow", "tfra") if v in r} for k, r in measured.items()
    }
    summary["checks"] = {
        "same_batches": all(r["batch_digests"] == facts["digests"] for r in measured.values()),
        "table_sizes_match": all(r["table_size"] == facts["table_size"] for r in measured.values()),
    }
    summary["not_measured"] = {k: v["unavailable"] for k, v in results.items() if k not in measured}
    return summary


def print_table(summary: dict, results: dict[str, dict]) -> None:
    print(f"embedding step: batch {summary['batch']} x {summary['features']} features, "
          f"dim {summary['dim']}, {summary['steps']} timed steps (median), "
          f"~{summary['unique_ids_per_step_median']:.0f} unique ids/step")
    print(f"{'contender':<14}{'samples/s':>12}{'ids/s':>14}{'median step s':>15}"
          f"{'mean step s':>13}{'table size':>12}{'final loss':>12}")
    for name, r in results.items():
        if "samples_per_s" not in r:
            print(f"{name:<14}  not measured: {r['unavailable']}")
            continue
        print(f"{name:<14}{r['samples_per_s']:>12,.0f}{r['ids_per_s']:>14,.0f}"
              f"{r['median_step_s']:>15.3f}{r['mean_step_s']:>13.3f}{r['table_size']:>12,}"
              f"{r['losses'][-1]:>12.4f}")
    for key in ("ratio_vs_tfra", "ratio_vs_tf_hashtable", "paired_ratio_vs_tfra",
                "paired_ratio_vs_tf_hashtable"):
        value = summary[key]
        print(f"{key}: {value:.2f}" if value is not None else f"{key}: n/a")
    if not all(summary["checks"].values()):
        print(f"WARNING: contenders disagree: {summary['checks']}")


def main(argv: list[str]) -> int:
    if argv[:1] == [WORKER_FLAG]:
        return worker_main("gmeta", build_gmeta, argv[1:])
    args = parse_args(argv)
    config = StepConfig(batch_size=args.batch_size, features=FEATURES, dim=DIM,
                        learning_rate=LEARNING_RATE, seed=args.seed, steps=args.steps)
    log(f"config {asdict(config)}")
    load_before = os.getloadavg()
    results = run_contenders(args, config)
    summary = summarize(config, results, batch_facts(config))
    # Other work on the machine skews absolute figures; the load average says how busy it was.
    summary["loadavg_1min"] = {"before": load_before[0], "after": os.getloadavg()[0]}
    print_table(summary, results)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
