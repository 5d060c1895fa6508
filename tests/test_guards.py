"""Training guards (relsql/train/feed/guards.py): which epochs get a log line."""

from __future__ import annotations

import math


def test_the_log_thinning_rule():
    from relsql.train.feed import guards

    for epochs in (1, 7, 10, 196, 400, 1000):
        logged = [e for e in range(epochs) if guards.logs_epoch(e, 0, epochs)]
        assert logged[0] == 0 and logged[-1] == epochs - 1 and len(logged) <= guards.LOG_LINES + 2, (epochs, logged)
    assert math.isclose(guards.log_every(196), 20)
