"""Small CSV files as the README's "Your own data" section describes them, and the
section's code blocks, so tests can walk it as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.multiprocess import PROJECT_ROOT

GENRES = ["Action", "Comedy", "Drama", "Horror", "Romance", "Sci-Fi"]
#: ``--set`` flags that shorten a run (tune, train, eval, export) and change nothing else.
SHORT = ["--set", "train.steps=6", "--set", "train.log_every=3", "--set", "train.eval_every=3",
         "--set", "train.checkpoint_every=3", "--set", "train.eval_batches=1"]
README = PROJECT_ROOT / "README.md"


def gmeta() -> str:
    """The gmeta command of the project's venv."""
    beside = Path(sys.executable).with_name("gmeta")
    return str(beside) if beside.exists() else shutil.which("gmeta") or "gmeta"


def write_ratings(directory: Path, users: int = 80, items: int = 120, seed: int = 0) -> int:
    """ratings.csv (user_id,item_id,rating,timestamp) and items.csv (item_id,title,genres,
    year); users like some genres more. Returns the number of rating rows."""
    rng = np.random.default_rng(seed)
    item_genres = [sorted(rng.choice(len(GENRES), rng.integers(1, 4), replace=False))
                   for _ in range(items)]
    with open(directory / "items.csv", "w") as f:
        f.write("item_id,title,genres,year\n")
        for i, genres in enumerate(item_genres, start=1):
            f.write(f"{i},Movie {i},{'|'.join(GENRES[g] for g in genres)},{1980 + i % 40}\n")
    rows = 0
    with open(directory / "ratings.csv", "w") as f:
        f.write("user_id,item_id,rating,timestamp\n")
        for u in range(1, users + 1):
            taste = rng.normal(0, 1.5, len(GENRES))
            for k in range(int(rng.integers(14, 30))):
                item = int(rng.integers(1, items + 1))
                score = 3 + taste[item_genres[item - 1]].mean() + rng.normal(0, 0.5)
                f.write(f"u{u},{item},{int(np.clip(round(score), 1, 5))},{1_000_000 + 100 * u + k}\n")
                rows += 1
    return rows


def write_clicks(path: Path, rows: int = 3000, seed: int = 0, sites: int = 40) -> int:
    """clicks.csv (hour,site_id,app_id,device_type,banner_pos,click); returns its rows."""
    rng = np.random.default_rng(seed)
    site_rate = rng.uniform(0.05, 0.5, sites)
    with open(path, "w") as f:
        f.write("hour,site_id,app_id,device_type,banner_pos,click\n")
        for r in range(rows):
            site = int(rng.integers(0, sites))
            device, banner = int(rng.integers(0, 3)), int(rng.integers(0, 3))
            rate = site_rate[site] * (1.5 if banner == 1 else 1.0)
            click = int(rng.random() < min(rate, 0.95))
            hour = f"2024-05-{1 + r % 28:02d}T{r % 24:02d}:00:00"
            f.write(f"{hour},s{site:04x}ab,a{int(rng.integers(0, 20)):03x},{device},{banner},"
                    f"{click}\n")
    return rows


def readme_block(first_line: str) -> str:
    """The fenced block of the README whose first line starts with ``first_line``."""
    for block in re.findall(r"```[a-z]*\n(.*?)```", README.read_text(), flags=re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"README has no code block starting with {first_line!r}")


def readme_commands_after(first_line: str) -> list[list[str]]:
    """The commands of the bash block right after the block starting with ``first_line``
    (comments dropped), each split into words."""
    text = README.read_text()
    blocks = re.findall(r"```([a-z]*)\n(.*?)```", text, flags=re.S)
    for i, (_, block) in enumerate(blocks):
        if block.startswith(first_line):
            lang, commands = blocks[i + 1]
            assert lang == "bash", f"the block after {first_line!r} is not a bash block"
            return [line.split("#")[0].split() for line in commands.splitlines()
                    if line.split("#")[0].strip()]
    raise AssertionError(f"README has no code block starting with {first_line!r}")


def run_readme_commands(work: Path, first_line: str,
                        shorter: list[str] = SHORT) -> list[subprocess.CompletedProcess]:
    """Runs the bash block after the README block starting with ``first_line`` in
    ``work``, each command as written plus ``shorter`` (tune, train, eval, export) and a
    tune budget of one trial without re-checks; fails naming the command that failed."""
    results = []
    for words in readme_commands_after(first_line):
        assert words[0] == "gmeta", words
        extra = shorter if words[1] in ("tune", "train", "eval", "export") else []
        if words[1] == "tune":  # and the budget: the pipeline's own settings, no re-check
            extra = extra + ["--trials", "1", "--rechecks", "0"]  # (search: test_selection)
        result = subprocess.run([gmeta(), *words[1:], *extra], cwd=work, capture_output=True,
                                text=True, timeout=900,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        assert result.returncode == 0, f"{words} exited {result.returncode}:\n" \
                                       f"{(result.stdout + result.stderr)[-5000:]}"
        results.append(result)
    return results


def config_in(work: Path, name: str, overrides: list[str] = ()):
    """The config ``name`` as the README's commands read it in ``work`` (its relative
    paths are relative to the working directory), with ``--set`` flags or bare
    overrides."""
    from gmeta_tf.config import load_config

    cwd = Path.cwd()
    os.chdir(work)
    try:
        return load_config(name, [s for s in overrides if s != "--set"])
    finally:
        os.chdir(cwd)


def walk_readme_example(work: Path, first_line: str):
    """Writes the README's config block starting with ``first_line`` (``# NAME.yaml``) to
    ``work`` and runs the commands after it there, shortened (``run_readme_commands``).
    Returns the config as they read it and their completed processes."""
    name = first_line.lstrip("# ").split()[0]
    (work / name).write_text(readme_block(first_line))
    results = run_readme_commands(work, first_line)
    return config_in(work, name, SHORT), results
