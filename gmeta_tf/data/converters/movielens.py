"""MovieLens 100K -> dataset: ratings joined with user and item features; tasks are users.

Features (all per rating row): ``user_id``, ``item_id``, ``age`` (MovieLens-1M age group
0..6), ``gender`` (0 M, 1 F), ``occupation`` (index in u.occupation), ``zip`` (hashed
3-digit prefix), ``year`` (release year, 0 if unknown), ``genres`` (multi-hot, genre
indices of u.genre, width 6). Labels: ``rating`` (1..5, for the MAE head) and ``label``
(rating >= 4, for AUC), per the cold-start protocol of DESIGN.md. Rows of a user are in
time order, which ``query_selection="last"`` uses.

u.user and u.item are small lookup tables read whole; u.data is streamed.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from gmeta_tf.data import hashing
from gmeta_tf.data.converters.pipeline import OutputConfig, RawBatch, columns_to_batch, convert
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import Manifest
from gmeta_tf.data.schema import (LABEL_COLUMN, PAD_ID, TASK_COLUMN, Feature, FeatureKind,
                                  Schema)
from gmeta_tf.data.split import ORDER_COLUMN, SplitConfig

GENRE_WIDTH = 6
_AGE_EDGES = np.array([18, 25, 35, 45, 50, 56])  # MovieLens-1M age groups

SCHEMA = Schema([
    Feature("user_id", FeatureKind.SPARSE), Feature("item_id", FeatureKind.SPARSE),
    Feature("age", FeatureKind.SPARSE), Feature("gender", FeatureKind.SPARSE),
    Feature("occupation", FeatureKind.SPARSE), Feature("zip", FeatureKind.SPARSE),
    Feature("year", FeatureKind.SPARSE),
    Feature("genres", FeatureKind.MULTI_HOT, dim=GENRE_WIDTH),
    Feature("rating", FeatureKind.LABEL, value_range=(1.0, 5.0)),
    Feature(LABEL_COLUMN, FeatureKind.LABEL, value_range=(0.0, 1.0)),
])


def _read_pipe_table(path: str, names: list[str]) -> pa.Table:
    if not os.path.exists(path):
        raise DataError("MovieLens file not found", file=path)
    return pacsv.read_csv(
        path, read_options=pacsv.ReadOptions(column_names=names, encoding="latin-1"),
        parse_options=pacsv.ParseOptions(delimiter="|", quote_char=False),
        convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}))


def _dense_lookup(ids: np.ndarray, values: np.ndarray, default: int = 0) -> np.ndarray:
    table = np.full(int(ids.max()) + 1, default, values.dtype)
    table[ids] = values
    return table


def _user_features(src_dir: str) -> dict[str, np.ndarray]:
    """Per-feature lookup arrays indexed by user id."""
    users = _read_pipe_table(os.path.join(src_dir, "u.user"), ["id", "age", "gender", "occ", "zip"])
    occupations = [line.strip() for line in open(os.path.join(src_dir, "u.occupation")) if line.strip()]
    ids = users["id"].cast(pa.int64()).to_numpy()
    occ = [occupations.index(o) for o in users["occ"].to_pylist()]
    zips = pa.array([z[:3] for z in users["zip"].to_pylist()])
    return {
        "age": _dense_lookup(ids, np.searchsorted(_AGE_EDGES, users["age"].cast(pa.int64()).to_numpy(),
                                                  side="right")),
        "gender": _dense_lookup(ids, (np.array(users["gender"].to_pylist()) == "F").astype(np.int64)),
        "occupation": _dense_lookup(ids, np.array(occ, np.int64)),
        "zip": _dense_lookup(ids, hashing.to_ids(zips, "zip")),
    }


def _item_features(src_dir: str) -> dict[str, np.ndarray]:
    """Per-feature lookup arrays indexed by item id (genres: [items, GENRE_WIDTH])."""
    names = ["id", "title", "date", "video", "url"] + [f"g{i}" for i in range(19)]
    items = _read_pipe_table(os.path.join(src_dir, "u.item"), names)
    ids = items["id"].cast(pa.int64()).to_numpy()
    years = np.array([int(d[-4:]) if d else 0 for d in items["date"].to_pylist()], np.int64)
    flags = np.stack([items[f"g{i}"].cast(pa.int64()).to_numpy() for i in range(19)], axis=1)
    genres = np.full((int(ids.max()) + 1, GENRE_WIDTH), PAD_ID, np.int64)
    for row, item in zip(flags, ids):
        hot = np.flatnonzero(row)[:GENRE_WIDTH]
        genres[item, : len(hot)] = hot
    return {"year": _dense_lookup(ids, years), "genres": genres}


def _raw_batches(src_dir: str, block_bytes: int) -> Iterator[RawBatch]:
    path = os.path.join(src_dir, "u.data")
    if not os.path.exists(path):
        raise DataError("MovieLens file not found", file=path)
    users, items = _user_features(src_dir), _item_features(src_dir)
    reader = pacsv.open_csv(
        path, read_options=pacsv.ReadOptions(column_names=["user", "item", "rating", "ts"],
                                             block_size=block_bytes),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(column_types={"user": pa.int64(), "item": pa.int64(),
                                                           "rating": pa.float32(), "ts": pa.int64()}))
    first_row = 0
    for batch in reader:
        user, item = batch["user"].to_numpy(), batch["item"].to_numpy()
        rating = batch["rating"].to_numpy(zero_copy_only=False)
        cols = {TASK_COLUMN: user, "user_id": user, "item_id": item}
        cols.update({k: v[user] for k, v in users.items()})
        cols["year"] = items["year"][item]
        cols.update({f"genres__{i}": items["genres"][item, i] for i in range(GENRE_WIDTH)})
        cols["rating"] = rating
        cols[LABEL_COLUMN] = np.where(np.isnan(rating), np.nan, rating >= 4).astype(np.float32)
        cols[ORDER_COLUMN] = batch["ts"].to_numpy()
        yield RawBatch(columns_to_batch(cols), path, first_row)
        first_row += batch.num_rows


def convert_movielens(src_dir: str, out_dir: str, seed: int = 0, split: SplitConfig | None = None,
                      output: OutputConfig | None = None, block_bytes: int = 1 << 20) -> Manifest:
    """Converts MovieLens 100K (``src_dir`` holds u.data, u.user, u.item, u.occupation).

    Args:
        src_dir: The ml-100k directory.
        out_dir: Output dataset directory.
        seed: Split seed (ignored when ``split`` is given).
        split: Split parameters; default: DESIGN.md protocol (80% warm, 10 query rows at
            random, users with fewer than 13 ratings dropped).
        output: File format and sizes.
        block_bytes: u.data bytes parsed per batch.

    Returns:
        The manifest of the written dataset.
    """
    data = os.path.join(src_dir, "u.data")
    return convert(_raw_batches(src_dir, block_bytes), SCHEMA, out_dir,
                   split=split or SplitConfig(seed=seed), output=output or OutputConfig(),
                   input_bytes=os.path.getsize(data) if os.path.exists(data) else 0,
                   source={"kind": "movielens-100k", "path": os.path.abspath(src_dir)})
