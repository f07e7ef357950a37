"""``gmeta train --resume`` continues from the checkpoint to the weights of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf import checkpoint
from gmeta_tf.cli import main
from tests.product.conftest import tiny_overrides


def _train(run_dir: Path, data_dir: Path, steps: int, *flags: str) -> None:
    sets = [a for o in tiny_overrides(run_dir, data_dir, steps) + ["train.eval_every=0"]
            for a in ("--set", o)]
    assert main(["train", *sets, *flags]) == 0


def _contents(ckpt: Path) -> dict[str, np.ndarray]:
    """Every dense variable (optimizer slots included) and every table array of a checkpoint."""
    reader = tf.train.load_checkpoint(str(ckpt / "dense"))
    out = {f"dense:{k}": reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
           if "save_counter" not in k and "OBJECT_GRAPH" not in k}
    for shard in sorted((ckpt / "shards").iterdir()):
        with np.load(shard) as data:
            out.update({f"{shard.name}:{k}": data[k] for k in data.files})
    return out


def test_resume_reaches_the_weights_of_an_uninterrupted_run(tiny_data, tmp_path):
    _train(tmp_path / "whole", tiny_data, 8, "--fresh")
    _train(tmp_path / "split", tiny_data, 4, "--fresh")
    assert checkpoint.latest(tmp_path / "split" / "checkpoints").name == "ckpt-4"
    _train(tmp_path / "split", tiny_data, 8, "--resume")

    whole = _contents(checkpoint.latest(tmp_path / "whole" / "checkpoints"))
    resumed = _contents(checkpoint.latest(tmp_path / "split" / "checkpoints"))
    assert whole.keys() == resumed.keys()
    assert any("tower" in k and "Adam" not in k for k in whole)
    for key in whole:
        np.testing.assert_array_equal(resumed[key], whole[key], err_msg=key)


def test_existing_checkpoints_need_resume_or_fresh(tiny_data, tmp_path, capsys):
    _train(tmp_path / "run", tiny_data, 4, "--fresh")
    sets = [a for o in tiny_overrides(tmp_path / "run", tiny_data, 4) for a in ("--set", o)]
    assert main(["train", *sets]) == 2
    assert "already has checkpoints (latest ckpt-4): pass --resume" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--resume", "--fresh"]])
def test_resume_and_fresh_exclude_each_other(flags):
    with pytest.raises(SystemExit):
        main(["train", *flags])
