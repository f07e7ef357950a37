"""The main job, ``make demo`` (``python -m gmeta_tf.demo``), shrunk by the tiny pipeline's
overrides and otherwise as the README runs it: every stage as its own command (data,
training on 2 ranks under horovodrun, eval, export, the SavedModel served in a fresh
process without gmeta_tf), then the summary with the eval's cold-start table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.multiprocess import PROJECT_ROOT
from tests.product.conftest import set_args, tiny_overrides


def test_the_demo_runs_every_stage_and_prints_the_cold_start_table_eval_wrote(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-m", "gmeta_tf.demo", "--np", "2",
         *set_args(tiny_overrides(run, tmp_path / "data"))],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    out = result.stdout
    # the generated data's repeated impressions are said to be events, not warned of
    said = [line for line in (out + result.stderr).splitlines() if "repeat" in line]
    assert said and not [line for line in said if "WARNING" in line], said
    for stage in ("data", "train", "eval", "export"):
        assert f"\n==> {stage}: " in out, stage
    summary = out[out.index("gmeta demo: pipeline 'default' (synthetic data)"):]
    lines = summary.splitlines()
    stages = {line.split()[0]: line for line in lines
              if line.split()[:1] in (["data"], ["train"], ["eval"], ["export"], ["serve"])}
    assert set(stages) == {"data", "train", "eval", "export", "serve"}
    assert "240 tasks" in stages["data"] and "2 ranks, 8 steps" in stages["train"]
    assert "gmeta_tf imported: False" in stages["serve"]
    export_dir, = (run / "export").iterdir()
    assert str(export_dir) in stages["export"]
    # the table is eval/cold.json's, row for row
    cold = json.loads((run / "eval" / "cold.json").read_text())
    assert f"{cold['rows'][0]['tasks']} cold tasks, checkpoint step {cold['step']}" \
        in stages["eval"]
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("name ")):]
    assert len(table) == 2 + len(cold["rows"])
    for line, row in zip(table[2:], cold["rows"]):
        assert line.startswith(row["name"]) and f"{row['auc']:.4f}" in line, (line, row)
