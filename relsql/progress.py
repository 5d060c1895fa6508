"""Progress as lines on stderr where no terminal shows bars (a notebook's log, a CI job, a file):
relsql's log lines (each stage, a long statement every few seconds, a few epochs per fit) reach
the user without configuring logging. `progress=False` silences them; a user's own logging
configuration (a handler on "relsql" or the root logger) is left to decide."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def lines(progress: bool | None = None) -> Iterator[None]:
    """For the length of the block, relsql's INFO lines go to stderr as "relsql: ...", unless
    `progress` is False, stderr is a terminal (bars show there) or logging is configured."""
    logger = logging.getLogger("relsql")
    if progress is False or (progress is None and sys.stderr.isatty()) or logger.handlers or logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("relsql: %(message)s"))
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
