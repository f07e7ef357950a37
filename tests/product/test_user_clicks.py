"""The README's "Example: clicks of new users, meta-learned", walked as written on a small
click log made here: clicks (0/1) of users, read as 0/1 ratings under the factor prior ->
meta pipeline on 2 ranks -> eval against the baseline and the references -> export ->
a fresh process serving the SavedModel as the trained model predicts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gmeta_tf import data as meta_io
from tests.product.conftest import served_and_expected
from tests.product.own_data import walk_readme_example, write_ratings

FIRST_LINE = "# my_user_clicks.yaml"


def write_user_clicks(work: Path) -> int:
    """user_clicks.csv (user_id,item_id,click,timestamp): an impression clicked where
    ``write_ratings``'s user rated its item 4 or 5 (enough users for the example's 32 tasks
    a batch on each of 2 ranks). Returns the number of rows."""
    write_ratings(work, users=200)
    lines = (work / "ratings.csv").read_text().splitlines()[1:]
    with open(work / "user_clicks.csv", "w") as f:
        f.write("user_id,item_id,click,timestamp\n")
        for line in lines:
            user, item, rating, time = line.split(",")
            f.write(f"{user},{item},{int(int(rating) >= 4)},{time}\n")
    return len(lines)


@pytest.fixture(scope="module")
def user_clicks_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("user_clicks")
    rows = write_user_clicks(work)
    config, results = walk_readme_example(work, FIRST_LINE)
    return work, rows, config, results


def test_every_click_is_a_zero_or_one_label_of_its_users_task(user_clicks_run):
    _, rows, config, _ = user_clicks_run
    manifest = meta_io.Manifest.load(config.data.path)
    kept = sum(f.rows for f in manifest.files)
    assert 0 < kept <= rows
    labels = np.concatenate([np.asarray(b["support"][config.model.head.label]).ravel()
                             for b in meta_io.read_tasks(config.data.path, 8, None, None,
                                                         split="warm")])
    assert set(np.unique(labels)) <= {0.0, 1.0} and 0 < labels.mean() < 1


def test_eval_scores_clicks_as_ratings_against_the_factorisation(user_clicks_run):
    """The click is the head's label (least squares) and the AUC's; every reference of
    tasks is scored beside the models, the factorisation's fold-in among them."""
    _, _, config, _ = user_clicks_run
    assert config.model.head.kind == "rating" and config.model.prior.factors > 0
    summary = json.loads(Path(config.run_dir, "train_summary.json").read_text())
    assert summary["world_size"] == 2
    result = json.loads(Path(config.run_dir, "eval", "cold.json").read_text())
    names = [r["name"] for r in result["rows"]]
    assert names[0].startswith("meta (maml") and any(n.startswith("baseline fine-tuned")
                                                    for n in names)
    for reference in ("global mean", "item_id mean", "item_id mean + task offset",
                      "matrix factorisation fold-in"):
        assert f"reference: {reference}" in names, names
    for row in result["rows"]:
        assert 0.0 <= row["auc"] <= 1.0 and row["tasks"] > 0
        assert 0.0 < row["mae"] < 1.0  # errors of 0/1 labels


def test_the_exported_click_model_serves_new_users_as_trained(user_clicks_run, tmp_path):
    from gmeta_tf.training.cold_start import restore_models

    _, _, config, _ = user_clicks_run
    models, info = restore_models(config)
    batch = next(iter(meta_io.read_tasks(config.data.path, 2, None, None, split="cold")))
    exported, = Path(config.export.dir).iterdir()
    assert exported.name == str(info["step"])
    out, expected, expected_adapted = served_and_expected(models.model, batch, exported,
                                                          tmp_path)
    np.testing.assert_allclose(out["serve"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["adapt"], expected_adapted, rtol=1e-5, atol=1e-5)
