"""Cold-start table on MovieLens 100K (../shared/DESIGN.md, "Cold-start evaluation protocol"),
through the product path a user runs: ``gmeta tune`` -> ``gmeta train`` -> ``gmeta eval``.

For each seed: the ``movielens`` pipeline with that seed for the split (80% warm users, a
fifth of them held out for validation, 10 random query ratings per user, validation and
cold users with 13-100 ratings; warm users with more are trained on, ``train_long_tasks``),
the initial weights and the batch order (``--ratings-only``: ``pipelines/ratings.yaml``,
the same pipeline on ``u.data`` alone through the csv source, ``item_id`` its only
feature). Then:

1. ``gmeta tune`` (``--trials`` N): two Optuna studies with the same N trials, one for the
   meta model (inner steps and rates, learned per-step/per-element rates, multi-step loss,
   outer rate, its tables' rate), one for the baseline (its learning rate, its tables'
   rate, fine-tuning rate and steps). Each
   trial trains both on the same batches, each with its own early stopping; its value is
   each model's best validation AUC. Only the validation users are scored.
2. ``gmeta train`` with the chosen settings; each model's best checkpoint on validation.
3. ``gmeta eval``: every cold user, scored once: the meta model adapted on its support
   ratings, the baseline fine-tuned on them through the same inner-loop code and the same
   fast weights, both without adaptation, and the reference predictors (global mean, item
   mean, item mean + the user's mean offset on its support ratings, the matrix
   factorisation's fold-in of the user; their settings chosen on the validation users).

Metrics on cold users' query ratings: AUC (label = rating >= 4, score = predicted rating,
pooled), MAE, nDCG@3 per user (relevance = rating). Every contender is reported as mean and
standard deviation over the seeds, and the meta model's paired difference against every
other row per seed (> 0: the meta model is better; MAE: the other's minus the meta's) with
the 95% interval ``gmeta eval`` gives it (paired bootstrap over the seed's cold users).

Every run of this benchmark, its command, commit, date and per-seed gaps, newest first, is in
``docs/measured.md``; the README's "Measured: where the cold-start target stands" gives
the status. The runs up to 2026-11-25 that this docstring held are at the end of that file.

Usage: python -m benchmarks.cold_start [--quick] [--seeds 0,1,2] [--trials 8] [--work DIR]
       [--jobs N] [--np N] [--ratings-only [--ratings FILE] [--split-items N] [--users N]]
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from benchmarks.arguments import comma_separated  # noqa: E402
from gmeta_tf.machine import machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ML100K = ROOT.parent / "shared" / "data" / "ml-100k"
METRICS = ("auc", "mae", "ndcg@3")
META_ROW = "meta"


def _gmeta(*args: str) -> None:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-m", "gmeta_tf.cli", *args], cwd=ROOT, env=env,
                   check=True)


#: The columns of a ratings log, in its order, as ``pipelines/ratings.yaml`` names them.
RATINGS_COLUMNS = ("user_id", "item_id", "rating", "timestamp")


def ratings_only_config(work: Path, ratings: Path | None = None, split_items: int = 1,
                        users: int | None = None) -> Path:
    """``pipelines/ratings.yaml`` (``pipelines/movielens.yaml`` on a ratings log alone: the
    item the only feature) on MovieLens 100K's ``u.data`` (user, item, rating, time; no
    genres, no user features), or on ``ratings`` (a file of those four columns:
    tab-separated without a header line as ``u.data``, or a CSV whose header line names
    them, e.g. ``userId,movieId,rating,timestamp``). The file's columns are read by the
    pipeline's names (the mapping key ``columns``, in place of a header line's, as the
    README tells a user to); every other key as shipped.

    ``split_items`` N > 1 makes items rare, as in a larger catalogue with as many ratings:
    each item becomes N items, a rating going to the one of its user's bucket (a hash of
    the user id), so each has about 1/N of the ratings; ``users`` keeps a seeded sample of
    that many users."""
    source = ratings or ML100K / "u.data"
    with open(source) as f:
        first = f.readline().rstrip("\n")
    delimiter = "," if "," in first and "\t" not in first else "\t"
    header = not first.split(delimiter)[2].replace(".", "", 1).isdigit()
    if split_items > 1 or users:
        source = _thinned_ratings(source, work, delimiter, header, split_items, users)
    config = yaml.safe_load((ROOT / "pipelines" / "ratings.yaml").read_text())
    config.update(name="ratings_only", run_dir="runs/ratings_only")
    config["export"]["dir"] = "runs/ratings_only/export"
    mapping = {**config["data"]["mapping"], "delimiter": delimiter, "header": header,
               "columns": list(RATINGS_COLUMNS)}
    # 2048 rows a block, as pipelines/movielens.yaml and every run of docs/measured.md had it
    config["data"].update(raw=str(source), path="runs/ratings_only/data", mapping=mapping,
                          rows_per_block=2048)
    path = work / "ratings_only.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _thinned_ratings(source: Path, work: Path, delimiter: str, header: bool,
                     split_items: int, users: int | None) -> Path:
    """``source`` with a seeded sample of ``users`` users, each item split into
    ``split_items`` items by a hash of the user (see ``ratings_only_config``)."""
    lines = source.read_text().splitlines()
    head, rows = (lines[:1], lines[1:]) if header else ([], lines)
    rows = [r.split(delimiter) for r in rows if r.strip()]
    every_user = sorted({r[0] for r in rows})
    keep = set(every_user if not users or users >= len(every_user) else
               np.random.default_rng(0).choice(every_user, users, replace=False))
    out = head + [delimiter.join([r[0], f"{r[1]}-{zlib.crc32(r[0].encode()) % split_items}",
                                  *r[2:]]) for r in rows if r[0] in keep]
    path = work / f"ratings-split{split_items}-users{users or 'all'}.txt"
    path.write_text("\n".join(out) + "\n")
    return path


def run_seed(seed: int, work: Path, trials: int, quick: bool, config: str,
             raw: Path | None = None, extra: tuple[str, ...] = (), ranks: int = 1) -> dict:
    """tune -> train -> eval of ``config`` at ``seed`` (and ``data.raw`` set to ``raw``;
    ``extra``: more ``--set`` overrides, the same for every seed; ``ranks``: the world
    size of every tuning trial and of the training run, as ``gmeta tune --np`` and
    ``gmeta train --np`` give it)."""
    run_dir = work / f"seed{seed}"
    overrides = [f"run_dir={run_dir}", f"data.path={work / f'data-seed{seed}'}",
                 f"export.dir={run_dir}/export", f"data.seed={seed}", f"model.seed={seed}",
                 f"train.shuffle_seed={seed}"]
    if raw is not None:
        overrides.append(f"data.raw={raw}")
    if quick:
        overrides += ["train.steps=100", "train.eval_every=25"]
    overrides += list(extra)
    sets = [a for o in overrides for a in ("--set", o)]
    timings = {}
    start = time.perf_counter()
    ranks_flag = ("--np", str(ranks)) if ranks > 1 else ()  # one rank: no horovodrun
    _gmeta("tune", "--config", config, "--trials", str(trials), "--seed", str(seed), *ranks_flag,
           *sets)
    timings["tune_s"] = time.perf_counter() - start
    start = time.perf_counter()
    _gmeta("train", "--config", config, "--fresh", *ranks_flag, *sets)
    timings["train_s"] = time.perf_counter() - start
    _gmeta("eval", "--config", config, *sets)
    result = json.loads((run_dir / "eval" / "cold.json").read_text())
    tuned = (run_dir / "tuned.yaml").read_text()
    rows = {_short(r["name"]): {m: r.get(m) for m in (*METRICS, "tasks", "rows")}
            for r in result["rows"]}
    intervals = {_short(p["name"]): p["metrics"] for p in result.get("paired", [])}
    print(f"seed {seed}: {json.dumps(rows)}", flush=True)
    return {"rows": rows, "intervals": intervals, "chosen": result.get("chosen"),
            "blends": blends(result["rows"]), "tuned": tuned, **timings}


def blends(rows: list[dict]) -> dict[str, float]:
    """Each blended row's weight of its own adapted predictions (``gmeta eval``'s
    ``blend``; the rest the fold-in's), by the row's short name: e.g. ``{"meta": 0.63,
    "baseline fine-tuned": 0.52}``; a weight of 0 means the row is the fold-in alone."""
    return {_short(r["name"]): r["blend"] for r in rows if r.get("blend") is not None}


def _short(name: str) -> str:
    """Row names without their settings: 'meta (maml, adapted k=3)' -> 'meta'."""
    if name.startswith("meta ("):
        return META_ROW
    if name.startswith("baseline fine-tuned"):
        return "baseline fine-tuned"
    return name


UNBLENDED = ", not blended with the fold-in"


def complete_rows(runs: list[dict]) -> None:
    """Gives every seed the same rows: ``gmeta eval`` leaves out a model's unblended row
    when its chosen blend is 1 (the same predictions as its blended row), so that seed's
    unblended row is its blended row."""
    names = {n for r in runs for n in r["rows"]}
    for i, r in enumerate(runs):
        for name in sorted(names - set(r["rows"])):
            blended = name.removesuffix(UNBLENDED)
            if blended == name or blended not in r["rows"]:
                raise KeyError(f"run {i} (of the --seeds order) has no row {name!r}")
            r["rows"][name] = r["rows"][blended]


def summarize(runs: list[dict]) -> dict:
    complete_rows(runs)
    names = list(runs[0]["rows"])
    return {n: {m: {"mean": round(float(np.mean([r["rows"][n][m] for r in runs])), 4),
                    "std": round(float(np.std([r["rows"][n][m] for r in runs])), 4)}
                for m in METRICS} for n in names}


def paired(runs: list[dict]) -> dict:
    """The meta model minus every other row, per seed and metric (> 0: meta is better).
    ``better_on_seeds`` counts the unrounded gaps, so a lead under 0.00005 counts (shown
    as +0.0000 in ``per_seed``, which is rounded as the tables are)."""
    out = {}
    for other in runs[0]["rows"]:
        if other == META_ROW:
            continue
        out[other] = {}
        for m in METRICS:
            sign = -1.0 if m == "mae" else 1.0
            exact = [sign * (r["rows"][META_ROW][m] - r["rows"][other][m]) for r in runs]
            diffs = [round(d, 4) for d in exact]
            intervals = [_interval(r, other, m, sign) for r in runs]
            out[other][m] = {"per_seed": diffs, "mean": round(float(np.mean(exact)), 4),
                             "better_on_seeds": sum(d > 0 for d in exact),
                             "interval_per_seed": intervals,
                             "mean_interval": _mean_interval(exact, intervals)}
    return out


def _mean_interval(diffs: list[float], intervals: list) -> list[float] | None:
    """A 95% interval of the mean gap over seeds: the seeds' cold users are disjoint, so
    their standard errors (each interval's width / 3.92) combine as independent."""
    if not diffs or any(i is None for i in intervals):
        return None
    se = float(np.sqrt(sum(((hi - lo) / 3.92) ** 2 for lo, hi in intervals))) / len(diffs)
    mean = float(np.mean(diffs))
    return [round(mean - 1.96 * se, 4), round(mean + 1.96 * se, 4)]


def _interval(run: dict, other: str, metric: str, sign: float) -> list[float] | None:
    """``gmeta eval``'s 95% paired bootstrap interval of the gap over the seed's cold users,
    in this table's sign (> 0: meta better)."""
    gap = run.get("intervals", {}).get(other, {}).get(metric)
    if not gap or gap["low"] is None:
        return None
    return sorted(round(sign * gap[end], 4) for end in ("low", "high"))


def print_table(table: dict, seeds: list[int]) -> None:
    print(f"\ncold users, mean +- std over seeds {seeds}")
    print(f"{'model':<40}" + "".join(f"{m:>20}" for m in METRICS))
    for name, row in table.items():
        print(f"{name:<40}" + "".join(f"{row[m]['mean']:>12.4f} +-{row[m]['std']:.4f}"
                                      for m in METRICS))


def print_gaps(differences: dict) -> None:
    print("\nmeta minus other (MAE: other minus meta; > 0: meta better): mean over seeds "
          "[95% interval], seeds where meta is better")
    print(f"{'other':<40}" + "".join(f"{m:>34}" for m in METRICS))
    for other, d in differences.items():
        cells = []
        for m in METRICS:
            low_high = d[m]["mean_interval"]
            shown = "" if low_high is None else f" [{low_high[0]:+.4f}, {low_high[1]:+.4f}]"
            seeds = len(d[m]["per_seed"])
            cells.append(f"{d[m]['mean']:+.4f}{shown} {d[m]['better_on_seeds']}/{seeds}")
        print(f"{other:<40}" + "".join(f"{c:>34}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 2 trials, 100 steps")
    parser.add_argument("--seeds", default="0,1,2", type=comma_separated(int, minimum=0),
                        help="comma-separated seeds")
    parser.add_argument("--trials", type=int, default=8, help="tuning trials per contender")
    parser.add_argument("--work", help="keep datasets and runs here (default: a temporary dir)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once (default 1)")
    parser.add_argument("--np", dest="ranks", type=int, default=1,
                        help="ranks of every tuning trial and training run (gmeta tune/train "
                             "--np; default 1): the world size a user trains at")
    parser.add_argument("--ratings-only", action="store_true",
                        help="u.data alone through gmeta's csv source (item_id the only "
                             "feature), the pipeline otherwise as shipped")
    parser.add_argument("--ratings", type=Path,
                        help="with --ratings-only: this ratings log instead of u.data "
                             "(user, item, rating, time; a TSV without header or a CSV with)")
    parser.add_argument("--split-items", type=int, default=1,
                        help="with --ratings-only: each item split into N by a hash of the "
                             "user (rare items, as in a larger catalogue)")
    parser.add_argument("--users", type=int,
                        help="with --ratings-only: a seeded sample of this many users")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every command of every seed (repeat), "
                             "e.g. model.prior.feature=item_id")
    args = parser.parse_args()
    if not args.ratings_only:
        for flag, given in (("--ratings", args.ratings is not None),
                            ("--split-items", args.split_items != 1),
                            ("--users", args.users is not None)):
            if given:
                parser.error(f"{flag} reshapes the ratings-only run; add --ratings-only")
    if args.ranks < 1:
        parser.error(f"--np {args.ranks}: expected a number of ranks >= 1")
    if not ML100K.is_dir():
        raise SystemExit(f"MovieLens 100K not found at {ML100K}")
    seeds = [0] if args.quick else args.seeds
    trials = 2 if args.quick else args.trials
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        # The ratings-only config names its raw file; the shipped pipeline reads ML100K.
        config, raw = ((str(ratings_only_config(work, args.ratings, args.split_items,
                                                args.users)), None)
                       if args.ratings_only else ("movielens", ML100K))
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            runs = list(pool.map(lambda s: run_seed(s, work, trials, args.quick, config, raw,
                                                  tuple(args.sets), args.ranks),
                                 seeds))
    table = summarize(runs)
    print_table(table, seeds)
    differences = paired(runs)
    print_gaps(differences)
    wins = {other: all(d[m]["better_on_seeds"] == len(seeds) for m in METRICS)
            for other, d in differences.items()}
    print(json.dumps({"benchmark": "cold_start",
                      "dataset": _dataset_name(args),
                      "seeds": seeds, "ranks": args.ranks,
                      "trials_per_contender": trials, "scored": "cold users, once per seed",
                      "table": table, "paired_meta_minus_other": differences,
                      "meta_better_on_every_seed_and_metric": wins, "runs": runs,
                      "reference_melu_ml1m": {"melu5_mae": 0.785, "wide_deep_mae": 1.069},
                      "machine": machine()}))


def _dataset_name(args) -> str:
    if not args.ratings_only:
        return "ml-100k"
    name = f"{args.ratings or 'ml-100k u.data'} alone"
    if args.split_items > 1:
        name += f", each item split in {args.split_items} by user"
    return name + (f", {args.users} users" if args.users else "")


if __name__ == "__main__":
    main()
