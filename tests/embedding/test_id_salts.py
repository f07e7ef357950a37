"""Per-feature id salts: features sharing a table never share a row by accident, the
frozen serving table finds the same rows, and a shared id space is kept on request."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from gmeta_tf.config import from_dict
from gmeta_tf.data import Feature, FeatureKind, Schema
from gmeta_tf.embedding import FeatureConfig, ShardedHashEmbedding, TableConfig
from gmeta_tf.embedding.id_salt import feature_salt, salt_ids
from gmeta_tf.serving.saved_model_export import frozen_tables
from gmeta_tf.serving.static_embedding import StaticEmbedding
from gmeta_tf.training.model_builder import make_embedding

IDS = tf.constant([0, 1, 2, 1, 7], tf.int64)


def _layer(salted: bool) -> ShardedHashEmbedding:
    salt = feature_salt if salted else (lambda name: 0)
    return ShardedHashEmbedding(
        tables=[TableConfig("shared", 4)],
        features=[FeatureConfig("banner_pos", "shared", id_salt=salt("banner_pos")),
                  FeatureConfig("device_type", "shared", id_salt=salt("device_type"))])


def test_salts_keep_equal_ids_of_two_features_on_different_rows():
    layer = _layer(salted=True)
    out = layer({"banner_pos": IDS, "device_type": IDS}, training=True)
    assert layer.table_sizes()["shared"] == 2 * 4  # 4 distinct ids per feature
    assert not np.isclose(out["banner_pos"].numpy(), out["device_type"].numpy()).all(1).any()
    plain = _layer(salted=False)
    out = plain({"banner_pos": IDS, "device_type": IDS}, training=True)
    assert plain.table_sizes()["shared"] == 4
    np.testing.assert_array_equal(out["banner_pos"].numpy(), out["device_type"].numpy())


def test_the_frozen_serving_table_reads_the_trained_rows_of_salted_features():
    layer = _layer(salted=True)
    trained = layer({"banner_pos": IDS, "device_type": IDS}, training=True)
    static = StaticEmbedding(frozen_tables(layer), layer.feature_configs)
    served = static({"banner_pos": IDS, "device_type": IDS})
    for name in ("banner_pos", "device_type"):
        np.testing.assert_array_equal(served[name].numpy(), trained[name].numpy())
    multi = ShardedHashEmbedding(
        tables=[TableConfig("shared", 4)],
        features=[FeatureConfig("genres", "shared", combiner="mean",
                                id_salt=feature_salt("genres")),
                  FeatureConfig("item_id", "shared", id_salt=feature_salt("item_id"))])
    ragged = tf.RaggedTensor.from_row_lengths(IDS, [2, 3])
    trained = multi({"genres": ragged, "item_id": IDS}, training=True)
    served = StaticEmbedding(frozen_tables(multi), multi.feature_configs)(
        {"genres": ragged, "item_id": IDS})
    np.testing.assert_array_equal(served["genres"].numpy(), trained["genres"].numpy())


def test_salting_is_a_bijection_and_zero_is_no_salt():
    ids = tf.constant(np.arange(-1000, 100_000), tf.int64)
    salted = salt_ids(ids, feature_salt("C1")).numpy()
    assert len(np.unique(salted)) == len(salted)
    np.testing.assert_array_equal(salt_ids(ids, 0).numpy(), ids.numpy())


def test_the_builder_salts_shared_tables_unless_they_share_ids_on_purpose():
    schema = Schema([Feature("item_id", FeatureKind.SPARSE), Feature("clicked", FeatureKind.SPARSE),
                     Feature("user_id", FeatureKind.SPARSE),
                     Feature("label", FeatureKind.LABEL)])
    config = from_dict({"model": {"tables": {
        "items": {"features": ["item_id", "clicked"], "shared_ids": True},
        "mixed": {"features": ["user_id"]}}}})
    salts = {f.name: f.id_salt for f in make_embedding(config.model, schema, "e1").feature_configs}
    assert salts == {"item_id": 0, "clicked": 0, "user_id": 0}
    config = from_dict({"model": {"tables": {"all": {"features": ["item_id", "clicked",
                                                                  "user_id"]}}}})
    salts = {f.name: f.id_salt for f in make_embedding(config.model, schema, "e2").feature_configs}
    assert salts == {n: feature_salt(n) for n in ("item_id", "clicked", "user_id")}
