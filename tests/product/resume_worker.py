"""`gmeta train` that records the task ids of every batch it trains on, per rank.

    [horovodrun -np N -H localhost:N] python -m tests.product.resume_worker ROOT DATA_DIR \\
        NAME:STEPS:FLAG [NAME:STEPS:FLAG ...]

Each ``NAME:STEPS:FLAG`` trains the tiny default pipeline in ROOT/NAME to STEPS steps
with ``--FLAG`` (fresh or resume), one after the other in this launch. Rank r appends one
line ``step world_size task_id,task_id,...`` per trained step to
ROOT/NAME/batches.rank<r>.log, so the tests can compare the batches of a resumed run with
those of an uninterrupted one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

from gmeta_tf import distributed
from gmeta_tf.cli import main
from gmeta_tf.training.trainer import Trainer
from tests.product.conftest import tiny_overrides

_batches = Trainer._batches


def recorded_batches(self: Trainer, start_step: int, *args, **kwargs) -> Iterator[dict]:
    log = Path(self.config.run_dir, f"batches.rank{self.rank}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    for step, batch in enumerate(_batches(self, start_step, *args, **kwargs), start_step + 1):
        with open(log, "a") as f:
            tasks = ",".join(str(int(t)) for t in batch["task_id"].numpy())
            f.write(f"{step} {self.size} {tasks}\n")
        yield batch


def record_batches() -> None:
    """Makes every Trainer of this process log its batches (see the module docstring)."""
    Trainer._batches = recorded_batches


def read_batches(run_dir: Path, rank: int) -> dict[int, tuple[int, list[int]]]:
    """Step -> (world size, task ids) of the last time rank trained that step."""
    out = {}
    for line in Path(run_dir, f"batches.rank{rank}.log").read_text().splitlines():
        step, size, tasks = line.split()
        out[int(step)] = (int(size), [int(t) for t in tasks.split(",")])
    return out


def train(root: Path, data_dir: Path, name: str, steps: int, flag: str) -> None:
    sets = [a for o in tiny_overrides(root / name, data_dir, steps) + ["train.eval_every=0"]
            for a in ("--set", o)]
    code = main(["train", *sets, f"--{flag}"])
    if code != 0:
        raise SystemExit(f"gmeta train ({name}, rank {distributed.rank()}) exited {code}")


if __name__ == "__main__":
    record_batches()
    for run in sys.argv[3:]:
        name, steps, flag = run.split(":")
        train(Path(sys.argv[1]), Path(sys.argv[2]), name, int(steps), flag)
