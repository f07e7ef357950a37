"""The Docker image, built from this tree and used as a user would.

``docker/build.sh`` builds the CPU image (starting an engine when none answers), then, each
in its own ``docker run --network host`` with ``runs/`` mounted: ``gmeta data prepare``,
``horovodrun -np 2 -H localhost:2 gmeta train``, ``gmeta eval`` and ``gmeta export`` on a
tiny generated dataset. Outside the image, the exported SavedModel is loaded in a process
that never imports gmeta_tf and must score as the model trained inside does (restored
here from the checkpoint the image wrote).

A build takes minutes the first time (seconds once its layers are cached), so the test runs
only when ``GMETA_DOCKER_TEST=1`` (``.ci/run`` sets it when it can start an engine) and is
skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.product.conftest import served, tiny_overrides

pytestmark = pytest.mark.docker

PROJECT_ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("GMETA_DOCKER_IMAGE", "gmeta-tf")
IN_IMAGE_RUNS = "/opt/gmeta-tf/runs"
STEPS = 8


def _docker() -> str:
    return os.environ.get("DOCKER") or ("/usr/bin/docker" if Path("/usr/bin/docker").exists()
                                        else "docker")


def _run(command: list[str], timeout: float) -> str:
    result = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True,
                            timeout=timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 0, (f"{' '.join(command)} exited {result.returncode}:\n"
                                    f"{output[-6000:]}")
    return output


@pytest.fixture(scope="module")
def image():
    """The image built by docker/build.sh; the engine is stopped after if this started it."""
    if os.environ.get("GMETA_DOCKER_TEST") != "1":
        pytest.skip("builds the Docker image (minutes): set GMETA_DOCKER_TEST=1; .ci/run "
                    "does when it can start a Docker engine")
    engine = ["bash", str(PROJECT_ROOT / "docker" / "engine.sh")]
    already = subprocess.run([*engine, "status"], capture_output=True).returncode == 0
    if not already:
        started = subprocess.run([*engine, "start"], capture_output=True, text=True)
        if started.returncode != 0:
            pytest.skip(f"no Docker engine: {started.stdout.strip().splitlines()[-1:]}")
    try:
        output = _run(["bash", "docker/build.sh", "--tag", IMAGE], timeout=2400)
        print(*[line for line in output.splitlines() if " built in " in line])  # time, size
        yield IMAGE
    finally:
        if not already:
            subprocess.run([*engine, "stop"], capture_output=True)


@pytest.fixture(scope="module")
def smoke(image, tmp_path_factory):
    """data -> horovodrun -np 2 train -> eval -> export, each in a container of the image;
    returns the host directory mounted as the image's runs/."""
    runs = tmp_path_factory.mktemp("image_runs")
    overrides = tiny_overrides(Path("runs/smoke"), Path("runs/smoke/data"), steps=STEPS)
    sets = [a for o in overrides for a in ("--set", o)]
    docker_run = [_docker(), "run", "--rm", "--network", "host",
                  "-v", f"{runs}:{IN_IMAGE_RUNS}", image]
    _run([*docker_run, "gmeta", "data", "prepare", "--config", "default", *sets], 600)
    _run([*docker_run, "horovodrun", "-np", "2", "-H", "localhost:2",
          "--gloo-timeout-seconds", "60", "gmeta", "train", "--config", "default", "--fresh",
          *sets], 900)
    _run([*docker_run, "gmeta", "eval", "--config", "default", *sets], 600)
    _run([*docker_run, "gmeta", "export", "--config", "default", *sets], 600)
    return runs


def test_image_trains_with_two_ranks_and_evaluates(smoke):
    summary = json.loads((smoke / "smoke" / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == STEPS
    assert np.isfinite(summary["final_loss"])
    result = json.loads((smoke / "smoke" / "eval" / "cold.json").read_text())
    names = [r["name"] for r in result["rows"]]
    assert names[0].startswith("meta") and any(n.startswith("baseline") for n in names)
    assert all(0.0 <= r["auc"] <= 1.0 and r["tasks"] > 0 for r in result["rows"])


def test_saved_model_exported_in_the_image_serves_outside_it(smoke, tmp_path):
    from gmeta_tf import data as meta_io
    from gmeta_tf.config import load_config
    from gmeta_tf.training.cold_start import restore_models

    run_dir = smoke / "smoke"
    config = load_config("default", tiny_overrides(run_dir, run_dir / "data", steps=STEPS))
    model = restore_models(config)[0].model
    batch = next(iter(meta_io.read_tasks(config.data.path, 4, None, None, split="cold")))
    batch = {"task_id": batch["task_id"],
             **{r: {k: v.numpy() for k, v in batch[r].items()} for r in ("support", "query")}}
    real = {r: np.asarray(batch[r]["mask"][0]) > 0 for r in ("support", "query")}
    support, query = ({k: np.asarray(v[0])[real[r]] for k, v in batch[r].items() if k != "mask"}
                      for r in ("support", "query"))
    features = model.tower.feature_names
    expected = model.adapted_predictions(batch, steps=0).numpy()[0][real["query"]]
    expected_adapted = model.serve(support, {k: query[k] for k in features}).numpy()

    label = model.head.label
    inputs = {**{f"serve/{k}": query[k] for k in features},
              **{f"adapt/support_{k}": support[k] for k in features},
              **{f"adapt/support_{label}": support[label]},
              **{f"adapt/query_{k}": query[k] for k in features}}
    export_dir, = (run_dir / "export").iterdir()  # the best checkpoint's step
    out = served(export_dir, inputs, tmp_path)
    np.testing.assert_allclose(out["serve"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["adapt"], expected_adapted, rtol=1e-5, atol=1e-6)
    assert not np.allclose(expected_adapted, expected)  # the adapt signature did adapt
