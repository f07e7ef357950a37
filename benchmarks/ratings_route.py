"""The cold-start target's route on a ratings log a user brings, as the user runs it:
``gmeta data csv`` -> a copy of ``pipelines/movielens.yaml`` over the dataset -> ``gmeta
tune`` -> ``gmeta train`` -> ``gmeta eval``.

    python -m benchmarks.ratings_route --log S [--rare-items 5] [--users 670] [--np 2]
        [--trials 8] [--work DIR] [--data-only]

The log (one per ``--log`` seed S, a CSV ``userId,movieId,rating,timestamp``): MovieLens
100K's ``u.data`` (``../shared/data/ml-100k``), ``--users`` users drawn with
``random.seed(S)``, 3 in 10 of the ratings above 1 lowered by half a star (a half-star
scale, 0.5-5), and with ``--rare-items K`` > 0 each item split in K by a hash of the user
(``10 * item + crc32(user) % K``: a catalogue K times larger with as many ratings, each
item rare). Converted with the MovieLens protocol (label ``rating``, relevant at 4 or
more, 10 query ratings, 13-100 ratings a user); the pipeline is ``pipelines/movielens.yaml``
with the dataset as its source, one table of the item id and no user features; its
settings are chosen by ``gmeta tune --trials N`` on the validation users, then ``gmeta
train --fresh`` and ``gmeta eval`` score the cold users once.

Reported: one JSON line per log, the cold users' AUC, MAE, nDCG@3 and within-user AUC of
every row of ``gmeta eval`` (the meta model, the fine-tuned baseline, the reference
predictors), and the seed-metric pairs (AUC, MAE, nDCG@3) on which the meta model is
better than each contender. ``--data-only`` stops after the conversion (the data that
``benchmarks.item_bias`` reads).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "data" / "ml-100k" / "u.data"
CONTENDERS = {"baseline": "baseline fine-tuned", "factorisation": "reference: matrix",
              "item mean + offset": "reference: movieId mean + task offset"}


def write_log(path: Path, seed: int, users: int, rare_items: int) -> int:
    """The ratings CSV of log ``seed`` (see the module docstring); returns its rows."""
    rows = [line.split("\t") for line in SOURCE.read_text().splitlines()]
    rng = random.Random(seed)
    everyone = sorted({r[0] for r in rows}, key=int)
    keep = set(rng.sample(everyone, users))
    written = 0
    with open(path, "w") as f:
        f.write("userId,movieId,rating,timestamp\n")
        for user, item, rating, stamp in rows:
            if user not in keep:
                continue
            rating = float(rating)
            if rating > 1 and rng.random() < 0.3:
                rating -= 0.5
            item = (int(item) * 10 + zlib.crc32(user.encode()) % rare_items if rare_items
                    else int(item))
            f.write(f"{user},{item},{rating:g},{stamp}\n")
            written += 1
    return written


def write_pipeline(path: Path) -> None:
    """``pipelines/movielens.yaml`` over the converted dataset: source ``dataset`` at
    ``data``, one table of ``movieId``, no user features, the prior on ``movieId``."""
    config = yaml.safe_load((ROOT / "pipelines" / "movielens.yaml").read_text())
    config.update(name="route", run_dir="runs/route")
    data = config["data"]
    config["data"] = {"source": "dataset", "path": "data",
                      **{k: data[k] for k in ("tasks_per_batch", "support", "query")}}
    model = config["model"]
    table = next(iter(model["tables"].values()))
    model.update(tables={"movieId": {**table, "features": ["movieId"]}},
                 item_features=["movieId"], user_features=[])
    model["prior"] = {**model["prior"], "feature": "movieId"}
    config["export"] = {**config["export"], "dir": "runs/route/export"}
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def gmeta(work: Path, args: list[str], log: str) -> None:
    with open(work / log, "w") as out:
        subprocess.run([sys.executable, "-m", "gmeta_tf.cli", *args], cwd=work, stdout=out,
                       stderr=subprocess.STDOUT, check=True)


def cold_figures(work: Path) -> dict:
    """Each row of ``gmeta eval``'s cold report: AUC, MAE, nDCG@3, within-user AUC."""
    report = json.loads((work / "runs" / "route" / "eval" / "cold.json").read_text())
    return {r["name"]: {k: r[k] for k in ("auc", "mae", "ndcg@3", "task_auc")}
            for r in report["rows"]}


def pairs_won(rows: dict) -> dict:
    """Of AUC, MAE and nDCG@3, on how many the meta model (adapted, as served) is better
    than each contender."""
    def row(prefix):
        return next(v for k, v in rows.items() if k.startswith(prefix))
    meta = row("meta (")
    return {name: sum([meta["auc"] > row(p)["auc"], meta["mae"] < row(p)["mae"],
                       meta["ndcg@3"] > row(p)["ndcg@3"]])
            for name, p in CONTENDERS.items()}


def run(seed: int, args: argparse.Namespace) -> dict:
    work = Path(args.work) / f"log{seed}"
    work.mkdir(parents=True, exist_ok=True)
    rows = write_log(work / "ratings.csv", seed, args.users, args.rare_items)
    write_pipeline(work / "route.yaml")
    gmeta(work, ["data", "csv", "ratings.csv", "data", "--task", "userId", "--label",
                 "rating", "--label-threshold", "4", "--label-range", "0.5", "5", "--sparse",
                 "movieId", "--order-by", "timestamp", "--query-size", "10", "--min-rows",
                 "13", "--max-rows", "100"], "csv.log")
    out = {"bench": "ratings_route", "log": seed, "rare_items": args.rare_items,
           "users": args.users, "rows": rows, "work": str(work)}
    if args.data_only:
        return out
    gmeta(work, ["tune", "--np", str(args.np), "--config", "route.yaml", "--trials",
                 str(args.trials)], "tune.log")
    gmeta(work, ["train", "--np", str(args.np), "--config", "route.yaml", "--fresh"],
          "train.log")
    gmeta(work, ["eval", "--config", "route.yaml"], "eval.log")
    cold = cold_figures(work)
    return {**out, "np": args.np, "trials": args.trials, "cold": cold,
            "meta_better_pairs": pairs_won(cold)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=int, action="append", required=True,
                        help="a log's seed (repeatable)")
    parser.add_argument("--rare-items", type=int, default=5)
    parser.add_argument("--users", type=int, default=670)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--work", default="runs/ratings_route")
    parser.add_argument("--data-only", action="store_true")
    args = parser.parse_args(argv)
    if not 0 <= args.rare_items <= 10:
        parser.error(f"--rare-items {args.rare_items}: expected 0 (items kept) to 10")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for seed in args.log:
        print(json.dumps(run(seed, args)), flush=True)


if __name__ == "__main__":
    main()
