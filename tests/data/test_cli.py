"""``gmeta-data`` converts with a YAML mapping or flags and reports bad input with exit code 2."""

from __future__ import annotations

import json

from gmeta_tf import data
from gmeta_tf.data import cli


def test_csv_with_a_yaml_mapping(raw_csv, tmp_path, capsys):
    mapping = tmp_path / "m.yaml"
    mapping.write_text("task: user_id\nlabel: label\nlabel_range: [0, 1]\n"
                       "sparse: [user_id, item_id]\nmulti_hot: {genres: 3}\ndense: [price]\n")
    code = cli.main(["csv", str(raw_csv), str(tmp_path / "out"), "--mapping", str(mapping),
                     "--seed", "4", "--query-size", "5", "--min-rows", "8", "--format", "orc"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["file_format"] == "orc" and summary["split"]["seed"] == 4
    assert sum(s["tasks"] for s in summary["splits"].values()) == 300
    assert data.Manifest.load(str(tmp_path / "out")).schema["genres"].dim == 3


def test_csv_with_flags_matches_the_yaml_mapping(raw_csv, tmp_path):
    code = cli.main(["csv", str(raw_csv), str(tmp_path / "out"), "--task", "user_id",
                     "--label", "label", "--sparse", "user_id,item_id", "--multi-hot", "genres:3",
                     "--dense", "price", "--query-size", "5", "--min-rows", "8"])
    assert code == 0
    m = data.Manifest.load(str(tmp_path / "out"))
    assert [f.name for f in m.schema.features] == ["user_id", "item_id", "genres", "price", "label"]


def test_bad_input_exits_2_with_the_file_named(tmp_path, capsys):
    assert cli.main(["info", str(tmp_path)]) == 2
    assert f"{tmp_path}/manifest.json: no manifest" in capsys.readouterr().err


def test_long_warm_tasks_are_trained_on_unless_the_flag_says_no(raw_csv, tmp_path):
    protocol = ["--task", "user_id", "--label", "label", "--sparse", "user_id,item_id",
                "--query-size", "10", "--min-rows", "20", "--max-rows", "25"]
    assert cli.main(["csv", str(raw_csv), str(tmp_path / "kept"), *protocol]) == 0
    assert cli.main(["csv", str(raw_csv), str(tmp_path / "dropped"), *protocol,
                     "--no-train-long-tasks"]) == 0
    kept = data.Manifest.load(str(tmp_path / "kept")).split
    dropped = data.Manifest.load(str(tmp_path / "dropped")).split
    assert kept["train_long_tasks"] is True and dropped["train_long_tasks"] is False
    gained = kept["warm_tasks"] - dropped["warm_tasks"]
    assert gained > 0 and kept["dropped_long"] == dropped["dropped_long"] - gained
    assert (kept["valid_tasks"], kept["cold_tasks"]) == (dropped["valid_tasks"],
                                                         dropped["cold_tasks"])


def test_converting_integer_ids_and_reading_info_import_no_tensorflow(tmp_path):
    """`gmeta data` runs in one process without Horovod or TensorFlow where it needs neither
    (help, `info`, a file of integer ids: string ids are hashed by TensorFlow's farmhash,
    as serving hashes them): seconds of import and TensorFlow's start-up lines saved."""
    import subprocess
    import sys

    raw = tmp_path / "clicks.csv"
    raw.write_text("user,item,click\n" + "".join(f"{u},{u * 7 % 13},{u % 2}\n"
                                                 for u in range(40)))
    out = tmp_path / "out"
    program = ("import sys\nfrom gmeta_tf import cli\ncodes = [cli.main(a.split()) for a in "
               "sys.argv[1:]]\nprint(codes, 'tensorflow' in sys.modules, file=sys.stderr)")
    result = subprocess.run(
        [sys.executable, "-c", program,
         f"data csv {raw} {out} --label click --sparse user,item --min-rows 1 --query-size 0 "
         "--warm-fraction 1.0", f"data info {out}"],
        capture_output=True, text=True, timeout=120)
    assert result.stderr.splitlines()[-1] == "[0, 0] False", result.stderr
    assert "[rank 0/1]" in result.stderr  # the log lines say which rank, as elsewhere
    assert sum(s["rows"] for s in data.Manifest.load(str(out)).per_split().values()) == 40
