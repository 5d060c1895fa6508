"""A new process that loads a saved model does not import pandas: DuckDB's Python client imports it
on the first query given parameters (0.4-4 s of a cold `relsql predict`), so relsql binds its
catalog queries' values as typed literals (relsql.sql.bound) instead."""

from __future__ import annotations

import subprocess
import sys

import duckdb

import relsql
from relsql.sql import bound

LOAD = """
import sys
import relsql
db = relsql.connect(sys.argv[1], read_only=True)
model = relsql.Model.load(sys.argv[2], db)
assert model.task.kind == "binary", model.task.kind
print("pandas" in sys.modules)
"""


def test_load_in_a_new_process_imports_no_pandas(tmp_path):
    path = tmp_path / "small.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE c(id INTEGER PRIMARY KEY, age DOUBLE, city VARCHAR, churned BOOLEAN)")
    con.execute("INSERT INTO c SELECT i, i % 37, 'city' || (i % 5), i % 3 = 0 FROM range(120) t(i)")
    con.close()
    db = relsql.connect(str(path))
    model = relsql.Model(db, relsql.Template.auto(db, "c.churned"), "c.churned", progress=False)
    model.fit(epochs=2)
    model.save(tmp_path / "m.pt")
    db.close()
    done = subprocess.run([sys.executable, "-c", LOAD, str(path), str(tmp_path / "m.pt")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_bound_values_are_literals_not_text():
    """A value with quotes and SQL in it stays one string literal; the query returns the row it names."""
    con = duckdb.connect()
    con.execute('CREATE TABLE "it\'s; DROP TABLE x" (a INTEGER)')
    query = bound("SELECT table_name FROM duckdb_tables() WHERE table_name = :name", name="it's; DROP TABLE x")
    assert con.execute(query).fetchall() == [("it's; DROP TABLE x",)]
    assert con.execute(bound("SELECT 42 AS v WHERE 41 = :n", n=41)).fetchall() == [(42,)]
