"""The README's click-log example against the logistic regression, on two click logs built
from ``../shared``, through the product path a user runs: ``gmeta tune`` -> ``gmeta train``
-> ``gmeta eval``.

    python -m benchmarks.click_log [--logs criteo-categorical,movielens-clicks]
        [--seeds 0,1,2] [--trials 8] [--model-seeds 0,1,2,3,4] [--jobs 2] [--work DIR]
        [--variant KEY=VALUE ...]

Click logs (CSV with a header line, a training file and two files to score):

- ``criteo-categorical``: the Criteo sample's label and its 26 categorical columns alone
  (no integer columns), its own train / dev / test files (7,200 / 409 / 391 rows).
- ``movielens-clicks``: 8,000 MovieLens 100K ratings drawn at random (seed 7), each with
  its user's age, gender, occupation and zip code and its item's first genre and release
  year; ``click`` = a rating of 5 (21% of the rows); 7,200 / 400 / 400 rows in the order
  drawn (a random split, as the Criteo sample's). A log whose strongest columns are ids
  (user, zip) where the Criteo columns are weak one by one.

For each split seed S: the README's ``my_clicks.yaml`` (no task: a seeded tenth of the
rows validates) with the log's columns in its one table and ``data.seed`` S; ``gmeta tune
--trials N``; ``gmeta train --fresh``; ``gmeta eval --validation``, which scores the
validation rows and both files with the DLRM's best checkpoint and the reference
predictors, the logistic regression among them (fitted on the same training rows, its L2
and epochs chosen on the validation rows). With ``--model-seeds``, each further model seed
M trains again with the tuned settings (``model.seed`` and ``train.shuffle_seed`` M, in
its own run directory) and is scored the same way: how far initial weights and batch
order move the gap on files of about 400 rows.

With ``--variant KEY=VALUE`` (repeatable), every run is trained a second time beside it,
with the same tuned settings, split, model seed and batch order and those ``--set``s on
top (e.g. ``model.start_from_linear=true``), in its own run directory, and scored the
same way: the variant against the DLRM as tuned, paired run by run, in the same job.

Reported: per log, split seed and model seed, the DLRM's AUC minus the logistic
regression's on the validation rows and on each file (and the variant's, with
``--variant``); per log and file the mean gap and how many runs are at least level. The
last line is JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import functools
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks.arguments import comma_separated

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHARED = ROOT.parent / "shared" / "data"
LR = "reference: logistic regression"
FILES = ("valid", "dev", "test")


def _gmeta(log: Path, *args: str) -> None:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    with log.open("a") as out:
        subprocess.run([sys.executable, "-m", "gmeta_tf.cli", *args], cwd=log.parent,
                       env=env, check=True, stdout=out, stderr=subprocess.STDOUT)


def _write(path: Path, header: list[str], rows) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def criteo_categorical(work: Path) -> list[str]:
    """``clicks_{train,dev,test}.csv`` of the Criteo sample's categorical columns."""
    features = [f"C{i}" for i in range(1, 27)]
    for name in ("train", "dev", "test"):
        with (SHARED / "criteo" / f"{name}.tsv").open() as f:
            lines = [line.rstrip("\n").split("\t") for line in f]
        _write(work / f"clicks_{name}.csv", ["row", *features, "click"],
               ([i, *line[14:40], line[0]] for i, line in enumerate(lines)))
    return features


def movielens_clicks(work: Path) -> list[str]:
    """``clicks_{train,dev,test}.csv`` of 8,000 MovieLens 100K ratings (see the module)."""
    ml = SHARED / "ml-100k"
    users = {}
    for line in (ml / "u.user").read_text(encoding="latin-1").splitlines():
        user, age, gender, occupation, zip_code = line.split("|")
        users[user] = (age, gender, occupation, zip_code)
    items = {}
    for line in (ml / "u.item").read_text(encoding="latin-1").splitlines():
        f = line.split("|")
        genres = [str(i) for i, flag in enumerate(f[5:]) if flag == "1"]
        items[f[0]] = (genres[0] if genres else "none", f[2][-4:] if f[2] else "unknown")
    ratings = [line.split() for line in (ml / "u.data").read_text().splitlines()]
    drawn = random.Random(7).sample(ratings, 8000)
    features = ["user_id", "item_id", "age", "gender", "occupation", "zip", "genre", "year"]
    for name, part in (("train", drawn[:7200]), ("dev", drawn[7200:7600]),
                       ("test", drawn[7600:])):
        _write(work / f"clicks_{name}.csv", ["ts", *features, "click"],
               ([ts, user, item, *users[user], *items[item], int(rating == "5")]
                for user, item, rating, ts in part))
    return features


LOGS = {"criteo-categorical": criteo_categorical, "movielens-clicks": movielens_clicks}


def readme_config(features: list[str], run_dir: str) -> dict:
    """The README's ``my_clicks.yaml`` (its fenced block, read from the README so the
    benchmark runs the example as written) with ``features`` in its mapping and its one
    table, ``clicks_train.csv`` to train on, ``clicks_dev.csv`` and ``clicks_test.csv`` to
    score, and its run directory, dataset and export under ``run_dir``."""
    blocks = re.findall(r"```yaml\n(# my_clicks.yaml.*?)```", README.read_text(), flags=re.S)
    if len(blocks) != 1:
        raise SystemExit(f"{README}: expected one yaml block starting '# my_clicks.yaml', "
                         f"found {len(blocks)}")
    config = yaml.safe_load(blocks[0])
    (table,) = config["model"]["tables"].values()
    table["features"] = list(features)
    config["data"]["mapping"]["sparse"] = list(features)
    config["data"].update(raw="clicks_train.csv", path=f"{run_dir}/data")
    config["eval"]["data"] = ["clicks_dev.csv", "clicks_test.csv"]
    config["export"]["dir"] = f"{run_dir}/export"
    config["run_dir"] = run_dir
    return config


def _gaps(run_dir: Path) -> dict:
    """Each scored file's DLRM AUC, the logistic regression's, and the gap."""
    out = {}
    for name, file in (("valid", "valid"), ("dev", "clicks_dev"), ("test", "clicks_test")):
        rows = {r["name"]: r for r in
                json.loads((run_dir / "eval" / f"{file}.json").read_text())["rows"]}
        model = next(n for n in rows if not n.startswith("reference"))
        out[name] = {"model_auc": rows[model]["auc"], "lr_auc": rows[LR]["auc"],
                     "gap": rows[model]["auc"] - rows[LR]["auc"]}
    return out


def _retrain(log: Path, config: Path, tuned_run: str, other: str, split: str, m: int,
             extra: tuple[str, ...] = ()) -> dict:
    """Train the tuned run's settings again in run dir ``other`` (model seed and batch
    order ``m``, its dataset, ``extra`` ``--set``s on top), score it as the tuned run is
    scored, and return its gaps (``_gaps``)."""
    work = config.parent
    (work / other).mkdir(parents=True, exist_ok=True)
    shutil.copy(work / tuned_run / "tuned.yaml", work / other / "tuned.yaml")
    sets = [split, f"run_dir={other}", f"data.path={tuned_run}/data",
            f"export.dir={other}/export", f"model.seed={m}", f"train.shuffle_seed={m}",
            *extra]
    args = [a for s in sets for a in ("--set", s)]
    _gmeta(log, "train", "--config", config.name, "--fresh", *args)
    _gmeta(log, "eval", "--config", config.name, "--validation", *args)
    return _gaps(work / other)


def run_split_seed(log_name: str, features: list[str], work: Path, seed: int, trials: int,
                   model_seeds: list[int], variant: list[str]) -> list[dict]:
    """Tune, train and score one split seed; retrain and score each further model seed;
    with ``variant``, train and score each run again with those ``--set``s on top."""
    config = work / f"seed{seed}.yaml"
    run = f"runs/seed{seed}"
    config.write_text(yaml.safe_dump(readme_config(features, run),
                                     sort_keys=False))
    log = work / f"seed{seed}.log"
    split = f"data.seed={seed}"
    _gmeta(log, "tune", "--config", config.name, "--trials", str(trials), "--set", split)
    _gmeta(log, "train", "--config", config.name, "--fresh", "--set", split)
    _gmeta(log, "eval", "--config", config.name, "--validation", "--set", split)
    results = [{"log": log_name, "split_seed": seed, "model_seed": 0, **_gaps(work / run)}]
    for m in (m for m in model_seeds if m != 0):
        results.append({"log": log_name, "split_seed": seed, "model_seed": m,
                        **_retrain(log, config, run, f"runs/seed{seed}-model{m}", split, m)})
    for r in results if variant else ():
        m = r["model_seed"]
        r["variant"] = _retrain(log, config, run, f"runs/seed{seed}-model{m}-variant", split,
                                m, tuple(variant))
    for r in results:
        print(f"{log_name} split seed {seed} model seed {r['model_seed']}: "
              + ", ".join(f"{f} {r[f]['model_auc']:.4f} vs {r[f]['lr_auc']:.4f} "
                          f"({r[f]['gap']:+.4f})" for f in FILES)
              + ("; variant: " + ", ".join(f"{f} {r['variant'][f]['gap']:+.4f}" for f in FILES)
                 if variant else ""), flush=True)
    return results


def summarize(runs: list[dict], logs: list[str], key=lambda r: r) -> dict:
    """Per log and file: mean gap, runs at least level, runs (of ``key(run)``: the run
    itself, or its variant)."""
    out = {}
    for log_name in logs:
        mine = [key(r) for r in runs if r["log"] == log_name]
        out[log_name] = {f: {"mean_gap": statistics.mean(r[f]["gap"] for r in mine),
                             "at_least_level": sum(r[f]["gap"] >= 0 for r in mine),
                             "runs": len(mine)} for f in FILES}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--logs", default=",".join(LOGS), type=comma_separated(choices=LOGS),
                        help="comma-separated click logs")
    parser.add_argument("--seeds", default="0,1,2", type=comma_separated(int, minimum=0),
                        help="comma-separated split seeds")
    parser.add_argument("--trials", type=int, default=8, help="gmeta tune trials")
    parser.add_argument("--model-seeds", default="0", type=comma_separated(int, minimum=0),
                        help="comma-separated model seeds trained with each split seed's "
                             "tuned settings (0: the tuned run itself)")
    parser.add_argument("--jobs", type=int, default=1, help="split seeds run at once")
    parser.add_argument("--work", help="keep the logs and runs here (default: a temporary dir)")
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                        help="train every run again with this --set on top (repeatable)")
    args = parser.parse_args()
    for item in args.variant:
        if "=" not in item:
            parser.error(f"--variant {item}: expected KEY=VALUE")
    logs = args.logs
    if args.trials < 1:
        parser.error(f"--trials {args.trials}: expected a number of trials >= 1")
    if not SHARED.is_dir():
        raise SystemExit(f"../shared/data not found at {SHARED}")
    seeds = args.seeds
    model_seeds = sorted({0, *args.model_seeds})
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.work or tmp).resolve()
        for name in logs:
            work = base / name
            work.mkdir(parents=True, exist_ok=True)
            features = LOGS[name](work)
            with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
                run = functools.partial(run_split_seed, name, features, work,
                                        trials=args.trials, model_seeds=model_seeds,
                                        variant=args.variant)
                for results in pool.map(run, seeds):
                    runs.extend(results)
    summary = summarize(runs, logs)
    variant = summarize(runs, logs, key=lambda r: r["variant"]) if args.variant else None
    for label, table in (("DLRM", summary), (f"variant {args.variant}", variant)):
        for name, files in (table or {}).items():
            print(f"{name}: {label} AUC minus the logistic regression's, mean over "
                  f"{files['dev']['runs']} runs (runs at least level): "
                  + ", ".join(f"{f} {s['mean_gap']:+.4f} ({s['at_least_level']})"
                              for f, s in files.items()), flush=True)
    print(json.dumps({"benchmark": "click_log", "logs": logs, "split_seeds": seeds,
                      "model_seeds": model_seeds, "trials": args.trials,
                      "variant": args.variant, "summary": summary,
                      "variant_summary": variant, "runs": runs}))


if __name__ == "__main__":
    main()
