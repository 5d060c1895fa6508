"""Progress shown to the user: a bar per stage over relations (`relations`), and, where no terminal
shows bars (a notebook's log, a CI job, a file), relsql's log lines on stderr (`lines`): each stage,
a long statement every few seconds, a few epochs per fit reach the user without configuring
logging. `progress=False` silences them; a user's own logging configuration (a handler on "relsql"
or the root logger) is left to decide."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("relsql")


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


class RelationProgress:
    """Relations being grounded: a tqdm bar on a terminal, whose clock a watcher thread keeps
    ticking while one relation takes long; without a bar, a log line when a relation is still
    running after 10 s, 30 s, 1 min, 2 min, 4 min... (a few lines, not one per second)."""

    FIRST_LINES = (10.0, 30.0, 60.0)

    def __init__(self, items: list[str], enabled: bool | None, what: str = "grounding"):
        self.items, self.what = items, what
        self.bar = None
        if enabled is not False:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=len(items), desc=what, unit="relation", disable=None if enabled is None else not enabled,
                            leave=False)
            if self.bar.disable:
                self.bar = None
        self.current: tuple[str, float] | None = None

    def set_postfix_str(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def __iter__(self) -> Iterator[str]:
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(stop,), name="relsql-progress", daemon=True)
        watcher.start()
        try:
            for item in self.items:
                self.current = (item, time.monotonic())
                yield item
                if self.bar is not None:
                    self.bar.update(1)
        finally:
            stop.set()
            if self.bar is not None:
                self.bar.close()

    def _watch(self, stop: threading.Event) -> None:
        said: tuple[str, float] | None = None
        delay = 0
        while not stop.wait(1.0):
            if self.bar is not None:
                self.bar.refresh()  # tqdm redraws only on update: keep the elapsed time moving
                continue
            current = self.current
            if current is None:
                continue
            if current is not said:
                said, delay = current, 0
            elapsed = time.monotonic() - current[1]
            due = (self.FIRST_LINES[delay] if delay < len(self.FIRST_LINES)
                   else self.FIRST_LINES[-1] * 2 ** (delay - len(self.FIRST_LINES) + 1))
            if elapsed >= due:
                log.info("%s: %s still running after %.0fs (Ctrl-C stops it)", self.what, current[0], elapsed)
                delay += 1


def relations(items: list[str], enabled: bool | None, what: str = "grounding") -> RelationProgress:
    """`items`, iterated with progress shown (see `RelationProgress`); `enabled` False: no bar, log lines only."""
    return RelationProgress(list(items), enabled, what)
