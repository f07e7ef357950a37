"""``make demo``: the main job on the embedded default, stage by stage, then a summary.

Runs the very commands a user would (printed as they start)::

    gmeta data prepare --config default
    gmeta train --np 2 --config default --fresh
    gmeta eval --config default
    gmeta export --config default

then scores a cold user with the exported SavedModel in a fresh process that imports only
TensorFlow (as TF Serving would), and prints one table of what each stage did and the
cold-start comparison of the meta model with the baseline.

Usage: ``python -m gmeta_tf.demo [--config NAME|PATH] [--np 2] [--set KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from gmeta_tf.config import PipelineConfig, load_config, tower_sparse_features

_SERVE_CHECK = r"""
import json, sys, time
import numpy as np, pyarrow.parquet as pq, tensorflow as tf
model_dir, data_dir, features, label = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
model = tf.saved_model.load(model_dir)
manifest = json.load(open(f"{data_dir}/manifest.json"))
cold = [f["path"] for f in manifest["files"] if f["split"] == "cold"][0]
table = {k: np.asarray(v) for k, v in pq.read_table(f"{data_dir}/{cold}").to_pydict().items()}
first = table["task_id"] == table["task_id"][0]
support = {k: v[first & (table["is_query"] == 0)] for k, v in table.items()}
query = {k: v[first & (table["is_query"] == 1)] for k, v in table.items()}
def columns(rows):
    out = {}
    for name, width in features.items():
        cols = [f"{name}__{i}" for i in range(width)] if width else [name]
        out[name] = tf.constant(np.stack([rows[c] for c in cols], 1) if width else rows[name])
    return out
start = time.perf_counter()
scores = model.signatures["serving_default"](**columns(query))["scores"].numpy()
served_ms = 1000 * (time.perf_counter() - start)
result = {"rows": len(query["task_id"]), "scores": scores.round(4).tolist(), "ms": round(served_ms, 1)}
if "adapt" in model.signatures:
    args = {f"support_{k}": v for k, v in columns(support).items()}
    args[f"support_{label}"] = tf.constant(support[label], tf.float32)
    args.update({f"query_{k}": v for k, v in columns(query).items()})
    result["adapted_scores"] = model.signatures["adapt"](**args)["scores"].numpy().round(4).tolist()
result["gmeta_imported"] = any(m.split(".")[0] == "gmeta_tf" for m in sys.modules)
print(json.dumps(result))
"""


def _gmeta(*args: str) -> list[str]:
    return [sys.executable, "-m", "gmeta_tf.cli", *args]


def _run(title: str, command: list[str]) -> float:
    """Runs one stage, streaming its output; returns its seconds."""
    shown = " ".join("gmeta" if c == "gmeta_tf.cli" else c for c in command
                     if c not in (sys.executable, "-m"))
    print(f"\n==> {title}: {shown}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def _serve_check(config: PipelineConfig, export_dir: Path) -> tuple[float, dict]:
    from gmeta_tf import data as meta_io

    schema = meta_io.Manifest.load(config.data.path).schema
    names = [*tower_sparse_features(config.model), *config.model.dense_features]
    widths = {n: (schema[n].dim if schema[n].is_slotted else 0) for n in names}
    command = [sys.executable, "-c", _SERVE_CHECK, str(export_dir), config.data.path,
               json.dumps(widths), config.model.head.label]
    print(f"\n==> serve: load {export_dir} in a fresh process (TensorFlow only), score a cold "
          f"user", flush=True)
    start = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, json.loads(out.stdout.strip().splitlines()[-1])


def summary_table(config: PipelineConfig, np_: int, seconds: dict[str, float],
                  served: dict) -> str:
    """The demo's closing summary: one line per stage, then the cold-start comparison."""
    from gmeta_tf.training.cold_start import TABLE_COLUMNS
    from gmeta_tf.training.evaluation import format_table
    from gmeta_tf.training.trainer import SUMMARY_FILE

    run = Path(config.run_dir)
    train = json.loads((run / SUMMARY_FILE).read_text())
    evaluation = json.loads((Path(config.eval_dir) / f"{config.eval.split}.json").read_text())
    data = json.loads((run / "data_summary.json").read_text())
    export = json.loads((run / "export_info.json").read_text())
    splits = data["splits"]
    seconds = {k: round(v, 1) for k, v in seconds.items()}
    stages = [
        {"stage": "data", "seconds": seconds["data"], "result":
         f"{sum(s['tasks'] for s in splits.values()):,} tasks "
         f"({splits['warm']['tasks']:,} warm / {splits.get('valid', {}).get('tasks', 0):,} "
         f"validation / {splits['cold']['tasks']:,} cold), "
         f"{sum(s['rows'] for s in splits.values()):,} rows"},
        {"stage": "train", "seconds": seconds["train"], "result":
         f"{np_} ranks, {train['steps']} steps"
         f"{' (early stop)' if train.get('stopped_early_at') else ''}, best on validation: "
         + ", ".join(f"{n} step {b['step']}" for n, b in sorted(train.get("best", {}).items()))
         + f", {train['samples_per_sec']:,.0f} samples/s, "
         f"loss {train['final_loss']:.4f}, all-to-all {train['alltoall_bytes_per_step'] / 1024:.0f}"
         f" KiB/step, table rows {train['table_rows']}"},
        {"stage": "eval", "seconds": seconds["eval"], "result":
         f"{evaluation['rows'][0]['tasks']} {evaluation['split']} tasks, checkpoint step "
         f"{evaluation['step']}"},
        {"stage": "export", "seconds": seconds["export"], "result":
         f"{export['path']} (signatures {', '.join(sorted(export['signatures']))})"},
        {"stage": "serve", "seconds": seconds["serve"], "result":
         f"fresh process, gmeta_tf imported: {served['gmeta_imported']}, "
         f"{served['rows']} query rows scored (first call {served['ms']} ms)"},
    ]
    columns = [c for c in TABLE_COLUMNS if any(r.get(c) is not None for r in evaluation["rows"])]
    columns = [c if c != "ndcg@3" else f"ndcg@{config.eval.ndcg_k}" for c in columns]
    machine = train.get("machine") or {}
    return "\n".join([
        f"gmeta demo: pipeline '{config.name}' ({config.data.source} data), "
        f"{sum(seconds.values()):.0f}s in all"
        + (f"\nmachine (rank 0): {machine['cpu']}; {', '.join(machine['instruction_sets'])}"
           if machine.get("cpu") else ""),
        format_table(stages, ["stage", "seconds", "result"]),
        "",
        "cold-start tasks (never trained on, never used to choose anything; adapted on their "
        "support rows, scored on their query rows; the baseline fine-tuned on the same rows "
        "and weights; references fitted on the warm rows):",
        format_table(evaluation["rows"], columns),
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gmeta_tf.demo", description=__doc__)
    parser.add_argument("--config", default="default")
    parser.add_argument("--np", dest="np_", type=int, default=2, help="training ranks")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    config = load_config(args.config, args.overrides)
    common = ["--config", args.config, *[a for o in args.overrides for a in ("--set", o)]]
    run = Path(config.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    seconds = {}
    seconds["data"] = _run("data", _gmeta("data", "prepare", *common))
    # `gmeta data prepare` prints the dataset summary; keep it for the table.
    from gmeta_tf import data as meta_io
    from gmeta_tf.data.cli import summary

    (run / "data_summary.json").write_text(json.dumps(summary(meta_io.Manifest.load(
        config.data.path))))
    seconds["train"] = _run("train", _gmeta("train", "--np", str(args.np_), *common, "--fresh"))
    seconds["eval"] = _run("eval", _gmeta("eval", *common))
    seconds["export"] = _run("export", _gmeta("export", *common))
    export_dirs = sorted(Path(config.export.dir).iterdir(), key=lambda p: p.stat().st_mtime)
    export_info = json.loads((export_dirs[-1] / "assets.extra" / "gmeta_export.json").read_text())
    (run / "export_info.json").write_text(json.dumps(export_info))
    seconds["serve"], served = _serve_check(config, export_dirs[-1])
    print("\n" + summary_table(config, args.np_, seconds, served), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
