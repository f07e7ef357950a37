"""A new user's ratings log as ``benchmarks.cold_start --ratings-only --ratings FILE`` reads
it: a CSV with a header line (``userId,movieId,rating,timestamp``) and half-star ratings
from 0.5 to 5, through the csv source as the benchmark's config maps it; and the flags that
only shape that run refused without ``--ratings-only`` rather than silently ignored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

from benchmarks.cold_start import blends, paired, ratings_only_config
from gmeta_tf import data
from gmeta_tf.config import load_config

ROOT = Path(__file__).resolve().parents[2]
HALF_STARS = [0.5 * k for k in range(1, 11)]


def tiny_half_star_log(path: Path) -> Path:
    lines = ["userId,movieId,rating,timestamp"]
    for user in range(1, 9):
        for item in range(1, 21):
            rating = HALF_STARS[(user * 7 + item * 3) % len(HALF_STARS)]
            lines.append(f"{user},{100 + item},{rating:g},{1000 * user + item}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_half_star_csv_with_a_header_is_read_by_the_pipelines_column_names(tmp_path):
    src = tiny_half_star_log(tmp_path / "ratings.csv")
    path = ratings_only_config(tmp_path, src)
    config = yaml.safe_load(path.read_text())
    mapping = config["data"]["mapping"]
    # the file's userId/movieId read as the pipeline's user_id/item_id (mapping key
    # 'columns', as the README tells a user): the model's keys stay as shipped
    assert mapping["columns"] == ["user_id", "item_id", "rating", "timestamp"]
    assert (mapping["task"], mapping["label"], mapping["sparse"], mapping["order_by"]) == (
        "user_id", "rating", ["item_id"], "timestamp")
    assert mapping["header"] is True and mapping["delimiter"] == ","
    shipped = yaml.safe_load((ROOT / "pipelines" / "ratings.yaml").read_text())
    assert config["model"] == shipped["model"]
    checked = load_config(path, tuned=False)
    assert list(checked.model.tables) == ["item_id"]

    split = data.SplitConfig(query_size=5, min_rows=8)
    data.convert_csv(str(src), str(tmp_path / "out"), mapping, split=split)
    table = pq.read_table([str(p) for p in sorted((tmp_path / "out").rglob("*.parquet"))])
    rating = table.column("rating").to_numpy()
    label = table.column("label").to_numpy()
    assert len(rating) == 8 * 20
    # the half stars survive as they are, and the label is the threshold on them
    assert sorted(set(rating.tolist())) == HALF_STARS
    np.testing.assert_array_equal(label, (rating >= 4).astype(np.float32))


def test_flags_of_the_ratings_only_run_are_refused_without_it(tmp_path):
    src = tiny_half_star_log(tmp_path / "ratings.csv")
    for flags in (["--ratings", str(src)], ["--split-items", "5"], ["--users", "10"]):
        run = subprocess.run([sys.executable, "-m", "benchmarks.cold_start", *flags],
                             cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 2, run.stderr
        assert f"{flags[0]} reshapes the ratings-only run; add --ratings-only" in run.stderr


def test_paired_counts_a_lead_smaller_than_the_tables_rounding():
    """A seed where the meta model leads by 0.00003 is a seed it is better on, though its
    rounded gap reads +0.0; a tie is not; MAE counts lower as better."""
    def run(meta_ndcg, other_ndcg, meta_mae, other_mae):
        rows = {"auc": 0.7, "ndcg@3": 0.0, "mae": 0.0}
        return {"rows": {"meta": {**rows, "ndcg@3": meta_ndcg, "mae": meta_mae},
                         "other": {**rows, "ndcg@3": other_ndcg, "mae": other_mae}}}
    gaps = paired([run(0.87821, 0.87818, 0.80, 0.81), run(0.88, 0.88, 0.80, 0.79)])["other"]
    assert gaps["ndcg@3"]["per_seed"] == [0.0, 0.0]
    assert gaps["ndcg@3"]["better_on_seeds"] == 1
    assert gaps["mae"]["per_seed"] == [0.01, -0.01] and gaps["mae"]["better_on_seeds"] == 1
    assert gaps["auc"]["better_on_seeds"] == 0


def test_blends_are_the_blended_rows_weights_by_their_short_names():
    rows = [{"name": "meta (maml, adapted k=5 + ridge, blend 0.63)", "blend": 0.6312},
            {"name": "meta, not blended with the fold-in"},
            {"name": "baseline fine-tuned (k=4, ridge 10, blend 0.00)", "blend": 0.0},
            {"name": "reference: matrix factorisation fold-in"}]
    assert blends(rows) == {"meta": 0.6312, "baseline fine-tuned": 0.0}
    assert blends([{"name": "meta (maml, adapted k=5)"}]) == {}


def test_the_route_benchmark_draws_its_log_and_copies_the_shipped_pipeline(tmp_path):
    """``benchmarks.ratings_route``: a log's draw is fixed by its seed (the same users and
    ratings each time), its ratings are half stars from 0.5 to 5, ``--rare-items 5`` gives
    each item up to five ids by user and none otherwise; the pipeline it writes loads and
    is ``pipelines/movielens.yaml``'s model and meta settings over the dataset."""
    from benchmarks.ratings_route import write_log, write_pipeline

    paths = [tmp_path / name for name in ("a.csv", "b.csv", "kept.csv")]
    rows = [write_log(paths[0], 3, 40, 5), write_log(paths[1], 3, 40, 5),
            write_log(paths[2], 3, 40, 0)]
    assert rows[0] == rows[1] == rows[2] > 0 and paths[0].read_text() == paths[1].read_text()
    rare, kept = (np.genfromtxt(p, delimiter=",", skip_header=1) for p in paths[::2])
    assert len(np.unique(rare[:, 0])) == 40
    assert set(np.unique(rare[:, 2])) <= set(HALF_STARS)
    np.testing.assert_array_equal(rare[:, [0, 2, 3]], kept[:, [0, 2, 3]])
    np.testing.assert_array_equal(rare[:, 1] // 10, kept[:, 1])
    assert set(np.unique(rare[:, 1] % 10)) == {0, 1, 2, 3, 4}
    write_pipeline(tmp_path / "route.yaml")
    config = load_config(tmp_path / "route.yaml", tuned=False)
    shipped = load_config("movielens", tuned=False)
    assert config.data.source == "dataset" and config.model.item_features == ("movieId",)
    assert config.model.prior.feature == "movieId" and config.model.user_features == ()
    assert config.meta == shipped.meta and config.train == shipped.train
    assert config.eval == shipped.eval
