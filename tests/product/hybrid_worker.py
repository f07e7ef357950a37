"""A rank of the product hybrid-training test: several `gmeta train` runs in one launch.

    horovodrun -np 2 -H localhost:2 python -m tests.product.hybrid_worker ROOT DATA_DIR

Trains the tiny default pipeline as a plain CTR model (``meta.enabled=false``) through
``gmeta_tf.cli.main`` (one launch saves the start-up of several), each run in ROOT/<name>:

    sync     the plain synchronous step, no cache
    h0       --staleness 0, a MixCache on the 'item' table
    h2       --staleness 2, the same cache (the only run with periodic evaluation)
    h2split  as h2, trained to step 4, then resumed to step 8 (--resume)
"""

from __future__ import annotations

import sys
from pathlib import Path

from gmeta_tf.cli import main
from tests.product.conftest import tiny_overrides

STEPS = 8
CACHE = "model.tables.item.cache={capacity: 16, min_count: 1, rebalance_every: 3}"


def overrides(root: Path, data_dir: Path, name: str, steps: int = STEPS) -> list[str]:
    """The ``--set`` values of a run (the tests rebuild its config from them)."""
    extra = ["meta.enabled=false"] + ([CACHE] if name != "sync" else [])
    if name != "h2":
        extra.append("train.eval_every=0")
    return tiny_overrides(root / name, data_dir, steps) + extra


def _train(root: Path, data_dir: Path, name: str, *flags: str, steps: int = STEPS) -> None:
    sets = [a for o in overrides(root, data_dir, name, steps) for a in ("--set", o)]
    code = main(["train", *sets, *flags])
    if code != 0:
        raise SystemExit(f"gmeta train ({name}) exited {code}")


def run(root: Path, data_dir: Path) -> None:
    _train(root, data_dir, "sync", "--fresh")
    _train(root, data_dir, "h0", "--fresh", "--staleness", "0")
    _train(root, data_dir, "h2", "--fresh", "--staleness", "2")
    _train(root, data_dir, "h2split", "--fresh", "--staleness", "2", steps=4)
    _train(root, data_dir, "h2split", "--resume", "--staleness", "2")


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]))
