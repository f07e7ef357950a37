"""The one error type of Meta-IO: it names the file, column, task and value at fault."""

from __future__ import annotations

from typing import Any


#: Ends the message of a dataset file found damaged (missing, resized, changed, unreadable).
DAMAGED = ("; the dataset is damaged: gmeta data info DATASET checks every file against its "
           "manifest, and gmeta data prepare --overwrite (or the gmeta data csv command with "
           "--overwrite) makes it again")


def one_line(err: BaseException) -> str:
    """A library's error message on one line (its message may hold several)."""
    return " ".join(str(err).split())


class DataError(ValueError):
    """Bad input to Meta-IO (missing/corrupt file, schema mismatch, bad label, short task).

    The message always starts with the file (when known) and names the column, the task
    and the offending value next to what was expected, so a log line alone is actionable.
    """

    def __init__(
        self,
        problem: str,
        *,
        file: str | None = None,
        column: str | None = None,
        task: Any = None,
        value: Any = None,
        expected: str | None = None,
    ) -> None:
        self.file, self.column, self.task, self.value = file, column, task, value
        parts = [f"{file}: " if file else ""]
        if column is not None:
            parts.append(f"column {column!r}: ")
        if task is not None:
            parts.append(f"task {task}: ")
        parts.append(problem)
        if value is not None:
            parts.append(f" (got {value!r}")
            parts.append(f", expected {expected})" if expected else ")")
        elif expected:
            parts.append(f" (expected {expected})")
        super().__init__("".join(parts))
