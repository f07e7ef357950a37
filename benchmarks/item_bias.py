"""The factorisation's item biases fitted with its factors against held at damped item
means (``model.prior.item_bias``), on the cold users of converted ratings logs: the
matrix-factorisation fold-in reference alone, no network trained.

    python -m benchmarks.item_bias DIR [DIR ...]

Each DIR is a log as ``benchmarks.ratings_route --data-only`` leaves it (``route.yaml`` and
the converted ``data``). Per log, three ways to set the factorisation, each choosing the
rest of its settings (L2 x fold-in prior x fold-in strength, ``references.MF_REGS`` x
``FOLD_IN_PRIORS`` x ``MF_FOLD_IN``) by the fold-in's MAE on the validation users, as the
reference and the factor prior do:

- ``fitted``: the item biases fitted with the factors (the factorisation before
  ``item_bias``);
- ``held``: held at the damped item means, the damping (3, 10, 30) chosen likewise;
- ``chosen``: whichever of the two has the lower validation loss (what the product does
  with ``item_bias`` unset);
- ``one_se``: ``held`` only where its validation loss is lower than ``fitted``'s by more
  than one standard error of the paired difference (clustered by user), else ``fitted``.

Reported: one JSON line per log, each way's settings, validation loss, and cold users' AUC,
within-user AUC, nDCG@3 and MAE (``gmeta eval``'s metrics), and the validation gap and
its standard error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from gmeta_tf.config import load_config  # noqa: E402
from gmeta_tf.data.schema import TASK_COLUMN  # noqa: E402
from gmeta_tf.meta.evaluation import report_from_rows  # noqa: E402
from gmeta_tf.training import references as R  # noqa: E402
from gmeta_tf.training.evaluation import (clustered_spread, split_dataset,  # noqa: E402
                                          task_batches)

HELD = tuple(b for b in R.MF_ITEM_BIASES if b != "fitted")


class Split:
    """A split's tasks as the fold-in reads them, and their query rows' labels and users."""

    def __init__(self, config, split: str, feature: str, label: str):
        batches = [{role: {k: np.asarray(v) for k, v in b[role].items()}
                    for role in ("support", "query")}
                   for b in task_batches(config, split, equal_steps=False)]
        self.tasks = [R.FoldInTask.of(b, feature, label) for b in batches]
        rows = R.query_rows(batches, [label, "label"])
        self.labels, self.binary = rows[label], rows["label"]
        real = np.concatenate([t.real.sum(axis=1) for t in self.tasks])  # query rows a task
        self.users = np.repeat(np.arange(len(real)), real)  # each row's task, in their order

    def predict(self, model: R.FactorModel, strength: float) -> np.ndarray:
        return np.concatenate([t.predict(model, strength)[t.real] for t in self.tasks])

    def figures(self, model: R.FactorModel, strength: float) -> dict:
        return self.scores(self.predict(model, strength))

    def scores(self, predictions: np.ndarray) -> dict:
        """``gmeta eval``'s metrics of predictions of the query rows (in their order)."""
        pred = np.clip(predictions, 0.5, 5.0)
        report = report_from_rows(self.users, pred, self.labels, self.binary, self.labels,
                                  "rating", 3, True).overall
        return {k: round(float(report[k]), 5) for k in ("auc", "task_auc", "ndcg@3", "mae")}


class Log(NamedTuple):
    """A converted log's pipeline config, its training rows (each row's task, item and
    label) and its validation and cold splits."""

    config: object
    tasks: np.ndarray
    items: np.ndarray
    labels: np.ndarray
    valid: Split
    cold: Split

    @classmethod
    def load(cls, work: Path) -> "Log":
        """The log in ``work`` (``benchmarks.ratings_route --data-only``); the working
        directory becomes ``work``, where ``route.yaml`` reads its data from."""
        os.chdir(work)
        config = load_config("route.yaml", [], tuned=False)
        feature, label = config.model.prior.feature, config.model.head.label
        train = R.rows_of(split_dataset(config, "warm").rows(4096),
                          [feature, label, TASK_COLUMN])
        labels = np.asarray(train[label], np.float64)
        return cls(config, np.asarray(train[TASK_COLUMN]),
                   R.first_column(train[feature]), labels,
                   Split(config, config.train.validation_split, feature, label),
                   Split(config, config.eval.split, feature, label))


def probe(work: Path) -> dict:
    config, tasks, items, labels, valid, cold = Log.load(work)
    out: dict = {"bench": "item_bias", "log": str(work),
                 "valid_users": len(np.unique(valid.users)),
                 "cold_users": len(np.unique(cold.users))}
    errors = {}
    for name, biases in (("fitted", ("fitted",)), ("held", HELD)):
        losses, models, _ = R.fold_in_grid(
            R.factorisations(lambda s: R.FactorModel(tasks, items, labels, reg=s[0],
                                                     item_bias=s[1])),
            [(r, b, p) for r in R.MF_REGS for b in biases for p in R.FOLD_IN_PRIORS],
            R.MF_FOLD_IN, valid.tasks, valid.labels)
        setting, strength = min(losses, key=losses.get)
        model = models[setting]
        errors[name] = np.abs(valid.predict(model, strength) - valid.labels)
        out[name] = {"setting": [*setting, strength],
                     "valid_loss": round(losses[(setting, strength)], 5),
                     "cold": cold.figures(model, strength)}
    diff = errors["fitted"] - errors["held"]
    out["valid_gap"] = float(diff.mean())
    out["valid_se"] = clustered_spread(diff - diff.mean(), valid.users) / len(diff)
    out["chosen"] = "held" if out["held"]["valid_loss"] < out["fitted"]["valid_loss"] else "fitted"
    out["one_se"] = "held" if out["valid_gap"] > out["valid_se"] else "fitted"
    return out


def main(argv: list[str] | None = None, probe=probe, doc: str = __doc__) -> None:
    """One JSON line of ``probe`` per converted log named in ``argv`` (``doc``: the
    benchmark's docstring, for ``--help``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="converted logs (benchmarks.ratings_route)")
    args = parser.parse_args(argv)
    here = Path.cwd()
    for log in args.logs:
        print(json.dumps(probe((here / log).resolve())), flush=True)
        os.chdir(here)


if __name__ == "__main__":
    main(sys.argv[1:])
