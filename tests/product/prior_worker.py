"""Fits the label prior of the tiny default pipeline on every rank and saves each copy.

    [horovodrun -np N -H localhost:N] python -m tests.product.prior_worker RUN_DIR DATA_DIR OUT

Rank r writes OUT/rank<r>.npz: the prior's ids, values, out-of-fold values and damping,
and the validation loss of each of ``references.DAMPINGS``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from gmeta_tf import distributed
from gmeta_tf.config import load_config
from gmeta_tf.models.label_prior import LabelPrior
from gmeta_tf.training.model_builder import make_head
from gmeta_tf.training.prior_fit import fit_prior
from gmeta_tf.training.references import DAMPINGS
from tests.product.conftest import tiny_overrides


def main(run_dir: str, data_dir: str, out: str) -> None:
    distributed.init()
    config = load_config("default", tiny_overrides(Path(run_dir), Path(data_dir))
                         + ["model.prior.feature=item_id"])
    prior = LabelPrior("item_id", make_head(config.model).kind, config.model.prior.folds)
    losses = fit_prior(prior, config)
    np.savez(Path(out) / f"rank{distributed.rank()}.npz", ids=prior.ids.numpy(),
             values=prior.values.numpy(),
             fold_values=prior.fold_values.numpy(), damping=prior.damping.numpy(),
             losses=np.array([losses[d] for d in DAMPINGS]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
