"""EnsembleTower: the mean of members that each read their own slice of the rows and train
as if alone."""

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.config import ConfigError, load_config
from gmeta_tf.models import BinaryHead, CTRModel, DLRMTower, EnsembleTower
from gmeta_tf.training.model_builder import make_tower

NAMES = ["site", "app"]
DIM = 4


def _ensemble(members=3):
    return EnsembleTower([DLRMTower(NAMES, DIM, {"d": 2}, (4,), (6,), seed=1000 * m,
                                    linear=True, name=f"m{m}") for m in range(members)],
                         name="ensemble")


def _inputs(rng, tower, rows=5):
    out = {f: tf.constant(rng.normal(size=(rows, tower.input_width)), tf.float32)
           for f in NAMES}
    out["d"] = tf.constant(rng.normal(size=(rows, 2)), tf.float32)
    return out


def test_output_is_the_mean_of_the_members_on_their_own_slices():
    rng = np.random.default_rng(0)
    tower = _ensemble()
    assert tower.input_width == 3 * (DIM + 1)
    inputs = _inputs(rng, tower)
    alone = []
    for i, member in enumerate(tower.members):
        w = DIM + 1
        own = {**inputs, **{f: inputs[f][:, i * w:(i + 1) * w] for f in NAMES}}
        alone.append(member(own).numpy())
    np.testing.assert_allclose(tower(inputs).numpy(), np.mean(alone, axis=0), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(tower.member_outputs(tower.params(), inputs).numpy(),
                               np.stack(alone, axis=-1), rtol=1e-5, atol=1e-6)
    kernels = [m.params()["top/0/kernel"].numpy() for m in tower.members]
    assert not np.allclose(kernels[0], kernels[1])  # seeded apart
    assert len(tower.params()) == sum(len(m.params()) for m in tower.members)


def test_each_member_gets_the_gradient_it_would_get_alone():
    """The model's loss is the members' losses summed: member 1's weights and its slice
    of the rows get exactly the gradient of member 1's own loss, and the embedding
    penalty of full rows is the members' penalties summed."""
    rng = np.random.default_rng(1)
    tower = _ensemble(2)
    head = BinaryHead("label")
    model = CTRModel(tf.keras.layers.Layer(), tower, head, embedding_l2=0.3)
    inputs = _inputs(rng, tower, rows=8)
    labels = tf.constant(rng.integers(0, 2, 8), tf.float32)
    member, w = tower.members[1], DIM + 1
    variables = list(member.params().values())
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(inputs["site"])
        loss = model.rows_loss(inputs, labels, training=True)
        own = {**inputs, **{f: inputs[f][:, w:] for f in NAMES}}
        alone = (tf.reduce_mean(head.row_loss(labels, member(own)))
                 + 0.3 * tf.reduce_mean(tf.add_n([tf.reduce_sum(tf.square(own[f]), -1)
                                                  for f in NAMES])))
    for got, want in zip(tape.gradient(loss, variables), tape.gradient(alone, variables)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(tape.gradient(loss, inputs["site"]).numpy()[:, w:],
                               tape.gradient(alone, inputs["site"]).numpy()[:, w:], rtol=1e-5,
                               atol=1e-7)


def test_members_must_match_and_be_two_or_more():
    with pytest.raises(ValueError, match="at least 2"):
        EnsembleTower([DLRMTower(NAMES, DIM)])
    with pytest.raises(ValueError, match="other features"):
        EnsembleTower([DLRMTower(NAMES, DIM), DLRMTower(NAMES, DIM + 1)])


def test_config_members_widen_the_table_rows_and_stay_plain(tmp_path):
    plain = ["meta.enabled=false", "train.baseline=false", f"run_dir={tmp_path}"]
    config = load_config("default", [*plain, "model.members=3"])
    assert config.model.table_dim == 3 * (config.model.embedding_dim + 1)
    tower = make_tower(config.model, "tower")
    assert isinstance(tower, EnsembleTower) and tower.num_members == 3
    assert tower.input_width == config.model.table_dim
    with pytest.raises(ConfigError, match="model.members"):
        load_config("default", [f"run_dir={tmp_path}", "model.members=2"])  # a meta model
    with pytest.raises(ConfigError, match="model.members"):
        load_config("default", [*plain, "model.members=0"])
