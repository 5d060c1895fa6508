"""How a Model's public methods run: on the model's torch threads, with progress as lines where
there is no terminal, and with a database server that went away reported as such."""

from __future__ import annotations

import contextlib
import functools

import duckdb

from relsql.data.duckdb import lost_connection
from relsql.data.engine import Database
from relsql.errors import RelsqlError, SourceError
from relsql.progress import lines as progress_lines
from relsql.train.learner.threads import torch_threads


def with_threads(method):
    """Run a Model method with torch's threads set for this model (put back afterwards), and a
    database server that went away reported as such."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with torch_threads(self.threads), server_reachable(self.db), progress_lines(self.learner.settings.progress):
            return method(self, *args, **kwargs)

    return run


@contextlib.contextmanager
def server_reachable(db: Database | None):
    """A database that cannot be reached any more (a PostgreSQL server stopped mid-training) is a
    SourceError naming it, whether DuckDB raised it raw or relsql already wrapped it for a statement."""
    try:
        yield
    except (duckdb.Error, RelsqlError) as err:
        lost = None if isinstance(err, SourceError) or db is None else lost_connection(db.description, err)
        if lost is None:
            raise
        raise lost from None


def checked_database(db: object) -> Database:
    """`db` if it is a relsql.Database, else a RelsqlError saying where one comes from."""
    if not isinstance(db, Database):
        if hasattr(db, "table_dict"):  # relbench's Database (duck-typed: relsql never imports relbench)
            raise RelsqlError(f"db must be a relsql.Database, got relbench's {type(db).__name__}: convert it with "
                              "relsql.from_relbench(relbench_db, tasks={name: task}) (the same task names as when the "
                              "model was trained), or open the dataset folder with relsql.connect(folder)")
        raise RelsqlError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
    return db
