"""Shared fixtures: the project root, ../shared/data, quiet TensorFlow."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data from the project root; tests that need it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (CI always has it)")
    return SHARED_DATA


# The files whose tests take longest (set-up included), longest first: one clean-clone run
# of the suite in one process (`pytest --durations=0`), the Docker image test with its
# layers built anew. `make test` hands whole files to its two workers in collection order
# (`--dist loadfile --no-loadscope-reorder`), so the longest start first and the short ones
# fill in at the end (longest-processing-time-first scheduling); xdist's default order, by
# number of tests per file, had left the image build running alone at the end of the run.
LONGEST_FIRST = (
    "tests/test_docker_image.py",
    "tests/product/test_own_data.py",
    "tests/reliability/test_cluster.py",
    "tests/product/test_selection.py",
    "tests/embedding/test_sharded_hash_embedding.py",
    "tests/reliability/test_kill_and_resume.py",
    "tests/product/test_round_trip.py",
    "tests/product/test_resume.py",
    "tests/product/test_hybrid.py",
    "tests/meta/test_distributed.py",
    "tests/reliability/test_elastic.py",
)


def pytest_collection_modifyitems(config, items):
    """Orders the files as LONGEST_FIRST says (the rest after, as collected); the tests of a
    file keep their order."""
    root = config.rootpath
    missing = [path for path in LONGEST_FIRST if not (root / path).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names files that do not "
                                f"exist: {missing}; list the moved files' new paths")
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def key(item):
        path = Path(str(item.path)).relative_to(root).as_posix()
        return rank.get(path, len(LONGEST_FIRST))

    items.sort(key=key)
