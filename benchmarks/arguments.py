"""Argument types the benchmarks share: comma-separated lists checked as they are parsed,
so a bad value stops a benchmark before it starts anything (a cluster, a training job)."""
from __future__ import annotations

import argparse
from typing import Callable, Iterable


def comma_separated(kind: type = str, minimum: int | None = None,
                    choices: Iterable[str] | None = None) -> Callable[[str], list]:
    """An argparse ``type`` reading ``"a,b,c"`` as a non-empty list of ``kind`` values, each at
    least ``minimum`` and one of ``choices`` when given; otherwise argparse reports the flag,
    the value given and what was expected."""
    allowed = tuple(choices) if choices is not None else None

    def parse(text: str) -> list:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        what = "comma-separated " + ("integers" if kind is int else
                                     "numbers" if kind is float else "names")
        if minimum is not None:
            what += f" >= {minimum}"
        if allowed is not None:
            what += f" from {', '.join(allowed)}"
        try:
            values = [kind(part) for part in parts]
        except ValueError:
            values = []
        if (not values or (minimum is not None and min(values) < minimum)
                or (allowed is not None and any(v not in allowed for v in values))):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return values

    parse.__name__ = "comma-separated list"
    return parse


def joined(values: Iterable) -> str:
    """``values`` written back as one comma-separated argument (for a child command)."""
    return ",".join(str(v) for v in values)
