"""A check every rank runs, whose failure on any rank stops every rank.

Without it a rank that finds bad input exits while its peers wait in the next collective
until the launcher's timeout. Each rank runs the check, the ranks sum their failure flags,
and every rank raises: the one that failed its own error, the others an error pointing at
the failing ranks' message.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from gmeta_tf import distributed
from gmeta_tf.config import ConfigError
from gmeta_tf.data.errors import DataError

T = TypeVar("T")
CHECK_ERRORS = (ConfigError, DataError)


def on_all_ranks(check: Callable[[], T], what: str) -> T:
    """Runs ``check`` on every rank; raises on every rank when it failed on any.

    Args:
        check: The check (it may return a value, returned where it succeeded).
        what: What was checked, for the message of the ranks that did not fail.
    """
    error: Exception | None = None
    result = None
    try:
        result = check()
    except CHECK_ERRORS as err:
        error = err
    failed = distributed.allgather([1 if error is not None else 0])
    if error is not None:
        raise error
    if failed.any():
        ranks = [int(r) for r in failed.nonzero()[0]]
        raise ConfigError(f"{what} failed on rank(s) {ranks} (their message says why)")
    return result
