"""Exports a trained model as a SavedModel that stock TensorFlow (and TF Serving) runs.

The hash tables become ``StaticEmbedding`` variables (every rank's shard: the checkpoint
is restored in one process, which reads all shard files); the tower's weights are saved
as they are and its math, the heads and the meta model's inner loop are traced into the
graph. A label prior (``model.prior``) is saved as its variables (sorted ids, values and,
with factors, the factor rows) and read with the same stock ops. Nothing in the SavedModel
needs gmeta-tf or its op library.

Signatures:

* ``serving_default``: the raw feature columns of a batch of rows -> ``{"scores": [B]}``.
  Sparse features are int64 ``[B]``, multi-hot ones int64 ``[B, W]`` padded with -1,
  dense ones float32 ``[B]`` (or ``[B, D]``). Unknown ids read the default row.
* ``adapt`` (meta models, ``export.adaptation``): one new task's labelled support rows
  (``support_<feature>``, ``support_<label>``) and its query rows (``query_<feature>``)
  -> ``{"scores": [Q]}`` after the meta model's inner loop on the support rows.

The layout is TF Serving's: ``<export.dir>/<version>/saved_model.pb`` (the version is the
checkpoint's step, or above a higher version already there: ``export_version``), and
``assets.extra/gmeta_export.json`` describes the inputs and the checkpoint it was made
from. A version is written under a
hidden name and renamed into place whole, so a server watching ``<export.dir>`` never loads
a part of one, and an export it replaces is removed only after the rename.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Mapping, Sequence

import tensorflow as tf

from gmeta_tf import data as meta_io
from gmeta_tf.atomic_file import (fsync_tree, release_staging, replace_dir, staging_dir,
                                  tidy_staging)
from gmeta_tf.config import ConfigError, PipelineConfig
from gmeta_tf.embedding import ShardedHashEmbedding
from gmeta_tf.graph_function import graph_function
from gmeta_tf.meta import MetaModel, TaskAdapter, adapted_outputs, single_task_batch
from gmeta_tf.models import embedding_inputs
from gmeta_tf.serving.static_embedding import FrozenTable, StaticEmbedding

log = logging.getLogger(__name__)
SERVING_SIGNATURE = "serving_default"
ADAPT_SIGNATURE = "adapt"
INFO_FILE = "gmeta_export.json"


def frozen_tables(embedding: ShardedHashEmbedding) -> dict[str, FrozenTable]:
    """The admitted rows of every table this process holds (all of them at size 1)."""
    shards = embedding.export_shards()
    out = {}
    for table in embedding.table_configs:
        snap = shards[table.name]
        keep = snap["admitted"].astype(bool)
        out[table.name] = FrozenTable(snap["ids"][keep], snap["values"][keep],
                                      table.default_value)
    return out


def feature_specs(model: tf.keras.Model, schema: meta_io.Schema) -> dict[str, tf.TensorSpec]:
    """Input specs of the tower's features: ``[B]``, or ``[B, W]`` for multi-hot/wide dense."""
    specs = {}
    for name in model.tower.feature_names:
        feature = schema[name]
        shape = [None, feature.dim] if feature.is_slotted else [None]
        specs[name] = tf.TensorSpec(shape, tf.as_dtype(feature.numpy_dtype), name=name)
    return specs


class ServingModule(tf.Module):
    """What the SavedModel holds: the frozen tables, the tower's weights, the signatures.

    Args:
        model: The trained ``MetaModel`` or ``CTRModel`` (restored in one process).
        specs: Input specs of the tower's features (see ``feature_specs``).
        adaptation: Also trace the ``adapt`` signature (meta models only).
        adapt_steps: The inner steps it adapts a task for (None: the model's k), as
            ``gmeta eval`` adapts (``eval.adapt_steps``).
        label_range: The range of a valid support label (``_label_range``; None: any
            finite label).
    """

    def __init__(self, model: tf.keras.Model, specs: Mapping[str, tf.TensorSpec],
                 adaptation: bool, adapt_steps: int | None = None,
                 label_range: tuple[float, float] | None = None):
        super().__init__(name="gmeta_serving")
        self.embedding = StaticEmbedding(frozen_tables(model.embedding),
                                         model.embedding.feature_configs)
        self.dense_weights = list(model.tower.params().values())
        self.dense_scaling = model.tower.dense_scaling_variables()  # the inputs' scaling
        self.prior = model.tower.prior  # its ids and values are variables the graphs read
        self.prior_blend = model.tower.prior_blend  # the adapted scores' blend (or None)
        tower, head, embedding = model.tower, model.head, self.embedding

        def serve(features):
            _check_rows("serving_default", features)
            emb = embedding(embedding_inputs(features, tower.sparse_features), training=False)
            inputs = {**emb, **tower.raw_inputs(features)}
            return {"scores": head.predict(tower(inputs))}

        self.serve = graph_function(serve, input_signature=[dict(specs)])
        self.adapt = None
        if adaptation and isinstance(model, MetaModel):
            self.inner_rates = list(model.inner_lr_variables.values())
            self.ridge = model.ridge_variables
            self.adapt = graph_function(
                self._adapt_fn(model, adapt_steps, label_range), input_signature=[
                    _role_specs("support", specs, head.label), _role_specs("query", specs)])

    def _adapt_fn(self, model: MetaModel, steps: int | None,
                  label_range: tuple[float, float] | None):
        adapter: TaskAdapter = model.adapter_for(steps)
        rates = model.inner_learning_rates()
        embedding, label = self.embedding, model.head.label

        def adapt(support, query):
            _check_rows("adapt", support)
            _check_rows("adapt", query)
            _check_support_labels(support[f"support_{label}"], f"support_{label}",
                                  label_range)
            batch = single_task_batch(_strip("support_", support), _strip("query_", query), label)
            outputs = adapted_outputs(embedding, adapter, batch, rates, model.rates_per_step)
            return {"scores": tf.squeeze(model.head.predict(outputs), 0)}

        return adapt

    def signatures(self) -> dict:
        out = {SERVING_SIGNATURE: self.serve.get_concrete_function()}
        if self.adapt is not None:
            out[ADAPT_SIGNATURE] = self.adapt.get_concrete_function()
        return out


def _role_specs(role: str, specs: Mapping[str, tf.TensorSpec],
                label: str | None = None) -> dict[str, tf.TensorSpec]:
    out = {f"{role}_{n}": tf.TensorSpec(s.shape, s.dtype, name=f"{role}_{n}")
           for n, s in specs.items()}
    if label is not None:
        out[f"{role}_{label}"] = tf.TensorSpec([None], tf.float32, name=f"{role}_{label}")
    return out


def _check_rows(signature: str, inputs: Mapping[str, tf.Tensor]) -> None:
    """Every input of one role (the query's features; the support's features and label)
    has one row per example: a request whose inputs differ in length fails naming them,
    instead of a length-1 input being broadcast over the others or an error naming a
    graph node."""
    names = sorted(inputs)
    first = names[0]
    for name in names[1:]:
        tf.debugging.assert_equal(
            tf.shape(inputs[name])[0], tf.shape(inputs[first])[0],
            message=f"signature {signature}: input {name} has another number of rows than "
                    f"{first} (every row needs a value of each input)")


def _label_range(schema: meta_io.Schema, head, labels_seen: Mapping[str, Sequence[float]]
                 ) -> tuple[tuple[float, float], str] | tuple[None, None]:
    """The range a valid label of the head lies in, and what set it: the dataset's
    declared range (its conversion's ``label_range``, 0/1 for a thresholded label), else
    [0, 1] for a binary head, else the smallest and largest label the dataset holds (its
    manifest's ``labels_seen``; a dataset converted before it was recorded has none)."""
    feature = next((f for f in schema.labels if f.name == head.label), None)
    if feature is not None and feature.value_range is not None:
        return feature.value_range, "the dataset's label_range"
    if head.kind == "binary":
        return (0.0, 1.0), "the binary head"
    if head.label in labels_seen:
        low, high = labels_seen[head.label]
        return (float(low), float(high)), "the smallest and largest label of the dataset"
    return None, None


def _check_support_labels(labels: tf.Tensor, name: str,
                          valid: tuple[float, float] | None) -> None:
    """A support label that is NaN or infinite, or outside the range of the labels the
    model was trained on, fails the request naming the input, instead of being fitted into
    NaN or meaningless adapted scores that are served without a word."""
    finite = tf.math.is_finite(labels)
    tf.debugging.Assert(tf.reduce_all(finite), [
        f"signature adapt: input {name} holds a NaN or infinite label (expected a finite "
        f"label on every support row); rows of such labels:",
        tf.reduce_sum(tf.cast(~finite, tf.int32))])
    if valid is not None:
        lo, hi = valid
        tf.debugging.Assert(tf.reduce_all((labels >= lo) & (labels <= hi)), [
            f"signature adapt: input {name} holds a label outside [{lo:g}, {hi:g}] (expected "
            f"labels in the range of the training data's); its smallest and largest labels:",
            tf.reduce_min(labels), tf.reduce_max(labels)])


def _strip(prefix: str, features: Mapping[str, tf.Tensor]) -> dict:
    return {k[len(prefix):]: v for k, v in features.items()}


def _describe(input_signature) -> dict:
    specs = tf.nest.flatten(input_signature)
    return {s.name: [s.dtype.name, s.shape.as_list()] for s in sorted(specs, key=lambda s: s.name)}


def export_saved_model(model: tf.keras.Model, schema: meta_io.Schema, path: str | os.PathLike,
                       adaptation: bool = True, adapt_steps: int | None = None,
                       made_from: dict | None = None,
                       labels_seen: Mapping[str, Sequence[float]] | None = None) -> dict:
    """Writes the SavedModel of a trained model (restored in this one process).

    Args:
        model: A ``MetaModel`` or ``CTRModel`` whose tables hold every id (size 1).
        schema: The dataset schema (input dtypes and widths).
        path: The SavedModel directory.
        adaptation: Add the ``adapt`` signature (meta models).
        adapt_steps: The steps ``adapt`` takes (None: the model's k; ``eval.adapt_steps``).
        made_from: The checkpoint exported (its step and digest), recorded when given.
        labels_seen: Each label's smallest and largest value in the dataset (its
            manifest's), the adapt signature's valid range where the schema declares none.

    Returns:
        What ``assets.extra/gmeta_export.json`` records: signatures, inputs, table sizes,
        the checkpoint's step.
    """
    specs = feature_specs(model, schema)
    path = Path(path)
    tidy_staging(path, "an export")  # what a killed export left, its set-aside put back
    if os.path.lexists(path):  # a dangling link too: refused before the work
        _check_replaceable(path)  # before the work, and again before the swap
    label_range, range_from = _label_range(schema, model.head, labels_seen or {})
    module = ServingModule(model, specs, adaptation, adapt_steps, label_range)
    signatures = module.signatures()
    # TF Serving loads any numeric directory it finds: the model is written under a hidden
    # name and appears whole; an export already at ``path`` is set aside and removed only
    # once the new one is in its place (``atomic_file.replace_dir``)
    staging = Path(staging_dir(path))
    try:
        tf.saved_model.save(module, str(staging), signatures=signatures)
        info = _write_info(model, module, signatures, staging, path, made_from,
                           label_range, range_from)
        fsync_tree(staging)  # durable before an export it replaces is let go
        replace_dir(staging, path, lambda old: _check_replaceable(Path(old)))
    finally:
        release_staging(staging)  # given up: removed; moved into place: its lock let go
    log.info("exported %s with signatures %s", path, sorted(signatures))
    return info


def _write_info(model, module, signatures, staging: Path, path: Path,
                made_from: dict | None, label_range: tuple[float, float] | None,
                range_from: str | None) -> dict:
    info = {
        "path": str(path),
        **({} if made_from is None else {"made_from": made_from}),
        "signatures": {name: {"inputs": _describe(fn.structured_input_signature),
                              "outputs": {"scores": ["float32", [None]]}}
                       for name, fn in signatures.items()},
        "table_rows": {t: int(v.shape[0]) for t, v in module.embedding.ids.items()},
        "label": model.head.label,
        **({} if label_range is None or ADAPT_SIGNATURE not in signatures
           else {"support_label_range": list(label_range),
                 "support_label_range_from": range_from}),
    }
    extra = staging / "assets.extra"
    extra.mkdir(parents=True, exist_ok=True)
    (extra / INFO_FILE).write_text(json.dumps(info, indent=1))
    return info


def _check_replaceable(path: Path) -> None:
    """An export replaces an earlier export (a SavedModel directory) or an empty directory,
    nothing else: not the export root holding every version TF Serving serves, not a
    user's files."""
    expected = ("a new path, an empty directory or an earlier SavedModel (saved_model.pb); "
                "an export replaces an export, nothing else")
    if not path.is_dir() or path.is_symlink():
        raise ConfigError(f"export path {path} is not a directory: {expected}")
    entries = sorted(p.name for p in path.iterdir())
    if entries and "saved_model.pb" not in entries:
        versions = [e for e in entries if e.isdigit()]
        what = (f"the version directories {', '.join(versions[:3])}"
                f"{' and more' if len(versions) > 3 else ''} (an export root: give its "
                f"new version, e.g. {path / str(int(max(versions, key=int)) + 1)})"
                if versions else ", ".join(repr(e) for e in entries[:3]))
        raise ConfigError(f"export path {path} holds no SavedModel but {what}; nothing "
                          f"there is deleted: {expected}")


def export_pipeline(config: PipelineConfig, checkpoint_path: str | None = None,
                    out: str | None = None) -> dict:
    """``gmeta export``: restores a run's checkpoint and writes ``<export.dir>/<step>``."""
    from gmeta_tf.run_dir_lock import writable_dir
    from gmeta_tf.training.cold_start import restore_models

    # checked before the model is restored: a directory it cannot write fails at once
    if out:
        writable_dir(Path(out).parent, "gmeta export --out",
                     "gmeta export writes the SavedModel there", "--out DIR")
    else:
        writable_dir(config.export.dir, "config key 'export.dir'",
                     "gmeta export writes the SavedModel there", "--set export.dir=...")
    models, manifest = restore_models(config, checkpoint_path)
    made_from = {"step": int(manifest["step"]), "checkpoint": _checkpoint_digest(manifest)}
    path = Path(out) if out else Path(config.export.dir, str(export_version(
        Path(config.export.dir), made_from)))
    dataset = meta_io.Manifest.load(config.data.path)
    return export_saved_model(models.model, dataset.schema, path, config.export.adaptation,
                              config.eval.adapt_steps,  # adapts as gmeta eval scored it
                              made_from=made_from,
                              labels_seen=dataset.split.get("labels_seen", {}))


def _checkpoint_digest(manifest: dict) -> str:
    """Which checkpoint an export was made from: a digest of its files' checksums."""
    text = json.dumps(manifest["files"], sort_keys=True).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def export_version(root: Path, made_from: dict) -> int:
    """The version an export of a checkpoint (``made_from``: its step and digest) takes
    under ``root``: the step, unless ``root`` holds a higher version made from another
    checkpoint (an earlier run's export, say, before a ``--fresh`` run): TF Serving serves
    the highest version it finds, so a new export is then the next one above it, not left
    below an older model. The highest version made from this very checkpoint is replaced
    in place."""
    step = made_from["step"]
    versions = [int(e) for e in (os.listdir(root) if root.is_dir() else []) if e.isdigit()]
    highest = max(versions, default=None)
    if highest is None or highest <= step:
        return step
    try:
        recorded = json.loads((root / str(highest) / "assets.extra" / INFO_FILE).read_text())
    except (OSError, ValueError):
        recorded = {}
    if recorded.get("made_from") == made_from:
        return highest
    log.warning("%s holds version %d, above this export's step %d, made from another "
                "checkpoint: TF Serving serves the highest version, so this export is "
                "version %d (its assets.extra/%s records the step it was made from)", root,
                highest, step, highest + 1, INFO_FILE)
    return highest + 1
