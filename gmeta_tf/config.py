"""The one config of a pipeline: YAML (safe-loaded) -> small validated dataclasses.

A pipeline config has five sections, one dataclass each: ``data`` (where the dataset comes
from and how batches are cut), ``model`` (tables, tower, head), ``meta`` (the inner and
outer loops; off for a plain CTR model), ``train`` (steps, optimizer, logging, evaluation
and checkpoint intervals) and ``eval`` / ``export``. Every key is checked against its
field's type and range; an error names the key, the value and what is allowed::

    config key 'train.steps' = -5 is not allowed: expected an integer >= 1

Command-line overrides ``--set key.sub=value`` are applied to the YAML before checking
(the value is parsed as YAML: ``--set meta.enabled=false``, ``--set model.top_units=[64,32]``).

Example::

    config = load_config("pipelines/default.yaml", overrides=["train.steps=50"])
    config.train.steps, config.model.tower     # 50, 'dlrm'
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import difflib
import logging
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from gmeta_tf.atomic_file import write_text_atomically
from gmeta_tf.config_fields import (ConfigError, FieldError, field, load_yaml, range_violation,
                                    type_name, type_violation)
from gmeta_tf.data.split import SplitConfig, source_split
from gmeta_tf.embedding.config import TableConfig
from gmeta_tf.meta.meta_config import MetaConfig

#: Where the embedded default pipeline lives (shipped with the project).
PIPELINES_DIR = Path(__file__).resolve().parents[1] / "pipelines"
DEFAULT_PIPELINE = "default"


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


# ---- the sections -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """Size of the generated dataset (``data.source: synthetic``)."""

    tasks: int = field(8000, min=10)
    rows_per_task: int = field(24, min=4)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the task-partitioned dataset comes from and how it is batched.

    ``path`` is the dataset directory (unless given, ``<run_dir>/data``); ``prepare``
    makes it from ``source``: generated (``synthetic``), converted from ``raw``
    (``movielens``, ``criteo``, or ``csv`` with the column ``mapping``: a mapping of
    ``gmeta_tf.data.CsvMapping`` keys, or the path of a YAML file of them), or
    ``dataset`` (converted beforehand; it must exist). A converted or generated dataset
    is a cache of the config: made again when its source, mapping, split or block size
    changed, or when its splits have fewer blocks than ranks.
    ``rows_per_block`` None chooses blocks from the row count and the world size.
    ``bad_rows`` is the converter's policy (``error`` or ``skip``). Relative paths are
    relative to the working directory (the project root for ``make demo``).

    ``verify``: what every rank checks of its share of each split's files against the
    dataset's manifest before ``gmeta train`` or ``eval`` reads them: ``checksum`` (size,
    schema and SHA-256, so a file changed in place stops the run, naming it) or ``size``
    (size and schema alone: a dataset too large to hash at every start).

    ``split`` is the cold-start protocol (``gmeta_tf.data.SplitConfig``, which defines the
    keys): the keys given replace the source's own protocol (``SOURCE_SPLITS``), and its
    ``seed`` is ``seed`` unless given; absent, the source's protocol (``dataset``: whatever
    the dataset was split with). ``seed`` also seeds generated data.

    ``task_column`` (``criteo``): the categorical column whose value is the task; null
    makes every row its own task (row data for a plain CTR model).

    A meta model reads batches of ``tasks_per_batch`` whole tasks with ``support`` and
    ``query`` slots; a plain CTR model (``meta.enabled: false``) reads batches of
    ``batch_size`` rows, every row of the split once per epoch.
    """

    path: str = "runs/default/data"
    source: Literal["synthetic", "movielens", "criteo", "csv", "dataset"] = "synthetic"
    raw: str | None = None
    mapping: Any = None
    bad_rows: Literal["error", "skip"] = "error"
    synthetic: SyntheticConfig = SyntheticConfig()
    split: SplitConfig | None = None
    seed: int = 0
    task_column: str | None = "C2"
    rows_per_block: int | None = field(None, min=1)
    tasks_per_batch: int = field(32, min=1)
    support: int | None = field(20, min=1)
    query: int | None = field(5, min=1)
    batch_size: int = field(256, min=1)
    reader: Literal["auto", "arrow", "tfio_iotensor", "tfio_dataset"] = "auto"
    verify: Literal["checksum", "size"] = "checksum"


@dataclasses.dataclass(frozen=True)
class TableSection(TableConfig):
    """One hash table of the model: a ``gmeta_tf.embedding.TableConfig`` (which defines its
    keys: ``optimizer``, ``learning_rate``, ``admit_after``, ``init_scale``, ``cache`` (a
    ``MixCacheConfig``: a cache of hot rows in front of each rank's shard, which changes
    speed only, never the trained rows), ...) and the features looked up in it. The
    table's name is its key in ``model.tables``, its ``dim`` the model's
    (``ModelConfig.table_dim``) and its ``seed`` ``model.seed``.

    Features sharing a table get per-feature id salts (``gmeta_tf.embedding.id_salt``):
    equal ids of two features are different rows. ``shared_ids: true`` says the table's
    features share one id space on purpose (``item_id`` and a ``clicked_items`` history):
    equal ids are then the same row."""

    features: tuple[str, ...] = ()
    shared_ids: bool = False

    #: Keys the pipeline fills in (a YAML table does not give them).
    DERIVED: typing.ClassVar[tuple[str, ...]] = ("name", "dim", "seed")


@dataclasses.dataclass(frozen=True)
class HeadSection:
    """How the tower's output becomes a prediction: ``binary`` (sigmoid, log loss) or
    ``rating`` (output + offset, squared error)."""

    kind: Literal["binary", "rating"] = "binary"
    label: str = "label"
    offset: float = 0.0


@dataclasses.dataclass(frozen=True)
class PriorSection:
    """The label prior (``gmeta_tf.models.LabelPrior``): each value of ``feature`` (a
    single-valued sparse feature the tower reads, e.g. the item id) adds its damped mean
    label on the training split to the raw output, fixed, for every model of the pipeline.
    ``damping`` None chooses it on the validation split (the value whose prior alone
    scores the validation query rows best). With ``folds`` K > 1 a training row reads the
    prior fitted without the tasks of its fold (``task_id mod K``), so it never counts its
    own label, as a new task's rows are never counted (1: every row reads the prior of
    all training rows, its own label included).

    With ``factors`` F > 0 (MeLU, rating head) the prior is a biased matrix factorisation of
    the training split (alternating least squares, F factors): each value's bias is its
    prior and its factor vector is read by MeLU's output layer, so adapting that layer per
    user folds the user in; ``damping`` is then the factorisation's L2 strength and
    ``fold_in`` the ridge strength of a new user's factor and bias in that fold-in, and
    ``fold_in_prior`` what it shrinks them toward: ``isotropic`` (zero, every coordinate
    alike) or ``empirical`` (the training users' mean bias and factor, along their
    covariance: the empirical-Bayes fold-in, ``references.FactorModel.with_fold_in_prior``).
    ``item_bias`` is how the factorisation fits each value's bias: ``fitted`` with the
    factors, or a number d, held at the value's damped mean residual (its rows' labels less
    the mean, summed, over rows + d: Koren's baseline predictor) with only the factors and
    the users' biases fitted around it, so that a value of few rows keeps its own mean's
    share. None: each chosen on the validation split by the fold-in's loss, from
    ``references.MF_REGS`` x ``references.FOLD_IN_PRIORS`` x ``references.MF_ITEM_BIASES`` x
    ``references.MF_FOLD_IN``. The
    ridge solve of both models (``meta.ridge``, ``eval.baseline_ridge``) shrinks the output
    layer's weights on the factors and its bias at ``fold_in`` (the meta model from there,
    learned), its weights on the last hidden layer at the ridge strength. Each model's
    adapted output is then blended with the factorisation's own fold-in: ``blend * adapted +
    (1 - blend) * fold-in`` (the factorisation alone holds less noise; a network trained on
    the training users' query rows trusts itself more than new users bear out). ``blend``
    None: chosen for each model at every validation, the weight with the least squared error
    on the validation query rows moved toward 0.5 by at most one standard error
    (``evaluation.chosen_blend``), in [0, 1]; 1: no blend. ``factors_in_output`` false keeps
    the factors out of the tower: the output layer reads the last hidden layer alone (the
    item's bias still under it) and the factors serve only the fold-in that the adapted
    predictions are blended with, so the network and the factorisation err apart (both
    models alike)."""

    feature: str = ""
    damping: float | None = field(None, min=0.0)
    folds: int = field(5, min=1)
    factors: int = field(0, min=0)
    fold_in: float | None = field(None, min_exclusive=0.0)
    fold_in_prior: Literal["isotropic", "empirical"] | None = None
    item_bias: float | Literal["fitted"] | None = field(None, min=0.0)
    blend: float | None = field(None, min=0.0, max=1.0)
    factors_in_output: bool = True


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Tables, tower and head.

    ``tower: dlrm`` reads ``sparse_features`` (default: every feature of the tables) and
    ``dense_features`` (name -> width); ``tower: melu`` reads ``item_features`` then
    ``user_features``, and with ``context_dim`` > 0 a context vector of that width (CAVIA:
    adapt only it with ``meta.fast_weights: [context]``); with ``item_factors`` MeLU's output
    layer also reads the item embeddings, so adapting it per user is a matrix-factorisation
    fold-in (``MeLUTower``). With ``linear`` (default) either
    tower adds the first-order term to its output: a weight per id (one more column of
    every table row) and, in DLRM, per dense input, as a logistic regression or a bias
    model has. Multi-hot features are mean-pooled. ``prior`` (absent: none) adds a fixed
    per-item prior to the output of every tower of the pipeline (``PriorSection``).
    ``members`` > 1 (a plain model, ``meta.enabled: false``, without a prior) trains that
    many towers of these settings at once, seeded apart, each with its own slice of every
    table row, and outputs the mean of their outputs (``EnsembleTower``): on a small
    click log a deep model's AUC moves by hundredths with its initial weights, and the
    mean of several keeps what they agree on, at ``members`` times the tower's cost.
    ``start_from_linear`` (a plain model with ``linear``) starts training from the
    logistic regression that ``gmeta eval`` reports as a reference: fitted on the training
    rows, its penalty and epochs chosen on the validation rows, its weights copied into
    the rows' linear column, the dense inputs' weights and the output bias, the deep part's
    last layer zeroed (``linear_start``). The model is validated before its first step, so
    on validation it moves away from the linear model only where training improves on it.
    ``dense_scaling`` puts the dense inputs on a unit scale inside the tower, as each
    value minus its mean over the training rows, over their standard deviation (a z-score;
    a constant input is only shifted): ``auto`` (default) scales an input whose training
    values reach beyond +-``DENSE_AUTO_LIMIT`` (a raw count, a price, a time stamp such as
    an hour written 14102100), the signed logarithm ``sign(x) log(1 + |x|)`` of those with
    a long tail (the farthest value more than ``DENSE_TAIL_LIMIT`` standard deviations from
    the mean, and less than half as far in the logarithm: a count, a price), and leaves inputs already on a small scale (a logarithm of
    a count, an age) as they are; ``standard`` standardises every one as it is, ``log``
    every one's logarithm; ``none`` reads them as stored. The means and deviations are fitted when training starts, kept in the
    checkpoint and the export (a server scales as training did), and the logistic
    regression reference reads the inputs scaled the same way (``dense_scaling``).
    """

    tower: Literal["dlrm", "melu"] = "dlrm"
    embedding_dim: int = field(8, min=1)
    tables: Mapping[str, TableSection] = dataclasses.field(default_factory=dict)
    sparse_features: tuple[str, ...] = ()
    dense_features: Mapping[str, int] = dataclasses.field(default_factory=dict)
    item_features: tuple[str, ...] = ()
    user_features: tuple[str, ...] = ()
    hidden_units: tuple[int, ...] = (64, 64)
    context_dim: int = field(0, min=0)
    item_factors: bool = False
    bottom_units: tuple[int, ...] = (64,)
    top_units: tuple[int, ...] = (64, 32)
    linear: bool = True
    head: HeadSection = HeadSection()
    prior: PriorSection | None = None
    seed: int = 0
    members: int = field(1, min=1)
    start_from_linear: bool = False
    dense_scaling: Literal["auto", "standard", "log", "none"] = "auto"

    @property
    def table_dim(self) -> int:
        """Columns of every table row: the embedding, plus the linear weight, once per
        member."""
        return self.members * (self.embedding_dim + (1 if self.linear else 0))


@dataclasses.dataclass(frozen=True)
class MetaSection(MetaConfig):
    """The meta-learning loops: a ``gmeta_tf.meta.MetaConfig`` (which defines the keys;
    MAML++: ``inner_lr_per_step`` with ``learn_inner_lr``, and ``multi_step_loss``), and
    ``enabled: false`` to train a plain CTR model on the same rows instead."""

    enabled: bool = True


@dataclasses.dataclass(frozen=True)
class HybridSection:
    """PERSIA hybrid training (``gmeta_tf.training.hybrid.HybridTrainer``): embedding lookups run
    up to ``staleness`` batches ahead of their updates in a background thread while the
    dense tower trains synchronously; 0 is synchronous training through the same two
    phases (its result equals the plain path's)."""

    staleness: int = field(0, min=0)


SELECT_METRICS = ("auto", "auc", "ndcg", "logloss", "mae")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training loop; ``hybrid`` (absent: the plain synchronous step) trains the plain
    CTR model (``meta.enabled: false``) with bounded-stale embeddings.

    Validation: every ``eval_every`` steps (and at the last step) the models are scored
    on the ``validation_split`` (held-out warm tasks, adapted on their support rows and
    scored on their query rows as cold tasks are; a plain CTR model: every row of it) by
    ``select_metric`` ("auto": AUC of the binary label; nDCG is nDCG@``eval.ndcg_k``).
    Each model's best step so far is checkpointed and kept; ``gmeta eval`` and ``gmeta
    export`` restore it. With ``patience`` > 0 a model that has not improved for that
    many evaluations stops training while the other trains on (each model's stopping
    point is its own); the run ends when no model is left. ``valid_resplits`` (task
    data) scores every validation task under that many splits of its rows: the
    protocol's, then seeded resplits with the same number of query rows, fixed for the
    run; each metric is the mean over them, so the choice rests on more of the
    validation tasks' rows than one split's query rows.
    ``resplit`` draws training tasks' support and query rows anew each epoch.
    ``baseline_learning_rate`` (default ``learning_rate``) is the baseline's own rate;
    ``baseline_table_learning_rate`` (default: each table's own ``learning_rate``) the
    rate of every one of the baseline's tables, so the two models' embedding rows can
    train at rates chosen for each (``gmeta tune`` searches both).
    ``embedding_l2`` adds, in training, that weight times the mean squared norm of the
    embedding rows a batch reads to the model's objective (an id's row is pulled toward
    zero as often as it is read: a rare item's row, trained on a few ratings, stays small);
    ``baseline_embedding_l2`` (default ``embedding_l2``) is the baseline's (``gmeta tune``
    searches both).
    ``embedding_dropout`` drops out, in training, the embedded rows the tower reads at
    that rate (dropout, Srivastava et al. 2014), in both models alike (with
    ``model.linear``, each row's id weight, the first-order term, too); for the meta model
    one draw a step serves the inner and outer loops.
    ``pretrain_steps``: the meta model's first this many steps train its unadapted
    predictions on every row of the step's tasks (the baseline's objective), then
    meta-training starts from those weights (pre-training then meta-training, as in Chen
    et al. 2021, "Meta-Baseline"); validation scores it throughout, and ``patience``
    counts from the end of pre-training.
    ``linear_margin`` (a plain model with ``model.start_from_linear``; 0: off): the linear
    start, validated at step 0, stays the best checkpoint until a later one beats its
    validation metric by more than this many standard errors of their paired difference
    on the validation rows (DeLong's for AUC; of the rows' paired losses for log loss and
    MAE). Validation rows are few on a small log, and the best of many checkpoints is
    biased upward: 1 is the one-standard-error rule (Hastie et al., The Elements of
    Statistical Learning, 7.10), the simpler model kept unless the other is clearly better;
    the shipped click configs use 2, as the best of a run's checkpoints passed one standard
    error by chance too often (``docs/measured.md``).
    """

    steps: int = field(1000, min=1)
    optimizer: Literal["adam", "adagrad", "sgd"] = "adam"
    learning_rate: float = field(0.003, min_exclusive=0.0)
    baseline_learning_rate: float | None = field(None, min_exclusive=0.0)
    baseline_table_learning_rate: float | None = field(None, min_exclusive=0.0)
    embedding_l2: float = field(0.0, min=0.0)
    baseline_embedding_l2: float | None = field(None, min=0.0)
    embedding_dropout: float = field(0.0, min=0.0, max=0.9)
    shuffle_seed: int = 0
    log_every: int = field(50, min=1)
    eval_every: int = field(0, min=0)
    eval_batches: int | None = field(None, min=1)
    validation_split: str = "valid"
    valid_resplits: int = field(1, min=1)
    select_metric: Literal["auto", "auc", "ndcg", "logloss", "mae"] = "auto"
    patience: int = field(0, min=0)
    linear_margin: float = field(0.0, min=0.0)
    resplit: bool = True
    pretrain_steps: int = field(0, min=0)
    checkpoint_every: int = field(0, min=0)
    keep_checkpoints: int = field(3, min=1)
    baseline: bool = True
    hybrid: HybridSection | None = None


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Evaluation (``gmeta eval``): the ``split`` (cold tasks; null: none) and each of
    ``data`` (datasets, or raw files of ``data.source``'s format, e.g. a dev and a test
    file) are scored by it only, each into its own ``<run_dir>/eval/<name>.json``.

    The meta model adapts on each task's support rows for ``adapt_steps`` inner steps
    (default: its k), in validation (``train.validation_split``) as here. The baseline is
    fine-tuned on them through the meta model's own inner-loop code, on the same fast
    weights and adapted embedding rows, for ``baseline_steps`` SGD steps (default: the
    meta model's k) at ``baseline_lr``; then, with a ridge strength ``baseline_ridge``
    (default: ``meta.ridge``) above 0, its output layer is solved in closed form on them
    as the meta model's is (``meta.ridge``), at that fixed strength. ``baseline_backtrack``:
    a fine-tuning step that raises a task's support loss is taken back and that task's
    later steps halved (a backtracking line search, so one hand-set rate never leaves a
    task worse on its own support rows; the meta model's learned steps are kept as
    trained).
    Reference predictors (``gmeta_tf.training.references``) are scored on the same rows;
    ``reference_feature`` is the feature whose mean label they use (default: MeLU's first
    item feature, else the tower's first sparse feature not adapted per task).
    """

    split: str | None = "cold"
    data: tuple[str, ...] = ()
    tasks_per_batch: int = field(64, min=1)
    adapt_steps: int | None = field(None, min=0)
    baseline_steps: int | None = field(None, min=0)
    baseline_lr: float = field(0.1, min_exclusive=0.0)
    baseline_ridge: float | None = field(None, min=0.0)
    baseline_backtrack: bool = True
    ndcg_k: int = field(3, min=1)
    binary_label: str | None = None
    relevance_label: str | None = None
    reference_feature: str | None = None


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """The serving SavedModel (``gmeta export``), under ``dir`` (unless given,
    ``<run_dir>/export``)."""

    dir: str = "runs/default/export"
    adaptation: bool = True


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """A whole pipeline: data -> train -> eval -> export."""

    name: str = "default"
    run_dir: str = "runs/default"
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    meta: MetaSection = MetaSection()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    export: ExportConfig = ExportConfig()

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.run_dir, "checkpoints")

    @property
    def tensorboard_dir(self) -> str:
        return os.path.join(self.run_dir, "tensorboard")

    @property
    def eval_dir(self) -> str:
        """Where ``gmeta eval`` writes its results (``<split or file>.json``) and the eval
        files' converted datasets (``data/``)."""
        return os.path.join(self.run_dir, "eval")

    def to_dict(self) -> dict:
        """Plain dict (tuples as lists), what ``dump_config`` writes and ``from_dict``
        reads back to an equal config."""
        out = _plain(dataclasses.asdict(self))
        for name, table in self.model.tables.items():
            spec = out["model"]["tables"][name]
            for key in TableSection.DERIVED:
                del spec[key]
            spec["optimizer"] = {"name": table.optimizer.name,
                                 **_plain(dataclasses.asdict(table.optimizer))}
        return out


# ---- loading ----------------------------------------------------------------------------

def resolve_pipeline(name_or_path: str | os.PathLike | None) -> Path:
    """A config path: a file path, or the name of a ready pipeline in ``pipelines/``."""
    if name_or_path is None:
        name_or_path = DEFAULT_PIPELINE
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = PIPELINES_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    ready = sorted(p.stem for p in PIPELINES_DIR.glob("*.yaml"))
    raise ConfigError(f"config {str(name_or_path)!r} is neither a file nor a ready pipeline; "
                      f"ready pipelines: {ready}")


#: Settings ``gmeta tune`` chose, in the run directory; applied under ``--set`` overrides.
TUNED_FILE = "tuned.yaml"
#: The section of tuned.yaml saying what the trials ran at (not a config key).
TUNED_AT_KEY = "tuned_at"


def load_config(name_or_path: str | os.PathLike | None = None,
                overrides: Sequence[str] = (), tuned: bool = True) -> PipelineConfig:
    """Loads, overrides and checks a pipeline config.

    Args:
        name_or_path: A YAML file, or a ready pipeline's name (default "default").
        overrides: ``"key.sub=value"`` strings, values parsed as YAML.
        tuned: Apply ``<run_dir>/tuned.yaml`` (settings ``gmeta tune`` chose) when it
            exists: over the file's values, under ``overrides``.

    Returns:
        The checked config; relative paths in it are made absolute against the current
        working directory (run from the project root for the ready pipelines).

    Raises:
        ConfigError: Unreadable YAML, an unknown key, or a value of the wrong type or range.
    """
    path = resolve_pipeline(name_or_path)
    text = None
    try:
        text = path.read_text(encoding="utf-8")
        raw = load_yaml(text)
        if raw is None:
            raise ConfigError(f"config file {path}: empty (no key in it): expected a pipeline "
                              f"config, e.g. a copy of pipelines/default.yaml")
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = "; ".join(str(p) for p in (err.context, err.problem) if p)
        raise ConfigError(f"config file {path}{where}: not valid YAML ({what})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path}: not valid YAML ({err})") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path}: not UTF-8 text ({err})") from err
    except RecursionError as err:
        raise ConfigError(f"config file {path}: nested too deeply to be a pipeline "
                          f"config") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top, got "
                          f"{type(raw).__name__}")
    tuned_from = _apply_tuned(raw, overrides) if tuned else None
    for item in overrides:
        apply_override(raw, item)
    try:
        config = from_dict(raw)
    except ConfigError as err:
        raise ConfigError(_located(str(err), path, text, overrides, tuned_from)) from err
    return _absolute_paths(config, Path.cwd())


def _located(message: str, path: Path, text: str, overrides: Sequence[str],
             tuned: tuple[Path, dict] | None) -> str:
    """``message`` naming where the key it names was set: the config file and its line, a
    ``--set`` override, or the tuned settings (unchanged if it names no key)."""
    found = re.match(r"config key '([^']+)'", message)
    if not found:
        return message
    key = re.sub(r"\[\d+\]", "", found.group(1))  # a list item's key: the list's

    def set_by(k: str) -> str | None:
        return next((item for item in reversed(list(overrides))
                     if _covers(k, item.partition("=")[0].strip())), None)

    # another key the message names as the cause, when a --set gave it its value
    others = [(k, set_by(k)) for k in dict.fromkeys(re.findall(
        r"\b((?:data|model|meta|train|eval|export)\.[a-z_][a-z_0-9.]*[a-z_0-9])", message))
        if k != key]
    message += "".join(f" ({k} as --set {item} gives it)" for k, item in others if item)
    item = set_by(key)
    if item is not None:
        return f"--set {item}: {message}"
    # the tuned file's own settings (its leaves): a section it sets inside is not a key of it
    if tuned is not None and any(_covers(key, k) for k in dotted_keys(tuned[1], leaves=True)):
        return f"tuned settings {tuned[0]}: {message}"
    line = _key_line(text, key)
    return f"config file {path}, line {line}: {message}" if line else message


def dotted_keys(settings: Mapping, prefix: str = "", leaves: bool = False) -> list[str]:
    """Every dotted key of nested ``settings``; ``leaves``: only those holding a value."""
    keys = []
    for k, v in settings.items():
        if isinstance(v, Mapping):
            keys += [] if leaves else [f"{prefix}{k}"]
            keys += dotted_keys(v, f"{prefix}{k}.", leaves)
        else:
            keys.append(f"{prefix}{k}")
    return keys


def _key_line(text: str, key: str) -> int | None:
    """The line (from 1) where a YAML document sets the dotted ``key``, or the deepest part
    of it the document has; None if it sets none of it."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            break
        match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
        if match is None:
            break
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def _apply_tuned(raw: dict, overrides: Sequence[str]) -> tuple[Path, dict] | None:
    """Merges ``<run_dir>/tuned.yaml`` into ``raw``; returns its path and settings (None
    without one)."""
    probe = copy.deepcopy(raw)
    for item in overrides:
        apply_override(probe, item)
    run_dir = probe.get("run_dir") or PipelineConfig.run_dir
    path = Path(str(run_dir)) / TUNED_FILE
    if not path.is_file():
        return
    try:
        settings = load_yaml(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
        raise ConfigError(f"tuned settings {path}: unreadable ({err}); fix or delete it "
                          f"(gmeta tune writes it)") from err
    if not isinstance(settings, dict):
        raise ConfigError(f"tuned settings {path}: expected a mapping, got "
                          f"{type(settings).__name__}")
    at_tune = settings.pop(TUNED_AT_KEY, None)
    _warn_of_edits_since_tuning(path, settings, at_tune, probe, overrides)
    _merge(raw, settings)
    logging.getLogger(__name__).info("using the settings gmeta tune chose: %s", path)
    return path, settings


#: What ``dotted_value`` returns for a key the settings do not hold.
ABSENT = object()


def dotted_value(settings: Any, key: str) -> Any:
    """The value nested ``settings`` hold at the dotted ``key``, or ``ABSENT``."""
    for part in key.split("."):
        if not isinstance(settings, Mapping) or part not in settings:
            return ABSENT
        settings = settings[part]
    return settings


def _covers(key: str, other: str) -> bool:
    """Whether setting the dotted key ``other`` sets ``key``, a key inside it or a section
    holding it."""
    return other == key or key.startswith(other + ".") or other.startswith(key + ".")


def _warn_of_edits_since_tuning(path: Path, settings: Mapping, at_tune: Any, current: Mapping,
                                overrides: Sequence[str]) -> None:
    """Warns of each tuned key the config (with its ``--set`` overrides) now gives another
    value than it gave when ``gmeta tune`` ran (``tuned_at.pipeline``): the tuned value still
    wins over it, which an edit made after tuning does not expect. A key a ``--set`` gives
    is not warned of: the override wins over both."""
    then = at_tune.get("pipeline") if isinstance(at_tune, Mapping) else None
    if not isinstance(then, Mapping):
        return
    overridden = [item.partition("=")[0].strip() for item in overrides]
    changed = []
    for key, old in then.items():
        now, tuned = dotted_value(current, key), dotted_value(settings, key)
        if (now is ABSENT or tuned is ABSENT or now == old
                or any(_covers(key, o) for o in overridden)):
            continue
        changed.append(f"{key}: {old!r} when tuned, {now!r} now, {tuned!r} used")
    if changed:
        logging.getLogger(__name__).warning(
            "%s: the config gives other values than when gmeta tune ran for settings it chose; "
            "the tuned ones are used (tune again, delete the file to train the config's own, "
            "or --set one, which wins over both): %s", path, "; ".join(changed))


def tuned_world_size(run_dir: str | os.PathLike) -> int | None:
    """The world size ``gmeta tune``'s trials ran at, from ``<run_dir>/tuned.yaml``."""
    try:
        settings = load_yaml((Path(run_dir) / TUNED_FILE).read_text(encoding="utf-8"))
        size = settings[TUNED_AT_KEY]["world_size"]
    except (OSError, yaml.YAMLError, UnicodeDecodeError, TypeError, KeyError):
        return None
    return size if isinstance(size, int) else None


def _merge(into: dict, settings: Mapping) -> None:
    for key, value in settings.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def from_dict(raw: Mapping[str, Any]) -> PipelineConfig:
    """Checks a plain dict (as YAML gives it) into a ``PipelineConfig``."""
    config = _build(PipelineConfig, _under_run_dir(raw), "")
    check_consistency(config)
    return config


#: Paths a pipeline keeps under its ``run_dir`` unless it gives them: (section, key, name).
RUN_DIR_PATHS = (("data", "path", "data"), ("export", "dir", "export"))


def _under_run_dir(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """``raw`` with ``data.path`` and ``export.dir``, where it does not give them, under its
    ``run_dir`` (``<run_dir>/data``, ``<run_dir>/export``), so that one ``--set run_dir=...``
    moves a run's dataset, checkpoints and SavedModel together. A value of the wrong type is
    left for ``_build`` to name."""
    run_dir = raw.get("run_dir", PipelineConfig.run_dir) if isinstance(raw, Mapping) else None
    if not isinstance(run_dir, str):
        return raw
    out = dict(raw)
    for section, key, name in RUN_DIR_PATHS:
        given = out.get(section)
        given = {} if given is None else given
        if isinstance(given, Mapping) and key not in given:
            out[section] = {**given, key: os.path.join(run_dir, name)}
    return out


def apply_override(raw: dict, item: str) -> None:
    """Applies one ``key.sub=value`` override to a raw config dict, in place."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {item!r} is not allowed: expected KEY.SUB=VALUE, "
                          f"e.g. train.steps=100")
    try:
        value = load_yaml(text) if text.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({err})") from err
    if isinstance(value, dict) and not text.strip().startswith("{"):
        # A one-line value YAML reads as a block mapping is text with a colon: '::' (a
        # delimiter) would be {':': None}. A mapping is written in flow style, {a: 1}.
        value = text.strip()
    node = raw
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        if node.get(part) is None:  # absent, or null in the YAML (e.g. 'hybrid: null')
            node[part] = {}
        child = node[part]
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: config key "
                              f"'{'.'.join(parts[:i + 1])}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def override_value(value: Any) -> str:
    """``value`` as YAML on one line: the text after ``=`` in an override
    (``apply_override``) or after ``:`` in a config that reads back as ``value``."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...")


def dump_config(config: PipelineConfig, path: str | os.PathLike) -> None:
    """Writes the resolved config as YAML (the run directory keeps a copy)."""
    write_text_atomically(path, yaml.safe_dump(config.to_dict(), sort_keys=False))


# ---- checking ---------------------------------------------------------------------------

def _fail(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"config key '{key}' = {value!r} is not allowed: expected {expected}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _build(cls: type, raw: Any, prefix: str, derived: Mapping[str, Any] | None = None):
    """A dataclass from a mapping, every field checked; ``prefix`` is its key path.
    ``derived``: values of fields the pipeline fills in (the mapping may not give them)."""
    derived = derived or {}
    if raw is None:
        raw = {}
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in derived}
    if not isinstance(raw, Mapping):
        raise _fail(prefix or "<top>", raw, f"a mapping with keys {list(fields)}")
    unknown = [k for k in raw if k not in fields]
    if unknown:
        key = _join(prefix, str(unknown[0]))
        close = difflib.get_close_matches(str(unknown[0]), list(fields), n=1)
        why = (f"'{prefix}' gets it from the pipeline" if unknown[0] in derived
               else f"unknown key (did you mean '{close[0]}'?)" if close else "unknown key")
        raise ConfigError(f"config key '{key}' is not allowed: {why}; "
                          f"'{prefix or '<top>'}' allows {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    for name, spec in fields.items():
        if (name not in raw and spec.default is dataclasses.MISSING
                and spec.default_factory is dataclasses.MISSING):
            raise ConfigError(f"config key '{_join(prefix, name)}' is missing: expected "
                              f"{_describe(hints[name], spec.metadata)}")
    values = dict(derived)
    for name, value in raw.items():
        key = _join(prefix, name)
        values[name] = _convert(hints[name], value, key)
        expected = range_violation(fields[name].metadata, values[name])
        if expected is not None:
            raise _fail(key, values[name], expected)
    try:
        return cls(**values)
    except FieldError as err:  # the type's own check: name the key
        raise _fail(_join(prefix, err.name), err.value, err.expected) from err
    except (ValueError, TypeError) as err:
        raise ConfigError(f"config section '{prefix or '<top>'}' is not allowed: {err}") from err


def _build_data(cls: type, raw: Any, prefix: str) -> "DataConfig":
    """``data``: its ``split`` keys replace the source's protocol; the split's seed is
    ``data.seed`` unless given."""
    if not isinstance(raw, Mapping) or raw.get("split") is None:
        data = _build(DataConfig, raw, prefix)
        if data.source == "dataset":  # whatever the dataset was split with
            return data
        return dataclasses.replace(data, split=dataclasses.replace(
            source_split(data.source), seed=data.seed))
    raw = dict(raw)
    given = raw.pop("split")
    data = _build(DataConfig, raw, prefix)
    key = _join(prefix, "split")
    if not isinstance(given, Mapping):
        raise _fail(key, given, f"a mapping with keys "
                    f"{[f.name for f in dataclasses.fields(SplitConfig)]}")
    base = dataclasses.asdict(dataclasses.replace(source_split(data.source), seed=data.seed))
    return dataclasses.replace(data, split=_build(SplitConfig, {**base, **given}, key))


def _build_model(cls: type, raw: Any, prefix: str) -> "ModelConfig":
    """``model``: each table is a ``TableSection`` named by its key, of the model's
    ``table_dim``, seeded by ``model.seed``."""
    if not isinstance(raw, Mapping):
        return _build(ModelConfig, raw, prefix)
    raw = dict(raw)
    tables = raw.pop("tables", None)
    model = _build(ModelConfig, raw, prefix)
    key = _join(prefix, "tables")
    if tables is None:
        return model
    if not isinstance(tables, Mapping):
        raise _fail(key, tables, "a mapping of name -> TableSection")
    built = {}
    for name, spec in tables.items():
        name = str(name)
        built[name] = _build(TableSection, spec, _join(key, name),
                             derived={"name": name, "dim": model.table_dim,
                                      "seed": model.seed})
    return dataclasses.replace(model, tables=built)


_BUILDERS = {DataConfig: _build_data, ModelConfig: _build_model}


def _convert(hint: Any, value: Any, key: str):
    """Checks (and normalizes) one value against a type hint."""
    if hint is Any:  # checked by its own type later (data.mapping: CsvMapping)
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, key)
        for hint_of in inner:  # e.g. a number or a named choice: the first that fits
            if type_violation(hint_of, value) is None:
                return _convert(hint_of, value, key)
        raise _fail(key, value, " or ".join(type_name(a) if typing.get_origin(a) is Literal
                                            else _describe(a, {}) for a in inner))
    if origin is Literal:
        if value not in args:
            raise _fail(key, value, f"one of {list(args)}")
        return value
    if dataclasses.is_dataclass(hint):
        return _BUILDERS.get(hint, _build)(hint, value, key)
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise _fail(key, value, f"a list of {type_name(args[0])}")
        return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(value, Mapping):
            raise _fail(key, value, f"a mapping of name -> {type_name(args[1])}")
        return {str(k): _convert(args[1], v, _join(key, str(k))) for k, v in value.items()}
    return _scalar(hint, value, key)


def _scalar(hint: Any, value: Any, key: str):
    if hint not in (bool, int, float, str):
        raise TypeError(f"config field '{key}' has an unsupported type {hint!r}")
    expected = type_violation(hint, value)  # the check the config types run themselves
    if expected is not None:  # (a float must be finite: NaN passes every range check)
        raise _fail(key, value, expected)
    if hint is int and not _INT64_MIN <= value <= _INT64_MAX:  # TF and NumPy: int64 at most
        raise _fail(key, value, "an integer that fits in int64")
    return float(value) if hint is float else value


def _describe(hint: Any, metadata: Mapping[str, Any]) -> str:
    """What a field allows, in words (for a missing required key)."""
    if hint is int:
        low = f" >= {metadata['min']}" if "min" in metadata else ""
        return f"an integer{low}"
    return {float: "a number", str: "a non-empty string", bool: "true or false"}.get(
        hint, type_name(hint))


def baseline_embedding_l2(config: PipelineConfig) -> float:
    """The baseline's embedding penalty: ``train.baseline_embedding_l2``, default
    ``train.embedding_l2``."""
    if config.train.baseline_embedding_l2 is not None:
        return config.train.baseline_embedding_l2
    return config.train.embedding_l2


def configured_blend(model: ModelConfig) -> float | None:
    """The blend with the label prior's fold-in that the config fixes
    (``model.prior.blend``), or None: no prior, or a blend left to be chosen on
    validation."""
    return None if model.prior is None else model.prior.blend


def ridge_applies(model: ModelConfig) -> bool:
    """Whether the output layer can be solved in closed form (``meta.ridge``): a MeLU
    tower with a rating head."""
    return model.tower == "melu" and model.head.kind == "rating"


def check_consistency(config: PipelineConfig) -> None:
    """Checks that depend on several keys (tables, tower features, meta options).

    Raises:
        ConfigError: e.g. a tower feature that no table embeds.
    """
    model = config.model
    if not model.tables:
        raise _fail("model.tables", {}, "at least one table: name -> {features: [...]}")
    embedded: dict[str, str] = {}
    for table, spec in model.tables.items():
        if not spec.features:
            raise _fail(f"model.tables.{table}.features", spec.features,
                        "a non-empty list of feature names")
        for f in spec.features:
            if f in embedded:
                raise _fail(f"model.tables.{table}.features", list(spec.features),
                            f"each feature in one table only ('{f}' is also in "
                            f"'{embedded[f]}')")
            embedded[f] = table
    for key in _tower_feature_keys(model):
        for f in getattr(model, key):
            if f not in embedded:
                raise _fail(f"model.{key}", list(getattr(model, key)),
                            f"features embedded by a table ({sorted(embedded)})")
    if model.tower == "melu" and not (model.item_features or model.user_features):
        raise _fail("model.item_features", [], "item_features and/or user_features for "
                    "tower 'melu'")
    if model.item_factors and not (model.tower == "melu" and model.item_features):
        raise _fail("model.item_factors", model.item_factors,
                    "false unless tower 'melu' with item_features (the output layer reads "
                    "MeLU's item embeddings)")
    if model.tower != "melu" and model.context_dim:
        raise _fail("model.context_dim", model.context_dim,
                    f"0 for tower '{model.tower}' (the context vector is MeLU's)")
    if model.tower == "melu" and model.dense_features:
        raise _fail("model.dense_features", dict(model.dense_features),
                    "no dense features for tower 'melu' (use tower 'dlrm')")
    for key, value in (("meta.ridge", config.meta.ridge),
                       ("eval.baseline_ridge", config.eval.baseline_ridge)):
        if value and not ridge_applies(model):
            raise _fail(key, value, f"0 for tower '{model.tower}' with a '{model.head.kind}' "
                        f"head (ridge adaptation solves MeLU's output layer for a rating head's "
                        f"squared error)")
    # Options of meta-training: (key, why a rating head or None for any head, why
    # meta-learning).
    for key, of_ratings, of_tasks in (
            ("within_task_loss", "a task's centred squared error is of ratings",
             "a plain model's row batches hold no whole tasks"),
            ("label_shift", "a task's ratings are shifted",
             "it shifts a meta task's ratings"),
            ("grad_dropout", None,
             "it drops inner-loop gradients; a plain model has no inner loop"),
            ("task_interpolation", None,
             "it interpolates meta tasks; a plain model's row batches hold no whole tasks")):
        value = getattr(config.meta, key)
        if value and of_ratings and model.head.kind != "rating":
            raise _fail(f"meta.{key}", value,
                        f"0 with a '{model.head.kind}' head ({of_ratings})")
        if value and not config.meta.enabled:
            raise _fail(f"meta.{key}", value, f"0 with meta.enabled: false ({of_tasks})")
    if model.members > 1 and config.meta.enabled:
        raise _fail("model.members", model.members, "1 with meta.enabled: true (an ensemble "
                    "of towers trains as a plain model)")
    if model.members > 1 and model.prior is not None:
        raise _fail("model.members", model.members, "1 with a model.prior (the members "
                    "would share one prior's scale)")
    tower_sparse = tower_sparse_features(model)
    if model.start_from_linear:
        why = None
        if config.meta.enabled:
            why = "with meta.enabled: true (a meta model starts from its own initial weights)"
        elif not model.linear:
            why = "without model.linear (the linear model's weights go in the linear term)"
        elif model.members > 1:
            why = "with model.members > 1 (the members start from their own weights)"
        elif model.prior is not None:
            why = "with a model.prior (the linear model has no prior)"
        else:
            admitting = [t for t, spec in model.tables.items() if spec.admit_after > 1
                         and set(spec.features) & set(tower_sparse)]
            if admitting:
                why = (f"with tables that admit ids late ({admitting}: admit_after > 1; every "
                       f"id of the training rows needs a row for its weight)")
        if why is not None:
            raise _fail("model.start_from_linear", True, f"false {why}")
    if config.train.linear_margin > 0 and not (model.start_from_linear
                                               and not config.meta.enabled):
        raise _fail("train.linear_margin", config.train.linear_margin,
                    "0 without model.start_from_linear: true (the margin is over the linear "
                    "start's validation)")
    if model.prior is not None and model.prior.feature not in tower_sparse:
        raise _fail("model.prior.feature", model.prior.feature,
                    f"a sparse feature of the tower ({list(tower_sparse)})")
    if (model.prior is not None and model.prior.factors
            and not (model.tower == "melu" and model.head.kind == "rating")):
        raise _fail("model.prior.factors", model.prior.factors,
                    f"0 for tower '{model.tower}' with a '{model.head.kind}' head (the "
                    f"factorisation is of ratings, read by MeLU's output layer)")
    if model.prior is not None and not model.prior.factors_in_output and not model.prior.factors:
        raise _fail("model.prior.factors_in_output", model.prior.factors_in_output,
                    "true (the default) when model.prior.factors is 0: "
                    "factors_in_output: false keeps the factors out of the output layer, and "
                    "there are none")
    if model.prior is not None and model.prior.blend is not None and not model.prior.factors:
        raise _fail("model.prior.blend", model.prior.blend,
                    "None without model.prior.factors (the blend is with the factorisation's "
                    "fold-in)")
    if (model.prior is not None and model.prior.item_bias is not None
            and not model.prior.factors):
        raise _fail("model.prior.item_bias", model.prior.item_bias,
                    "None without model.prior.factors (there is no factorisation)")
    if (model.prior is not None and model.prior.fold_in_prior is not None
            and not model.prior.factors):
        raise _fail("model.prior.fold_in_prior", model.prior.fold_in_prior,
                    "None without model.prior.factors (there is no fold-in)")
    for f in config.meta.adapt_embeddings:
        if f not in tower_sparse:
            raise _fail("meta.adapt_embeddings", list(config.meta.adapt_embeddings),
                        f"sparse features of the tower ({list(tower_sparse)})")
    if config.train.pretrain_steps and not config.meta.enabled:
        raise _fail("train.pretrain_steps", config.train.pretrain_steps,
                    "0 while meta.enabled is false (pre-training is the meta model's first "
                    "steps on the plain objective; a plain CTR model trains on it throughout)")
    if config.train.hybrid is not None and config.meta.enabled:
        raise _fail("train.hybrid", _plain(dataclasses.asdict(config.train.hybrid)),
                    "no hybrid section while meta.enabled is true: hybrid training supports "
                    "the plain CTR model only (set meta.enabled: false, or remove train.hybrid)")
    if config.train.validation_split == config.eval.split:
        raise _fail("train.validation_split", config.train.validation_split,
                    f"a split other than eval.split ('{config.eval.split}'): the evaluation "
                    f"split is scored by gmeta eval only, never used to choose anything")
    _check_data_source(config.data)


def _check_data_source(data: DataConfig) -> None:
    if data.source in ("movielens", "criteo", "csv") and not data.raw:
        raise _fail("data.raw", data.raw, f"the raw input path for data.source '{data.source}'")
    if data.source == "csv":
        if data.mapping is None:
            raise _fail("data.mapping", None, "the column mapping of data.source 'csv': a "
                        "mapping (task, label, sparse, ...) or the path of a YAML file of it")
        if not isinstance(data.mapping, (str, Mapping)) or not data.mapping:
            raise _fail("data.mapping", data.mapping, "a mapping (task, label, sparse, ...) or "
                        "the path of a YAML mapping file")
        if isinstance(data.mapping, Mapping):  # checked here, so gmeta config says so too
            from gmeta_tf.data.converters.csv_mapping import CsvMapping
            from gmeta_tf.data.errors import DataError

            try:
                CsvMapping.from_dict(dict(data.mapping))
            except DataError as err:
                named = re.search(r"mapping keys? \[?'([^']+)'", str(err))
                key = "data.mapping" + (f".{named.group(1)}" if named else "")
                raise ConfigError(f"config key '{key}' is not allowed: {err}") from err
    elif data.mapping is not None:
        raise _fail("data.mapping", data.mapping, f"no mapping for data.source "
                    f"'{data.source}' (a mapping goes with data.source 'csv')")


def _tower_feature_keys(model: ModelConfig) -> tuple[str, ...]:
    return ("sparse_features",) if model.tower == "dlrm" else ("item_features",
                                                              "user_features")


def tower_sparse_features(model: ModelConfig) -> tuple[str, ...]:
    """The embedded features the tower reads, in order."""
    if model.tower == "melu":
        return tuple(model.item_features) + tuple(model.user_features)
    if model.sparse_features:
        return tuple(model.sparse_features)
    return tuple(f for spec in model.tables.values() for f in spec.features)


# ---- paths ------------------------------------------------------------------------------

def _absolute(path: str | None, root: Path) -> str | None:
    if path is None or "://" in path or os.path.isabs(path):
        return path
    return str((root / path).resolve())


def _absolute_mapping(mapping: Any, root: Path) -> Any:
    """A mapping file's path, or the paths of an inline mapping's side files, made absolute."""
    if isinstance(mapping, str):
        return _absolute(mapping, root)
    if isinstance(mapping, Mapping) and isinstance(mapping.get("join"), list):
        joins = [{**j, "path": _absolute(j["path"], root)}
                 if isinstance(j, Mapping) and isinstance(j.get("path"), str) else j
                 for j in mapping["join"]]
        return {**mapping, "join": joins}
    return mapping


def _absolute_paths(config: PipelineConfig, root: Path) -> PipelineConfig:
    data = dataclasses.replace(config.data, path=_absolute(config.data.path, root),
                               raw=_absolute(config.data.raw, root),
                               mapping=_absolute_mapping(config.data.mapping, root))
    export = dataclasses.replace(config.export, dir=_absolute(config.export.dir, root))
    evaluation = dataclasses.replace(config.eval, data=tuple(_absolute(p, root)
                                                            for p in config.eval.data))
    return dataclasses.replace(config, run_dir=_absolute(config.run_dir, root), data=data,
                               export=export, eval=evaluation)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
