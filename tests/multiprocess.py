"""Launching real ranks from tests: `horovodrun -np N -H localhost:N` on this machine, as
`gmeta train --np N` runs it (`gmeta_tf.launcher`: Horovod's launcher, its build probes
answered from their cache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from gmeta_tf.launcher import horovodrun

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def run_ranks(module: str, *args: str, np_: int = 2, timeout: float = 300) -> str:
    """Runs `python -m module args` as np_ ranks (a plain process when np_ is 1) and
    returns its output; fails the test with that output when any rank fails."""
    command = [sys.executable, "-m", module, *args]
    if np_ > 1:
        command = [*horovodrun(), "-np", str(np_), "-H", f"localhost:{np_}",
                   "--gloo-timeout-seconds", "60", *command]
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(PROJECT_ROOT))
    result = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{output[-6000:]}")
    return output


def load_ranks(out_dir: Path, np_: int) -> list[dict[str, np.ndarray]]:
    results = []
    for r in range(np_):
        with np.load(out_dir / f"rank{r}.npz", allow_pickle=False) as data:
            results.append({k: data[k] for k in data.files})
    return results
