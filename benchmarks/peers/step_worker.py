"""One contender of the embedding-step benchmark, in a process of its own.

`benchmarks.embedding_step` starts one worker process per contender (the TFRA ones from
.venv-peers) and drives them in lock step: step i of every contender runs before step
i + 1 of any, one process at a time, so no contender shares a core with another and a burst
of outside load hits all of them alike. Workers speak a line protocol: the driver writes
`step I` or `finish` to stdin; the worker answers with one stdout line `@@worker {json}`
(other stdout lines, which some libraries print, are ignored).

Run alone (no --serve), a worker times its own warm-up and steps and prints the same
figures as one JSON line last. It needs numpy and TensorFlow only, so it runs in either venv.

A contender is a factory `build(config) -> (Contender, info)`; `step(ids)` runs one whole
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
MARKER = "@@worker "


@dataclass(frozen=True)
class StepConfig:
    """What every contender trains: the benchmark's fixed problem."""

    batch_size: int
    features: int
    dim: int
    learning_rate: float
    seed: int
    steps: int  # timed steps, after warmup_steps
    warmup_steps: int = 1

    @property
    def spec(self) -> BatchSpec:
        return BatchSpec(batch_size=self.batch_size, features=self.features, seed=self.seed)


class Contender(Protocol):
    def step(self, ids: object) -> object: ...

    def table_size(self) -> int: ...


class Unavailable(Exception):
    """Raised by a factory when its contender cannot run in this environment."""


def time_step(contender: Contender, config: StepConfig, step: int) -> dict:
    """Runs training step `step` on the shared batch; returns its time, loss and digest.

    The time covers the contender's whole step call, up to a host float of its loss, so
    asynchronous work cannot leak into the next step. Building the batch and making it a
    tensor are outside the timed region (the same for everyone).
    """
    import tensorflow as tf

    ids_np = make_batch(config.spec, step)
    ids = tf.constant(ids_np)
    start = time.perf_counter()
    loss = float(contender.step(ids))
    seconds = time.perf_counter() - start
    if not np.isfinite(loss):
        raise FloatingPointError(f"step {step}: loss is {loss}")
    return {"step": step, "seconds": seconds, "loss": loss, "digest": batch_digest(ids_np)}


def summarize_steps(config: StepConfig, records: list[dict], table_size: int) -> dict:
    """Figures of one contender from its per-step records (warm-up first)."""
    timed = [r["seconds"] for r in records[config.warmup_steps:]]
    median = statistics.median(timed)
    return {
        "warmup_seconds": [r["seconds"] for r in records[: config.warmup_steps]],
        "step_seconds": timed,
        "median_step_s": median,
        # Table growth (rehash, reallocation) lands on a few steps; the median hides it and
        # the mean amortises it: both are reported, the median is the headline figure.
        "mean_step_s": statistics.fmean(timed),
        "samples_per_s": config.batch_size / median,
        "ids_per_s": config.batch_size * config.features / median,
        "losses": [r["loss"] for r in records],
        "table_size": int(table_size),
        "batch_digests": [r["digest"] for r in records],
    }


def parse_config(argv: list[str] | None = None) -> tuple[StepConfig, bool]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--features", type=int, required=True)
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--learning-rate", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--serve", action="store_true", help="take steps from stdin (driver)")
    args = vars(parser.parse_args(argv))
    serve = args.pop("serve")
    return StepConfig(**args), serve


def config_argv(config: StepConfig) -> list[str]:
    """The worker command line that reproduces `config` (inverse of `parse_config`)."""
    return [
        "--batch-size", str(config.batch_size), "--features", str(config.features),
        "--dim", str(config.dim), "--learning-rate", repr(config.learning_rate),
        "--seed", str(config.seed), "--steps", str(config.steps),
    ]


def _say(message: dict) -> None:
    print(MARKER + json.dumps(message), flush=True)


def _serve(contender: Contender, config: StepConfig) -> int:
    for line in sys.stdin:
        command = line.split()
        if command[:1] == ["step"]:
            _say({"kind": "step", **time_step(contender, config, int(command[1]))})
        elif command == ["finish"]:
            _say({"kind": "final", "table_size": int(contender.table_size())})
            return 0
        else:
            raise SystemExit(f"step_worker: unknown command {line!r}: expected 'step I' or 'finish'")
    return 0


def worker_main(
    name: str,
    build: Callable[[StepConfig], tuple[Contender, dict]],
    argv: list[str] | None = None,
) -> int:
    """Entry point of a worker: build the contender, then serve the driver or run alone."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    config, serve = parse_config(argv)
    try:
        contender, info = build(config)
    except Unavailable as exc:
        _say({"kind": "unavailable", "contender": name, "unavailable": str(exc)})
        return EXIT_UNAVAILABLE
    if serve:
        _say({"kind": "ready", "contender": name, **info})
        return _serve(contender, config)
    records = [time_step(contender, config, s) for s in range(config.warmup_steps + config.steps)]
    figures = summarize_steps(config, records, contender.table_size())
    print(json.dumps({"contender": name, "config": asdict(config), **info, **figures}), flush=True)
    return 0
