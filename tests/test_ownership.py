"""Only what relsql wrote is ever replaced (issue #27, must-fix 1 and 2).

A table relsql writes into a user's database bears relsql's mark of its kind (predictions, task,
...): a table comment on DuckDB and PostgreSQL, an index that goes with the table on SQLite, the
footer of a folder's Parquet file. `replace=True` (and the CLI's `--replace`) replaces only a
table with the same mark; a user's table, whatever its columns, is refused and left byte-identical.
Real DuckDB files, a real SQLite file and a real PostgreSQL server (tests/pg_server.py).
"""

from __future__ import annotations

import hashlib
import sqlite3
import uuid
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import relsql
from relsql.cli import main
from relsql.predictive import parse
from tests.test_model import SIMPLE, build
from tests.test_predictive import shop as predictive_shop

TASK_QUERY = "COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 60 DAYS"
KINDS = ("duckdb", "sqlite", "postgres")


def _copy_into(db: relsql.Database, duck_file: Path) -> None:
    """The DuckDB file's tables, copied into `db`'s source with plain DuckDB (not relsql's writer)."""
    db.con.execute(f"ATTACH '{duck_file}' AS copied (READ_ONLY)")
    scope = db.scopes()[0]
    for (name,) in db.con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'copied'").fetchall():
        db.con.execute(f'CREATE TABLE "{scope[0]}"."{scope[1]}"."{name}" AS SELECT * FROM copied."{name}"')
    db.con.execute("DETACH copied")


def _source(kind: str, tmp_path: Path, server, duck_file: Path):
    """A private copy of `duck_file`'s tables as a `kind` source: the argument for relsql.connect."""
    if kind == "duckdb":
        target = tmp_path / "data.duckdb"
        target.write_bytes(duck_file.read_bytes())
        return target
    if kind == "sqlite":
        target = tmp_path / "data.sqlite"
        sqlite3.connect(target).close()
    else:
        if server is None:
            pytest.skip("PostgreSQL server binaries are not installed; run scripts/setup")
        target = server.createdb(f"own_{uuid.uuid4().hex[:12]}")
    with relsql.connect(target) as db:
        _copy_into(db, duck_file)
    return target


def _hashes(db: relsql.Database, tables) -> dict[str, str]:
    """Every named table's rows, sorted, hashed: equal hashes mean the table is unchanged."""
    out = {}
    for name in tables:
        rows = db.arrow(f'SELECT * FROM "{name}"').to_pylist()
        out[name] = hashlib.sha256(repr(sorted(repr(r) for r in rows)).encode()).hexdigest()
    return out


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("own") / "model.duckdb"
    build(path, n=40).con.close()
    return path


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("own") / "task.duckdb"
    predictive_shop(n=20, path=path)[0].close()
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_write_predictions_replaces_only_relsqls_predictions(kind, tmp_path, shop_server, model_file):
    db = relsql.connect(_source(kind, tmp_path, shop_server, model_file))
    try:
        # a user's table that merely looks like predictions: the old column rule replaced it
        db.con.execute('CREATE TABLE "scores" AS SELECT 1 AS customer_id, 0.5 AS prediction')
        user = ["customer", "orders", "scores"]
        before = _hashes(db, user)
        model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
        for name in ("orders", "ORDERS", "scores", "Customer"):
            with pytest.raises(relsql.RelsqlError, match=f"(?i)cannot replace table `{name}`.*not a table of "
                                                         "predictions that relsql wrote.*Choose another name"):
                model.write_predictions(name, replace=True)
        assert _hashes(db, user) == before and sorted(db.tables()) == user
        rows = model.write_predictions("preds")
        assert model.write_predictions("preds", replace=True) == rows  # relsql's own: replaced
        assert db.arrow('SELECT count(*) AS n FROM "preds"').column("n")[0].as_py() == rows
        with pytest.raises(relsql.RelsqlError, match="`preds`.*a table of predictions, not a task table"):
            db.write_table("preds", pa.table({"x": [1]}), replace=True, kind="task")
        assert _hashes(db, user) == before
    finally:
        db.close()
    with relsql.connect(_reopen(kind, db)) as again:  # the mark persisted with the table
        assert again.source.written_kind(again, again.scopes()[0], "preds") == "predictions"
        assert again.source.written_kind(again, again.scopes()[0], "orders") is None


def _reopen(kind: str, db: relsql.Database):
    return db.source.url if kind == "postgres" else db.source.path


@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_task_table_replaces_only_relsqls_task_tables(kind, tmp_path, shop_server, task_file):
    db = relsql.connect(_source(kind, tmp_path, shop_server, task_file))
    try:
        db.con.execute('CREATE TABLE "product_x" AS SELECT 1::BIGINT AS task_id, DATE \'2020-01-01\' AS snapshot, '
                       'TRUE AS label')
        db.con.execute('CREATE TABLE "product" AS SELECT 1 AS id')
        user = ["customer", "orders", "product", "product_x"]
        before = _hashes(db, user)
        query = parse(TASK_QUERY)
        with pytest.raises(relsql.RelsqlError, match="`product_x`.*not a task table that relsql wrote"):
            query.write(db, "product_x", replace=True)
        with pytest.raises(relsql.RelsqlError, match="`product`.*names differing only in case"):
            query.write(db, "PRODUCT")
        with pytest.raises(relsql.RelsqlError, match="`product`.*not a task table that relsql wrote"):
            query.write(db, "PRODUCT", replace=True)
        assert _hashes(db, user) == before and sorted(db.tables()) == user
        first = query.write(db, "task_a")
        assert query.write(db, "task_a", replace=True).rows == first.rows
        assert _hashes(db, user) == before and sorted(db.tables()) == sorted([*user, "task_a"])
    finally:
        db.close()


def test_folder_parquet_mark(tmp_path):
    """A folder source: relsql's Parquet file carries the mark in its footer; a user's Parquet
    file of the same name is never replaced."""
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "mine.parquet")
    before = (tmp_path / "mine.parquet").read_bytes()
    with relsql.connect(tmp_path) as db:
        with pytest.raises(relsql.RelsqlError, match="`mine`.*not a plain table"):
            db.write_table("mine", pa.table({"a": [9]}), replace=True)
        db.write_table("out", pa.table({"a": [1]}))
        db.write_table("out", pa.table({"a": [2]}), replace=True)
        assert db.arrow('SELECT a FROM "out"').column("a").to_pylist() == [2]
    assert (tmp_path / "mine.parquet").read_bytes() == before


# -- the command line ----------------------------------------------------------------------------------------------
def _cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_cli_replace_refuses_user_tables_that_look_like_relsqls(tmp_path, capsys, model_file, task_file, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db_path = _source("duckdb", tmp_path, None, model_file)
    (tmp_path / "t.sql").write_text(SIMPLE)
    con = duckdb.connect(str(db_path))
    con.execute('CREATE TABLE "scores" AS SELECT 1 AS customer_id, 0.5 AS prediction')  # the old rule's "predictions"
    con.close()
    with relsql.connect(db_path, read_only=True) as db:
        before = _hashes(db, ["customer", "orders", "scores"])
    train = ["train", db_path, "--template", tmp_path / "t.sql", "--target", "customer.churned", "--epochs", "1",
             "--model", tmp_path / "m.pt"]
    code, err = _cli(capsys, *train, "--predictions", "scores", "--replace")
    assert code == 1 and "not a table of predictions that relsql wrote" in err and "--predictions" in err
    assert not (tmp_path / "m.pt").exists()  # refused before any training
    assert _cli(capsys, *train, "--predictions", "preds")[0] == 0
    code, err = _cli(capsys, "predict", db_path, "--model", tmp_path / "m.pt", "--table", "ORDERS", "--replace")
    assert code == 1 and "`orders`" in err and "not a table of predictions" in err
    assert _cli(capsys, "predict", db_path, "--model", tmp_path / "m.pt", "--table", "preds", "--replace")[0] == 0
    with relsql.connect(db_path, read_only=True) as db:
        assert _hashes(db, ["customer", "orders", "scores"]) == before

    (tmp_path / "t").mkdir()
    task_path = _source("duckdb", tmp_path / "t", None, task_file)
    con = duckdb.connect(str(task_path))
    con.execute("CREATE TABLE product_x AS SELECT 1::BIGINT AS task_id, DATE '2020-01-01' AS snapshot, TRUE AS label")
    con.close()
    with relsql.connect(task_path, read_only=True) as db:
        before = _hashes(db, ["customer", "orders", "product_x"])
    code, err = _cli(capsys, "task", task_path, TASK_QUERY, "--name", "product_x", "--replace")
    assert code == 1 and "not a task table that relsql wrote" in err and "--name" in err
    assert _cli(capsys, "task", task_path, TASK_QUERY, "--name", "task_a")[0] == 0
    assert _cli(capsys, "task", task_path, TASK_QUERY, "--name", "task_a", "--replace")[0] == 0
    with relsql.connect(task_path, read_only=True) as db:
        assert _hashes(db, ["customer", "orders", "product_x"]) == before


# -- a user's connection: its current catalog and schema ------------------------------------------------------------
def test_a_users_connection_keeps_its_current_catalog_and_schema(tmp_path, model_file):
    con = duckdb.connect()
    con.execute(f"ATTACH '{model_file}' AS src (READ_ONLY)")
    con.execute("USE src")
    pending = con.execute("SELECT * FROM range(5)")
    assert pending.fetchone() == (0,)
    with relsql.connect(con) as db:
        assert db.tables() == ["customer", "orders"] and db.scopes()[0] == ("src", "main")
        assert [c for c, _ in db.columns("orders")][:2] == ["order_id", "customer_id"]
    assert con.fetchone() == (1,)  # the user's pending result was left alone
    con.execute("USE memory")
    con.execute("CREATE SCHEMA side")
    con.execute("CREATE TABLE side.t AS SELECT 1 AS a")
    con.execute("USE memory.side")
    with relsql.connect(con) as db:
        assert db.tables() == ["t"] and db.scopes()[0] == ("memory", "side")
    con.close()


def test_gradients_replace_only_relsqls_gradient_tables(tmp_path, model_file):
    path = tmp_path / "grad.duckdb"
    path.write_bytes(model_file.read_bytes())
    with relsql.connect(path) as db:
        model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
        model.fit(epochs=1)
        written = model.gradients_as_relations("g_")
        assert model.gradients_as_relations("g_", replace=True) == written  # relsql's own gradients: replaced
        first = sorted(written.values())[0]
        assert db.source.written_kind(db, db.scopes()[0], first) == "gradients"
        db.con.execute('CREATE TABLE "u_w_out" AS SELECT 1 AS x')  # a user's table named like a gradient table
        before = _hashes(db, ["u_w_out", "customer", "orders"])
        with pytest.raises(relsql.RelsqlError, match="(?i)`u_w_out`.*not a table of gradients that relsql wrote"):
            model.gradients_as_relations("u_", replace=True)
        assert _hashes(db, ["u_w_out", "customer", "orders"]) == before
        assert not any(t.startswith("u_") and t != "u_w_out" for t in db.tables())  # all or nothing
