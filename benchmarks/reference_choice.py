"""The factorisation's settings chosen on the validation split alone against chosen on it
pooled with training tasks held out in turn (``references.HeldOutProtocol``), on the cold
users of converted ratings logs: the matrix-factorisation fold-in reference alone, no
network trained.

    python -m benchmarks.reference_choice DIR [DIR ...]

Each DIR is a log as ``benchmarks.ratings_route --data-only`` leaves it (``route.yaml`` and
the converted ``data``). Per log, the factorisation's L2, item bias, fold-in prior and
fold-in strength (``references.MF_REGS`` x ``MF_ITEM_BIASES`` x ``FOLD_IN_PRIORS`` x
``MF_FOLD_IN``) are chosen by the fold-in's MAE two ways:

- ``validation``: on the validation split's query rows alone (the product before the
  held-out folds);
- ``pooled``: on those and the query rows of the training tasks held out in turn, five
  folds, the factorisation fitted without each (what the reference and the factor prior
  do now, ``references.held_out_grid``).

Reported: one JSON line per log, each way's settings and loss, the number of validation
and held-out users, and cold users' AUC, within-user AUC, nDCG@3 and MAE (``gmeta eval``'s
metrics) of the factorisation fitted on every training row under each way's settings.

The line's ``offset`` does the same for the item mean + task offset reference's two
dampings (``references.DAMPINGS``): ``sequential`` (the item's damping chosen on the item
mean's validation loss, then the task's on the offset model's: the product before
``references.mean_offset_grid``), ``joint`` (both together, on validation alone) and
``pooled`` (both together, on validation and the held-out folds: the product now).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import item_bias  # noqa: E402
from benchmarks.item_bias import Log, Split  # noqa: E402
from gmeta_tf.training import references as R  # noqa: E402
from gmeta_tf.training.prior_fit import held_out_protocol  # noqa: E402

GRID = [(r, b, p) for r in R.MF_REGS for b in R.MF_ITEM_BIASES for p in R.FOLD_IN_PRIORS]


def probe(work: Path) -> dict:
    config, tasks, items, labels, valid, cold = Log.load(work)
    folds = held_out_protocol(config).folds_of(tasks, items, labels)

    def fit(rows, setting):
        rows = slice(None) if rows is None else rows
        return R.FactorModel(tasks[rows], items[rows], labels[rows], reg=setting[0],
                             item_bias=setting[1])

    out: dict = {"bench": "reference_choice", "log": str(work),
                 "valid_users": len(np.unique(valid.users)), "cold_users": len(np.unique(cold.users)),
                 "held_out_users": int(sum(len(task.real) for _, task, _ in folds))}
    for name, held_out in (("validation", []), ("pooled", folds)):
        losses, models, rows = R.held_out_grid(fit, GRID, R.MF_FOLD_IN, valid.tasks,
                                               valid.labels, held_out)
        setting, strength = min(losses, key=losses.get)
        out[name] = {"setting": [*setting, strength], "loss": round(losses[(setting, strength)], 5),
                     "rows": rows, "cold": cold.figures(models[setting], strength)}
    out["offset"] = offset_choices(R.FeatureMean(items, labels),
                                   lambda keep: R.FeatureMean(items[keep], labels[keep]),
                                   valid, cold, folds)
    return out


def offset_choices(mean: R.FeatureMean, fit, valid: Split, cold: Split, folds) -> dict:
    """The item mean + task offset's dampings chosen the three ways of the docstring, and
    each choice's cold figures."""
    alone = R.mean_offset_grid(mean, fit, valid.tasks, valid.labels, [])
    pooled = R.mean_offset_grid(mean, fit, valid.tasks, valid.labels, folds)
    d_item = min((k for k in alone if k[1] is None), key=alone.get)[0]
    choices = {
        "sequential": min(((d_item, d) for d in R.DAMPINGS), key=alone.get),
        "joint": min((k for k in alone if k[1] is not None), key=alone.get),
        "pooled": min((k for k in pooled if k[1] is not None), key=pooled.get)}
    out = {}
    for name, (d_item, d_task) in choices.items():
        damped = mean.with_damping(d_item)
        predictions = np.concatenate([R.mean_offset(damped, t, d_task)[t.real]
                                      for t in cold.tasks])
        out[name] = {"setting": [d_item, d_task], "cold": cold.scores(predictions)}
    return out


def main(argv: list[str] | None = None) -> None:
    item_bias.main(argv, probe, __doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
