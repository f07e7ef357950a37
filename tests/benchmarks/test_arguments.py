"""The benchmarks' comma-separated flags: read into lists, and a bad value refused as the
arguments are parsed (naming the flag, the value and what was expected), before a
benchmark brings anything up."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import cluster
from benchmarks.arguments import comma_separated, joined


def test_lists_are_read_with_their_kind():
    assert comma_separated(int, minimum=1)("512, 256,") == [512, 256]
    assert comma_separated(choices=("a", "b"))("b,a") == ["b", "a"]
    assert joined([512, 256]) == "512,256"


@pytest.mark.parametrize("text, parse", [
    ("", comma_separated(int)),
    ("1,x", comma_separated(int)),
    ("64,0", comma_separated(int, minimum=1)),
    ("a,c", comma_separated(choices=("a", "b"))),
])
def test_bad_lists_are_refused(text, parse):
    with pytest.raises(argparse.ArgumentTypeError, match=f"got {text!r}"):
        parse(text)


def test_cluster_refuses_a_bad_tower_before_the_cluster_is_up(monkeypatch, capsys):
    monkeypatch.setattr(cluster.LocalCluster, "up", lambda *a, **k: pytest.fail("cluster up"))
    with pytest.raises(SystemExit) as stop:
        cluster.main(["--hybrid-hidden", "512,x"])
    assert stop.value.code == 2
    assert "--hybrid-hidden: expected comma-separated integers >= 1, got '512,x'" in (
        capsys.readouterr().err)


@pytest.mark.parametrize("rates, bad", [("unshaped,fast", "fast"), ("1gbit,0mbit", "0mbit")])
def test_cluster_refuses_a_bad_rate_before_the_cluster_is_up(monkeypatch, capsys, rates, bad):
    monkeypatch.setattr(cluster.LocalCluster, "up", lambda *a, **k: pytest.fail("cluster up"))
    with pytest.raises(SystemExit) as stop:
        cluster.main(["--rates", rates])
    assert stop.value.code == 2
    assert f"--rates: {bad!r} is not a rate: expected 'unshaped' or a positive number" in (
        capsys.readouterr().err)
    assert cluster.link_rates("unshaped, 10gbit,500mbit") == ["unshaped", "10gbit", "500mbit"]
