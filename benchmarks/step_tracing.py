"""First-call cost of a training run's graphs: the library's step traced without AutoGraph
(``gmeta_tf.graph_function``) against the same step traced with it.

Both contenders run the same ``Trainer`` on the same pipeline and dataset; the only
difference is ``gmeta_tf.graph_function.AUTOGRAPH`` in the contender's process. Each run
is its own process (AutoGraph caches the functions it converted for the life of a
process), under ``horovodrun -np N -H localhost:N`` for N > 1 ranks, the contenders
alternating over the repeats. Per run (rank 0) it records:

  first_step_s        the first training step: trace, graph optimisation and one execution
  step_s              the median of the later steps (execution only; the same graph for both)
  first_validation_s  the first validation: the evaluation graphs traced, then run
  validation_s        a later validation (run only)
  first_calls_s       first_step_s + first_validation_s: what tracing adds to a run is this
                      less step_s + validation_s
  run_s               ``Trainer.run`` whole (the prior fit and the checkpoints included: on
                      a busy machine the NumPy prior fit varies more than tracing does)

and the figures are medians over the repeats, with ``ratio_*``: AutoGraph off / on (below 1
is faster without); ``paired_ratio_first_calls`` is the median of each repeat's ratio.
Usage (from the project root; the dataset is made once, first):

    python -m benchmarks.step_tracing [--config movielens] [--np 1] [--repeats 3]
        [--steps 8] [--work DIR] [--quick]

The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CONTENDERS = {"off": False, "on": True}  # AutoGraph in the contender's process
FIGURES = ("first_step_s", "step_s", "first_validation_s", "validation_s", "first_calls_s",
           "run_s")


def _overrides(work: Path, steps: int) -> list[str]:
    return [f"run_dir={work / 'run'}", f"data.path={work / 'data'}", f"train.steps={steps}",
            f"train.eval_every={steps // 2}", f"train.log_every={steps}",
            f"train.checkpoint_every={steps // 2}"]


def worker(config_name: str, overrides: list[str], autograph: bool, out: Path) -> None:
    """One training run with its step and validation calls timed; rank 0 writes ``out``."""
    import tensorflow as tf

    from gmeta_tf import distributed, graph_function
    from gmeta_tf.config import load_config
    from gmeta_tf.training import Trainer

    graph_function.AUTOGRAPH = autograph
    config = load_config(config_name, overrides)
    trainer = Trainer(config, fresh=True)
    steps: list[float] = []
    validations: list[float] = []
    make_step, validate = trainer._step_function, trainer._validate

    def timed_step_function(models, resting=frozenset()):
        step_fn = make_step(models, resting)

        def call(step, batch):
            began = time.perf_counter()
            out = step_fn(step, batch)
            tf.nest.map_structure(lambda t: t.numpy(), out)
            steps.append(time.perf_counter() - began)
            return out
        return call

    def timed_validate(*args, **kwargs):
        began = time.perf_counter()
        result = validate(*args, **kwargs)
        validations.append(time.perf_counter() - began)
        return result

    trainer._step_function, trainer._validate = timed_step_function, timed_validate
    began = time.perf_counter()
    trainer.run()
    run_s = time.perf_counter() - began
    if distributed.is_chief():
        out.write_text(json.dumps({
            "first_step_s": steps[0], "step_s": statistics.median(steps[1:]),
            "first_validation_s": validations[0], "validation_s": validations[-1],
            "first_calls_s": steps[0] + validations[0], "run_s": run_s}))


def _run_contender(args: argparse.Namespace, work: Path, name: str, repeat: int) -> dict:
    out = work / f"{name}-{repeat}.json"
    command = [sys.executable, "-m", "benchmarks.step_tracing", "--worker", name,
               "--config", args.config, "--work", str(work), "--steps", str(args.steps),
               "--out", str(out)]
    if args.np > 1:
        command = ["horovodrun", "-np", str(args.np), "-H", f"localhost:{args.np}"] + command
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="movielens")
    parser.add_argument("--np", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--work", default=None, help="a directory for the dataset and runs")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 4 steps")
    parser.add_argument("--worker", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.steps = 1, 4
    if args.steps < 4 or args.steps % 2:
        parser.error(f"--steps {args.steps}: expected an even number >= 4")
    work = Path(args.work or tempfile.mkdtemp(prefix="step_tracing-")).resolve()
    if args.worker:
        worker(args.config, _overrides(work, args.steps), CONTENDERS[args.worker],
               Path(args.out))
        return None
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "gmeta_tf.cli", "data", "prepare", "--config",
                    args.config, *sum((["--set", o] for o in _overrides(work, args.steps)), [])],
                   check=True, stdout=subprocess.DEVNULL)
    runs: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    for repeat in range(args.repeats):  # the contenders alternate: neither always goes first
        order = list(CONTENDERS) if repeat % 2 == 0 else list(reversed(CONTENDERS))
        for name in order:
            runs[name].append(_run_contender(args, work, name, repeat))
            print(f"repeat {repeat} autograph {name}: {runs[name][-1]}", flush=True)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in FIGURES}
               for name, rs in runs.items()}
    report = {"benchmark": "step_tracing", "config": args.config, "world_size": args.np,
              "repeats": args.repeats, "steps": args.steps, "quick": args.quick,
              "autograph_off": medians["off"], "autograph_on": medians["on"],
              "ratio_first_step": medians["off"]["first_step_s"] / medians["on"]["first_step_s"],
              "ratio_first_validation": (medians["off"]["first_validation_s"]
                                         / medians["on"]["first_validation_s"]),
              "ratio_first_calls": (medians["off"]["first_calls_s"]
                                    / medians["on"]["first_calls_s"]),
              "paired_ratio_first_calls": statistics.median(
                  off["first_calls_s"] / on["first_calls_s"]
                  for off, on in zip(runs["off"], runs["on"])),
              "ratio_run": medians["off"]["run_s"] / medians["on"]["run_s"]}
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    main()
