"""One contender of the embedding-step benchmark, timed in a process of its own.

`benchmarks.embedding_step` starts one worker process per contender (the TFRA one from
.venv-peers), one after the other, so no contender shares a core, an allocator or
TensorFlow's thread pools with another. Every worker uses this file's command line and
timing loop, and prints one JSON object as its last stdout line. It needs numpy and
TensorFlow only, so it runs in either venv.

A contender is a factory `build(config) -> Contender`; `step(ids)` runs one whole
training step (lookup or insert, forward, loss, backward, Adagrad update) and returns the
loss, `table_size()` the number of ids the table holds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from benchmarks.embedding_batches import BatchSpec, batch_digest, make_batch

EXIT_UNAVAILABLE = 3  # the contender cannot run here (e.g. not built yet); the JSON says why


@dataclass(frozen=True)
class StepConfig:
    """What every contender trains: the benchmark's fixed problem."""

    batch_size: int
    features: int
    dim: int
    learning_rate: float
    seed: int
    steps: int  # timed steps, after WARMUP_STEPS
    warmup_steps: int = 1

    @property
    def spec(self) -> BatchSpec:
        return BatchSpec(batch_size=self.batch_size, features=self.features, seed=self.seed)


class Contender(Protocol):
    def step(self, ids: object) -> object: ...

    def table_size(self) -> int: ...


class Unavailable(Exception):
    """Raised by a factory when its contender cannot run in this environment."""


def time_steps(contender: Contender, config: StepConfig) -> dict:
    """Runs warm-up then timed steps on the shared batches; returns per-step figures.

    A step's time covers the contender's whole step call, up to a host float of its loss,
    so asynchronous work cannot leak into the next step. Building the batch and turning it
    into a tensor are outside the timed region (the same for everyone).
    """
    import tensorflow as tf

    seconds, losses, digests = [], [], []
    for step in range(config.warmup_steps + config.steps):
        ids_np = make_batch(config.spec, step)
        digests.append(batch_digest(ids_np))
        ids = tf.constant(ids_np)
        start = time.perf_counter()
        loss = float(contender.step(ids))
        seconds.append(time.perf_counter() - start)
        losses.append(loss)
        if not np.isfinite(loss):
            raise FloatingPointError(f"step {step}: loss is {loss}")
    timed = seconds[config.warmup_steps:]
    median = statistics.median(timed)
    return {
        "warmup_seconds": seconds[: config.warmup_steps],
        "step_seconds": timed,
        "median_step_s": median,
        # Table growth (rehash, reallocation) lands on a few steps; the median hides it and
        # the mean amortises it: both are reported, the median is the headline figure.
        "mean_step_s": statistics.fmean(timed),
        "samples_per_s": config.batch_size / median,
        "ids_per_s": config.batch_size * config.features / median,
        "losses": losses,
        "table_size": int(contender.table_size()),
        "batch_digests": digests,
    }


def parse_config(argv: list[str] | None = None) -> StepConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--features", type=int, required=True)
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--learning-rate", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args(argv)
    return StepConfig(**vars(args))


def config_argv(config: StepConfig) -> list[str]:
    """The worker command line that reproduces `config` (inverse of `parse_config`)."""
    return [
        "--batch-size", str(config.batch_size), "--features", str(config.features),
        "--dim", str(config.dim), "--learning-rate", repr(config.learning_rate),
        "--seed", str(config.seed), "--steps", str(config.steps),
    ]


def worker_main(
    name: str,
    build: Callable[[StepConfig], tuple[Contender, dict]],
    argv: list[str] | None = None,
) -> int:
    """Entry point of a worker: build the contender, time it, print one JSON line."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    config = parse_config(argv)
    try:
        contender, info = build(config)
    except Unavailable as exc:
        print(json.dumps({"contender": name, "unavailable": str(exc)}))
        return EXIT_UNAVAILABLE
    result = time_steps(contender, config)
    print(json.dumps({"contender": name, "config": asdict(config), **info, **result}))
    sys.stdout.flush()
    return 0
