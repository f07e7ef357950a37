"""Builds the models of a pipeline config: embeddings, tower, head, meta model, baseline.

The dataset's schema (its manifest) says which features are multi-hot (mean-pooled) and
checks that every configured feature exists, so a typo fails before any training.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from gmeta_tf import data as meta_io
from gmeta_tf.config import (ConfigError, ModelConfig, PipelineConfig, baseline_embedding_l2,
                             configured_blend, tower_sparse_features)
from gmeta_tf.embedding import FeatureConfig, ShardedHashEmbedding
from gmeta_tf.embedding.id_salt import feature_salt
from gmeta_tf.meta import MetaModel
from gmeta_tf.models import (BinaryHead, CTRModel, DLRMTower, EnsembleTower, Head, LabelPrior,
                             MeLUTower, RatingHead)
from gmeta_tf.models.ensemble_tower import MEMBER_SEED_STRIDE
from gmeta_tf.models.label_prior import PRIOR_FACTORS, PRIOR_INPUT
from gmeta_tf.models.tower import Tower
from gmeta_tf.training.devices import Placement

MODEL_EMBEDDING = "embedding"
BASELINE_EMBEDDING = "baseline_embedding"
_OPTIMIZERS = {"adam": tf.keras.optimizers.Adam, "adagrad": tf.keras.optimizers.Adagrad,
               "sgd": tf.keras.optimizers.SGD}


@dataclasses.dataclass
class Models:
    """What a pipeline trains: the main model and, optionally, the non-meta baseline.

    Attributes:
        model: A ``MetaModel`` (``meta.enabled``) or a ``CTRModel``.
        baseline: A ``CTRModel`` with the same tower trained on the same rows, or None.
        state: A ``tf.Module`` holding both models (what checkpoints save).
        optimizers: A ``tf.Module`` holding their Keras optimizers.
    """

    model: tf.keras.Model
    baseline: CTRModel | None
    state: tf.Module
    optimizers: tf.Module

    @property
    def is_meta(self) -> bool:
        return isinstance(self.model, MetaModel)

    @property
    def names(self) -> tuple[str, ...]:
        """The trained models as validation and checkpoints name them."""
        return ("model",) if self.baseline is None else ("model", "baseline")


def dataset_schema(config: PipelineConfig) -> meta_io.Schema:
    """The schema of the config's dataset (it must exist: see ``prepare_dataset``)."""
    return meta_io.Manifest.load(config.data.path).schema


#: How to fit a config to a dataset that lacks a feature it names.
MISSING_FEATURE_HINT = (
    ". A dataset's features are named as its file's columns: to read a column by the "
    "config's name, convert with the mapping key 'columns' (gmeta data csv --rename "
    "COL,...); a feature the data has no column for leaves every key naming it (its "
    "table or model.dense_features entry, model.item_features, model.user_features, "
    "model.prior), as pipelines/ratings.yaml is "
    "pipelines/movielens.yaml for a ratings log alone")


def _check_features(model: ModelConfig, schema: meta_io.Schema) -> None:
    names = {f.name: f for f in schema.features}

    def absent(feature: str) -> str:  # the hint, where the dataset has no such feature
        return "" if feature in names else MISSING_FEATURE_HINT

    for table, spec in model.tables.items():
        for f in spec.features:
            if f not in names or names[f].kind.value not in ("sparse", "multi_hot"):
                raise ConfigError(f"config key 'model.tables.{table}.features' names {f!r}, "
                                  f"which is not a sparse feature of the dataset; its sparse "
                                  f"features are {_of_kind(schema, 'sparse', 'multi_hot')}"
                                  + absent(f))
    for f, width in model.dense_features.items():
        if f not in names or names[f].kind.value != "dense" or names[f].dim != width:
            raise ConfigError(f"config key 'model.dense_features.{f}' = {width!r} is not allowed: "
                              f"expected a dense feature of the dataset with its width, one of "
                              f"{ {n: names[n].dim for n in _of_kind(schema, 'dense')} }"
                              + absent(f))
    prior = model.prior
    if prior is not None and (prior.feature not in names
                              or names[prior.feature].kind.value != "sparse"):
        raise ConfigError(f"config key 'model.prior.feature' = {prior.feature!r} is not allowed: "
                          f"expected a single-valued sparse feature of the dataset, one of "
                          f"{_of_kind(schema, 'sparse')}" + absent(prior.feature))
    for name in (PRIOR_INPUT, PRIOR_FACTORS):
        if prior is not None and name in model.dense_features:
            raise ConfigError(f"config key 'model.dense_features.{name}' is not allowed with "
                              f"'model.prior': the towers read the prior under that name; "
                              f"rename the column when converting the data")
    labels = _of_kind(schema, "label")
    if model.head.label not in labels:
        raise ConfigError(f"config key 'model.head.label' = {model.head.label!r} is not "
                          f"allowed: expected a label of the dataset, one of {labels}")


def _of_kind(schema: meta_io.Schema, *kinds: str) -> list[str]:
    return [f.name for f in schema.features if f.kind.value in kinds]


def make_embedding(model: ModelConfig, schema: meta_io.Schema, name: str,
                   learning_rate: float | None = None) -> ShardedHashEmbedding:
    """The sharded hash embedding of the config's tables (multi-hot features mean-pooled;
    a table with a ``cache`` section gets a MixCache in front of each shard; the features
    of a table with several get per-feature id salts unless it has ``shared_ids``).
    ``learning_rate`` replaces every table's own (the baseline's
    ``train.baseline_table_learning_rate``)."""
    multi_hot = set(_of_kind(schema, "multi_hot"))
    tables, features = [], []
    for table, spec in model.tables.items():
        # A TableSection is the table's TableConfig.
        tables.append(spec if learning_rate is None
                      else dataclasses.replace(spec, learning_rate=learning_rate))
        salted = len(spec.features) > 1 and not spec.shared_ids
        features += [FeatureConfig(f, table, combiner="mean" if f in multi_hot else None,
                                   id_salt=feature_salt(f) if salted else 0)
                     for f in spec.features]
    try:
        return ShardedHashEmbedding(tables, features, name=name)
    except (ValueError, TypeError) as err:  # e.g. a cache the table class cannot combine
        raise ConfigError(f"config section 'model.tables' is not allowed: {err}") from err


def make_tower(model: ModelConfig, name: str, prior: LabelPrior | None = None) -> Tower:
    """The dense tower of the config (reading ``prior``, if given); with ``members`` > 1
    an ``EnsembleTower`` of that many, seeded apart."""
    if model.members > 1:
        return EnsembleTower([_single_tower(model, f"{name}_member{m}",
                                            model.seed + MEMBER_SEED_STRIDE * m)
                              for m in range(model.members)], name=name)
    tower = _single_tower(model, name, model.seed)
    tower.prior = prior  # before its weights are built: the prior's scale is one of them
    return tower


def _single_tower(model: ModelConfig, name: str, seed: int) -> Tower:
    if model.tower == "melu":
        return MeLUTower(model.item_features, model.user_features, model.embedding_dim,
                         model.hidden_units, seed=seed, context_dim=model.context_dim,
                         linear=model.linear, item_factors=model.item_factors, name=name)
    return DLRMTower(tower_sparse_features(model), model.embedding_dim,
                     dict(model.dense_features) or None, model.bottom_units,
                     model.top_units, seed=seed, linear=model.linear, name=name)


def make_head(model: ModelConfig) -> Head:
    if model.head.kind == "rating":
        return RatingHead(model.head.label, model.head.offset)
    return BinaryHead(model.head.label)


def keras_optimizer(config: PipelineConfig, baseline: bool = False
                    ) -> tf.keras.optimizers.Optimizer:
    """The dense optimizer of the main model, or of the baseline (its own learning rate,
    ``train.baseline_learning_rate``, when given)."""
    rate = config.train.learning_rate
    if baseline and config.train.baseline_learning_rate is not None:
        rate = config.train.baseline_learning_rate
    return _OPTIMIZERS[config.train.optimizer](rate)


def ridge_scale(config: PipelineConfig) -> float:
    """How many times the meta model's ridge variable counts (``MetaModel.ridge_strengths``)
    for the outer optimizer to move the strengths' logs at ``meta.ridge_lr``: the rate's
    ratio to the outer rate under Adam and Adagrad (their steps do not scale with the
    gradient), its square root under SGD (whose steps do)."""
    if config.meta.ridge_lr is None:
        return 1.0
    ratio = config.meta.ridge_lr / config.train.learning_rate
    return math.sqrt(ratio) if config.train.optimizer == "sgd" else ratio


def build_models(config: PipelineConfig, placement: Placement | None = None,
                 with_baseline: bool | None = None) -> Models:
    """Creates (and builds, so a checkpoint can be restored into them) the config's models.

    Args:
        config: The pipeline config.
        placement: Devices of the tables and of the dense tower (default: CPU for both).
        with_baseline: Also build the baseline; default ``train.baseline`` for a meta model.

    Returns:
        The models, their optimizers, and the module a checkpoint saves.
    """
    placement = placement or Placement.cpu()
    schema = dataset_schema(config)
    _check_features(config.model, schema)
    if with_baseline is None:
        with_baseline = config.train.baseline and config.meta.enabled
    head = make_head(config.model)
    with tf.device(placement.tables):
        embedding = make_embedding(config.model, schema, MODEL_EMBEDDING)
        baseline_embedding = (make_embedding(config.model, schema, BASELINE_EMBEDDING,
                                             config.train.baseline_table_learning_rate)
                              if with_baseline else None)
    with tf.device(placement.dense):
        # One label prior, read by both towers.
        p = config.model.prior
        prior = (LabelPrior(p.feature, head.kind, p.folds, p.factors, p.factors_in_output)
                 if p is not None else None)
        tower = make_tower(config.model, "tower", prior)
        try:
            if config.meta.enabled:
                model = MetaModel(embedding, tower, head, config.meta,
                                  embedding_l2=config.train.embedding_l2,
                                  ridge_scale=ridge_scale(config),
                                  embedding_dropout=config.train.embedding_dropout,
                                  name="meta_model")
            else:
                model = CTRModel(embedding, tower, head, config.train.embedding_l2,
                                 embedding_dropout=config.train.embedding_dropout,
                                 name="ctr_model")
        except ValueError as err:  # e.g. a fast_weights selector matching nothing
            raise ConfigError(f"config section 'meta' is not allowed: {err}") from err
        baseline = (CTRModel(baseline_embedding, make_tower(config.model, "baseline_tower",
                                                            prior),
                             head, baseline_embedding_l2(config),
                             within_task_loss=config.meta.within_task_loss,
                             embedding_dropout=config.train.embedding_dropout,
                             name="baseline_model")
                    if with_baseline else None)
        optimizers = tf.Module(name="optimizers")
        optimizers.model = keras_optimizer(config)
        model.compile(optimizer=optimizers.model)
        if baseline is not None:
            optimizers.baseline = keras_optimizer(config, baseline=True)
            baseline.compile(optimizer=optimizers.baseline)
        _build_variables(model, optimizers.model)
        if baseline is not None:
            _build_variables(baseline, optimizers.baseline)
    state = tf.Module(name="state")
    state.model = model
    if baseline is not None:
        state.baseline = baseline
    models = Models(model, baseline, state, optimizers)
    set_configured_blend(models, config)
    return models


def set_configured_blend(models: Models, config: PipelineConfig) -> None:
    """Sets a ``model.prior.blend`` given in the config on every tower (after a restore
    too: the config's value, not the checkpoint's); unset, it is chosen on validation
    (``evaluation.Validator``) and a checkpoint's is kept."""
    blend = configured_blend(config.model)
    if blend is None:
        return
    for model in (models.model, models.baseline):
        if model is not None and model.tower.prior_blend is not None:
            model.tower.prior_blend.assign(blend)


def dense_slow_variables(model: tf.keras.Model) -> list[tf.Variable]:
    """The dense variables the Keras optimizer updates."""
    if isinstance(model, MetaModel):
        return model.slow_variables
    return model.tower.trainable_variables


def _build_variables(model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer) -> None:
    """Creates every variable without touching the tables, so a restore can fill them.

    No collective runs here (the embedding is built from shapes, not called): a rank that
    joins an elastic job builds its models alone."""
    model.tower.params()
    if not model.embedding.built:
        model.embedding.build(None)
    optimizer.build(dense_slow_variables(model))


def empty_inputs(embedding: ShardedHashEmbedding) -> dict:
    """Zero ids for every feature of an embedding (a read of nothing)."""
    empty = tf.zeros([0], tf.int64)
    return {f.name: empty if f.combiner is None
            else tf.RaggedTensor.from_row_lengths(empty, tf.zeros([0], tf.int64))
            for f in embedding.feature_configs}
