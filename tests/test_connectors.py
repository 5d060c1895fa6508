"""Every data source, for real: a DuckDB file, SQLite, Parquet and CSV folders, PostgreSQL (a
throwaway server started by the suite), data frames. The same template gives the same numbers
from each; writes are atomic; bad sources are clear SourceErrors."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pytest
import sqlglot.expressions as exp
import torch

import relsql
from relsql.connectors import extensions
from relsql.data.duckdb import qualified
from relsql.errors import SchemaError, SourceError

KINDS = ("duckdb", "sqlite", "parquet", "csv", "postgres", "frames")
USER_TABLES = ["customer", "orders", "product", "review"]

TEMPLATE = """
CREATE TABLE prod_h AS SELECT p.id, tanh(linear(p.price, 4, 'w_price')) FROM product p;
CREATE TABLE cust_h AS
SELECT o.customer_id AS id, relu(avg(linear(ph.h, 4, 'w') + linear(o.qty, 4, 'w_qty')))
FROM orders o JOIN prod_h ph ON ph.id = o.product_id JOIN customer c ON c.id = o.customer_id
WHERE o.day >= DATE '2024-01-02'
GROUP BY o.customer_id;
CREATE TABLE score AS SELECT c.id, linear(concat(ch.h, features(c.price)), 1, 'w_out')
FROM (SELECT r.customer_id AS id, max(p.price) AS price FROM review r JOIN product p ON p.id = r.product_id
      GROUP BY r.customer_id) c
JOIN cust_h ch ON ch.id = c.id;
"""


def _source(sources, kind):
    if kind not in sources:
        pytest.skip(f"no {kind} source on this machine")
    return sources[kind]


def _outputs(db):
    net = relsql.compile(relsql.Template.from_sql(TEMPLATE), db, dtype=torch.float64, seed=0)
    out = net()
    keys = {name: net.values(name).drop("value").to_dicts() for name in out}
    return out, keys


@pytest.fixture(scope="module")
def reference(shop_sources):
    db = relsql.connect(shop_sources["duckdb"], read_only=True)
    try:
        return _outputs(db)
    finally:
        db.close()


@pytest.mark.parametrize("kind", KINDS)
def test_same_template_same_numbers(shop_sources, reference, kind):
    db = relsql.connect(_source(shop_sources, kind))
    try:
        assert db.tables() == USER_TABLES
        out, keys = _outputs(db)
        ref_out, ref_keys = reference
        assert set(out) == set(ref_out) == {"prod_h", "cust_h", "score"}
        for name in out:
            assert keys[name] == ref_keys[name], name
            assert torch.equal(out[name], ref_out[name]), f"{kind}: {name} differs"
        assert out["cust_h"].shape == (5, 4) and out["score"].shape[1] == 1
        # grounding left temp tables behind; the user's tables are still all that is listed
        assert db.tables() == USER_TABLES
        assert db.con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'temp'").fetchone()[0] > 0
    finally:
        db.close()


@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "postgres"])
def test_read_only_sources_ground(shop_sources, reference, kind):
    db = relsql.connect(_source(shop_sources, kind), read_only=True)
    try:
        assert db.read_only and "read-only" in db.description
        out, _ = _outputs(db)
        assert torch.equal(out["score"], reference[0]["score"])
        with pytest.raises(SourceError, match="read-only"):
            db.write_table("pred", pa.table({"a": [1]}))
        assert db.tables() == USER_TABLES
    finally:
        db.close()


def test_columns_and_has_table(shop_sources):
    for kind, arg in shop_sources.items():
        db = relsql.connect(arg)
        try:
            assert [c for c, _ in db.columns("orders")] == ["id", "customer_id", "product_id", "qty", "day"], kind
            assert db.has_table("review") and not db.has_table("nope")
            with pytest.raises(SchemaError, match="nope"):
                db.columns("nope")
        finally:
            db.close()


def _snapshot(db, names):
    """Every row of the named tables, in a canonical order."""
    scope = db.scopes()[0]
    tables = {n: db.arrow(exp.select(exp.Star()).from_(qualified(n, scope))) for n in names}
    return {n: t.sort_by([(c, "ascending") for c in t.column_names]) for n, t in tables.items()}


def _file_hashes(path):
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


PRED = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "p": [0.25, 0.5, 0.75], "label": ["a", None, "c"]})


@pytest.mark.parametrize("kind", KINDS)
def test_write_table_atomic_and_refusing(fresh_shop, kind):
    arg = fresh_shop(kind)
    db = relsql.connect(arg)
    try:
        before = _snapshot(db, USER_TABLES)
        hashes = _file_hashes(arg) if kind in ("parquet", "csv") else None
        db.write_table("pred", PRED)
        assert db.has_table("pred") and "pred" in db.tables()
        with pytest.raises(SchemaError, match="already exists"):
            db.write_table("pred", PRED.slice(0, 1))
        assert db.arrow('SELECT * FROM "pred" ORDER BY id').column("p").to_pylist() == [0.25, 0.5, 0.75]
        db.write_table("pred", PRED.slice(0, 2), replace=True)
        assert db.arrow('SELECT count(*) AS n FROM "pred"').column("n").to_pylist() == [2]
        with pytest.raises(SchemaError, match="already exists"):
            db.write_table("customer", PRED)
        assert _snapshot(db, USER_TABLES) == before
    finally:
        db.close()
    if kind == "frames":
        return
    if hashes is not None:  # the other files untouched, byte for byte; no temporary file left
        after = _file_hashes(arg)
        assert {k: v for k, v in after.items() if k != "pred.parquet"} == hashes
        assert sorted(after) == sorted([*hashes, "pred.parquet"])
    again = relsql.connect(arg, read_only=kind in ("duckdb", "sqlite", "postgres"))
    try:  # persisted in the source itself
        assert again.tables() == sorted([*USER_TABLES, "pred"])
        assert again.arrow('SELECT id, p FROM "pred" ORDER BY id').to_pydict() == {"id": [1, 2], "p": [0.25, 0.5]}
        assert _snapshot(again, USER_TABLES) == before
    finally:
        again.close()


class _FailingCommit:
    """A connection that fails at COMMIT: the write must leave nothing behind."""

    def __init__(self, con):
        self._con = con

    def execute(self, query, *args):
        if isinstance(query, str) and query.strip().upper() == "COMMIT":
            raise duckdb.IOException("simulated failure at commit")
        return self._con.execute(query, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "postgres", "frames"])
def test_failed_write_leaves_nothing(fresh_shop, kind):
    db = relsql.connect(fresh_shop(kind))
    real = db.con
    try:
        db.write_table("mine", PRED)  # a table of relsql's: replaceable
        before = _snapshot(db, [*USER_TABLES, "mine"])
        db.con = _FailingCommit(real)
        with pytest.raises(SourceError, match="nothing was written"):
            db.write_table("pred", PRED)
        with pytest.raises(SourceError, match="nothing was written"):
            db.write_table("mine", PRED.slice(0, 1), replace=True)
        with pytest.raises(SchemaError, match="`customer`.*not a plain table"):  # a user's: refused before any write
            db.write_table("customer", PRED, replace=True)
        db.con = real
        assert not db.has_table("pred")
        assert _snapshot(db, [*USER_TABLES, "mine"]) == before
    finally:
        db.con = real
        db.close()


def test_postgres_rejected_rows_roll_back(fresh_shop):
    url = fresh_shop("postgres")
    db = relsql.connect(url)
    try:
        bad = pa.table({"id": [1, 2], "text": ["fine", "nul\x00byte"]})  # PostgreSQL text cannot hold NUL
        with pytest.raises(SourceError, match="nothing was written"):
            db.write_table("bad", bad)
        assert not db.has_table("bad")
    finally:
        db.close()
    again = relsql.connect(url)
    try:
        assert again.tables() == USER_TABLES
    finally:
        again.close()


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_folder_failed_write_leaves_nothing(fresh_shop, kind, monkeypatch):
    import relsql.connectors.files as files

    folder = fresh_shop(kind)
    hashes = _file_hashes(folder)
    db = relsql.connect(folder)

    def broken(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.pq, "write_table", broken)
    try:
        with pytest.raises(SourceError, match="nothing was written"):
            db.write_table("pred", PRED)
        assert not db.has_table("pred")
        assert _file_hashes(folder) == hashes
        if kind == "csv":  # relsql writes Parquet; it never replaces (deletes) a user's CSV file
            with pytest.raises(SchemaError, match="`customer`.*not a plain table"):
                db.write_table("customer", PRED, replace=True)
            assert _file_hashes(folder) == hashes
    finally:
        db.close()


def test_frames_of_every_kind():
    import datetime

    frames = {
        "a": pl.DataFrame({"id": [1, 2, 3], "x": [0.5, 1.5, None]}),
        "b": pa.table({"id": [1, 1, 2], "d": [datetime.date(2024, 1, 1)] * 3}),
        "c": pl.DataFrame({"id": [3]}).lazy(),
        "d": pa.table({"v": [1.0]}).to_batches()[0],
    }
    try:
        import pandas as pd
        frames["e"] = pd.DataFrame({"id": [7, 8]})
    except ImportError:
        pass
    db = relsql.connect(frames)
    try:
        assert db.tables() == sorted(frames)
        catalog = db.catalog()
        assert catalog["a"].rows == 3 and catalog["b"].rows == 3 and catalog["c"].rows == 1
        assert catalog["a"].column("x").type == "DOUBLE" and catalog["b"].column("d").type == "DATE"
        frames["a"] = None  # copied: the frame can change or go away
        assert db.arrow('SELECT sum(x) AS s FROM "a"').column("s").to_pylist() == [2.0]
    finally:
        db.close()
    with pytest.raises(SourceError, match="`bad`.*list"):
        relsql.connect({"bad": [1, 2, 3]})


def test_frames_beside_a_read_only_source(shop_sources, tmp_path):
    path = tmp_path / "copy.duckdb"
    shutil.copy(shop_sources["duckdb"], path)
    before = _file_hashes(path)
    extra = pl.DataFrame({"id": [1, 2], "bonus": [0.5, 2.0]})
    db = relsql.connect(path, read_only=True, tables={"bonus": extra})
    try:
        assert db.tables() == sorted([*USER_TABLES, "bonus"])
        joined = db.arrow('SELECT c.name, b.bonus FROM customer c JOIN bonus b ON b.id = c.id ORDER BY c.id')
        assert joined.to_pydict() == {"name": ["ann", "bob"], "bonus": [0.5, 2.0]}
        assert db.catalog()["bonus"].rows == 2 and db.catalog()["customer"].primary_key == ("id",)
        with pytest.raises(SchemaError, match="customer"):
            relsql.connect(path, read_only=True, tables={"customer": extra})
    finally:
        db.close()
    assert _file_hashes(path) == before  # never written into the user's file
    mem = relsql.connect(tables={"bonus": extra})
    try:
        assert mem.tables() == ["bonus"]
    finally:
        mem.close()


def test_attached_database_is_default_and_temp_tables_work(shop_sources):
    for kind in ("sqlite", "postgres"):
        if kind not in shop_sources:
            continue
        db = relsql.connect(shop_sources[kind], read_only=True)
        try:
            assert db.con.execute("SELECT current_database()").fetchone()[0] == "src"
            db.execute('CREATE TEMPORARY TABLE "temp"."main"."x" AS SELECT id FROM customer')
            assert db.arrow('SELECT count(*) AS n FROM "temp"."main"."x"').column("n").to_pylist() == [6]
            assert "x" not in db.tables()
        finally:
            db.close()


# --- bad input: clear SourceErrors that name the source and the fix


def test_missing_paths(tmp_path):
    for name in ("nope.sqlite", "nope.db", "nope", "nope.parquet"):
        with pytest.raises(SourceError, match="does not exist"):
            relsql.connect(tmp_path / name)
    with pytest.raises(SourceError, match="does not exist"):
        relsql.connect(tmp_path / "nope.duckdb", read_only=True)
    with pytest.raises(SourceError, match="folder .* does not exist"):
        relsql.connect(tmp_path / "no" / "dir" / "new.duckdb")
    assert not (tmp_path / "nope.duckdb").exists()
    created = relsql.connect(tmp_path / "new.duckdb")  # a new DuckDB file is created on purpose
    assert created.tables() == []
    created.close()


@pytest.mark.parametrize("name", ["junk.duckdb", "junk.sqlite", "junk.db", "junk.bin"])
def test_files_that_are_not_databases(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"this is not a database, just some text that goes on for a while\n" * 20)
    with pytest.raises(SourceError, match="not a"):
        relsql.connect(path)


def test_not_a_source():
    with pytest.raises(SourceError, match="cannot connect to a int"):
        relsql.connect(42)


def test_single_data_file_points_at_its_folder(shop_sources):
    with pytest.raises(SourceError, match="connect to its folder"):
        relsql.connect(shop_sources["parquet"] / "orders.parquet")


def test_broken_and_ambiguous_folders(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"PAR1 garbage")
    with pytest.raises(SourceError, match="a.parquet"):
        relsql.connect(tmp_path)
    (tmp_path / "a.parquet").unlink()
    (tmp_path / "a.csv").write_text("x\n1\n")
    (tmp_path / "notes.txt").write_text("ignored")
    db = relsql.connect(tmp_path)
    assert db.tables() == ["a"]
    db.close()
    pa_table = pa.table({"x": [1]})
    import pyarrow.parquet as pq
    pq.write_table(pa_table, tmp_path / "a.parquet")
    with pytest.raises(SourceError, match="two files for table `a`"):
        relsql.connect(tmp_path)


LOCK_HOLDER = textwrap.dedent("""
    import sys, duckdb
    con = duckdb.connect(sys.argv[1])
    con.execute("CREATE TABLE IF NOT EXISTS t AS SELECT 1 AS a")
    print("ready", flush=True)
    sys.stdin.read()
""")


def test_duckdb_file_locked_by_another_process(tmp_path):
    path = tmp_path / "locked.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        for read_only in (False, True):
            with pytest.raises(SourceError, match=rf"locked by process {holder.pid}.*read_only=True") as info:
                relsql.connect(path, read_only=read_only)
            assert str(path) in str(info.value)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    db = relsql.connect(path, read_only=True)  # free again once the other process is gone
    assert db.tables() == ["t"]
    db.close()


def _closed_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_postgres_nothing_listening():
    url = f"postgresql://someone:s3cret@127.0.0.1:{_closed_port()}/db"
    with pytest.raises(SourceError, match="cannot connect to PostgreSQL.*Connection refused.*server running") as info:
        relsql.connect(url)
    assert "s3cret" not in str(info.value) and "someone:***@" in str(info.value)


def test_postgres_bad_role_and_database(pg_server):
    with pytest.raises(SourceError, match='role "nobody" does not exist.*user name and password'):
        relsql.connect(pg_server.url(user="nobody", password="pw"))
    with pytest.raises(SourceError, match='database "missing" does not exist.*database name'):
        relsql.connect(pg_server.url("missing"))


def test_extensions_load_offline():
    path = extensions.extension_file("sqlite_scanner")
    assert path is not None and path.name == "sqlite_scanner.duckdb_extension"
    con = duckdb.connect()
    extensions.load(con, "sqlite_scanner")
    extensions.load(con, "sqlite_scanner")  # idempotent
    assert extensions.is_loaded(con, "sqlite_scanner")
    with pytest.raises(SourceError, match=r"pip install duckdb-extension-no-such-thing==1\."):
        extensions.load(con, "no_such_thing")
    con.close()
