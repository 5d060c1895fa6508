"""relsql on duckdb 1.5.5 and 2.x: the dependency allows both, extensions load only where a source
needs one (from the extra `relsql[sources]`, which exists for 1.5.5 only), and a file in a storage
format this duckdb cannot read says which DuckDB wrote it. scripts/test runs this file, with the
core tests, in a second environment on duckdb 2.0.1."""

from __future__ import annotations

import re
import sqlite3
import struct
import tomllib
from pathlib import Path

import duckdb
import numpy as np
import pytest

import relsql
from relsql.connectors import extensions
from relsql.errors import SourceError

ROOT = Path(__file__).resolve().parent.parent
MAJOR = int(duckdb.__version__.split(".")[0])
BUILT_IN = {"core_functions", "icu", "json", "parquet"}  # statically linked into duckdb's wheel, both majors


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def header_checksum(block: bytes) -> int:
    """DuckDB's block checksum: 5381 xor each little-endian uint64 word times 0xbf58476d1ce4e5b9."""
    words = np.frombuffer(block, dtype="<u8")
    with np.errstate(over="ignore"):
        return int(np.bitwise_xor.reduce(words * np.uint64(0xBF58476D1CE4E5B9))) ^ 5381


def file_from(path: Path, storage: int, library: str) -> Path:
    """A real DuckDB file whose main header says `storage` version, written by DuckDB `library`
    (what a newer DuckDB writes), with its checksum fixed so DuckDB reaches the version check."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (a INTEGER PRIMARY KEY)")
    con.close()
    data = bytearray(path.read_bytes())
    assert header_checksum(bytes(data[8:4096])) == struct.unpack_from("<Q", data, 0)[0]  # the layout assumed
    struct.pack_into("<Q", data, 12, storage)
    data[52:84] = library.encode().ljust(32, b"\0")
    struct.pack_into("<Q", data, 0, header_checksum(bytes(data[8:4096])))
    path.write_bytes(data)
    return path


def test_dependency_allows_both_majors_and_the_extra_pins_the_wheels():
    project = pyproject()["project"]
    core = [dep for dep in project["dependencies"] if re.match(r"duckdb\b", dep)]
    assert core == ["duckdb>=1.5.5,<3"]
    assert not [dep for dep in project["dependencies"] if dep.startswith("duckdb-extension")]
    sources = project["optional-dependencies"]["sources"]
    expected = {f"duckdb=={extensions.WHEEL_VERSION}"}
    expected |= {f"{extensions.wheel_name(name)}=={extensions.WHEEL_VERSION}" for name in extensions.SOURCES_EXTRA}
    assert set(sources) == expected


def test_file_from_a_newer_duckdb_names_the_writer_and_the_way_out(tmp_path):
    path = file_from(tmp_path / "newer.duckdb", 4242, "v9.9.9")
    for read_only in (True, False):
        with pytest.raises(SourceError) as caught:
            relsql.connect(path, read_only=read_only)
        text = str(caught.value)
        assert f"{path} was written by a newer DuckDB (v9.9.9, storage version 4242)" in text
        assert f"duckdb {duckdb.__version__} cannot read" in text
        assert f"STORAGE_VERSION 'v{duckdb.__version__}'" in text
        assert "version number 4242" not in text  # DuckDB's own wording stays out
    assert path.read_bytes()[8:12] == b"DUCK"


@pytest.mark.skipif(MAJOR != 1, reason="the advice to upgrade is for duckdb 1.x")
def test_duckdb_1_is_told_to_upgrade_for_a_duckdb_2_file(tmp_path):
    path = file_from(tmp_path / "two.duckdb", 999, "v2.0.1")  # what duckdb 2.0.1 writes
    with pytest.raises(SourceError, match=r"newer DuckDB \(v2\.0\.1, storage version 999\).*pip install 'duckdb>=2,<3'"):
        relsql.connect(path, read_only=True)


def test_core_sources_load_no_extension(tmp_path):
    """A DuckDB file, a Parquet folder and frames train the automatic template without loading any extension."""
    file = tmp_path / "shop.duckdb"
    con = duckdb.connect(str(file))
    con.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, age DOUBLE, churned BOOLEAN)")
    con.execute("INSERT INTO customer SELECT i, i % 7, i % 3 = 0 FROM range(60) t(i)")
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer (id), amount DOUBLE)")
    con.execute("INSERT INTO orders SELECT i, i % 60, i * 0.5 FROM range(180) t(i)")
    folder = tmp_path / "parquet"
    folder.mkdir()
    frames = {}
    for table in ("customer", "orders"):
        con.execute(f"COPY {table} TO '{folder / (table + '.parquet')}' (FORMAT parquet)")
        frames[table] = con.sql(f"SELECT * FROM {table}").to_arrow_table()
    con.close()
    for source in (file, folder, frames):
        db = relsql.connect(source)
        template = relsql.Template.auto(db, "customer.churned")
        assert "orders" in template.source  # the child table is reached: a relational model, not a flat one
        relsql.Model(db, template, target="customer.churned", seed=0).fit(epochs=2)
        loaded = {row[0] for row in db.con.execute("SELECT extension_name FROM duckdb_extensions() WHERE loaded").fetchall()}
        assert loaded <= BUILT_IN, (source, loaded - BUILT_IN)
        db.close()


def test_missing_source_extension_names_the_extra():
    on_wheels = extensions.missing_message("sqlite_scanner", "read SQLite file x.sqlite", extensions.WHEEL_VERSION)
    assert "`sqlite_scanner` extension to read SQLite file x.sqlite" in on_wheels
    assert "pip install 'relsql[sources]'" in on_wheels
    newer = extensions.missing_message("postgres_scanner", "read PostgreSQL postgresql://h/db", "2.0.1")
    assert "exists for duckdb 1.5.5 only and this is duckdb 2.0.1" in newer
    assert "pip install 'relsql[sources]'` installs duckdb 1.5.5" in newer
    other = extensions.missing_message("spatial", "", "2.0.1")
    assert "relsql[sources]" not in other and "pip install duckdb-extension-spatial==2.0.1" in other


@pytest.mark.skipif(MAJOR == 1, reason="duckdb 1.5.5 has the sqlite wheel in the test environment")
def test_sqlite_source_on_duckdb_2_without_the_wheel_says_what_is_missing(tmp_path):
    path = tmp_path / "shop.sqlite"
    with sqlite3.connect(path) as lite:
        lite.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY)")
    if extensions.extension_file("sqlite_scanner") is not None:
        pytest.skip("a sqlite_scanner wheel for this duckdb is installed")
    with pytest.raises(SourceError, match=r"`sqlite_scanner` extension to read SQLite file .*relsql\[sources\]"):
        relsql.connect(path)


@pytest.mark.skipif(MAJOR == 1, reason="duckdb 1.5 lets relsql read the scope beside an unread result")
def test_a_connection_with_an_unread_result_on_duckdb_2(tmp_path):
    """duckdb 2 runs nothing on a connection whose execute() result is unread. With one schema in the
    database its scope is known without asking it; with more, relsql says what to do. The user's
    unread rows stay theirs either way."""
    con = duckdb.connect()
    con.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY)")
    pending = con.execute("SELECT * FROM range(5)")
    assert pending.fetchone() == (0,)
    with relsql.connect(con) as db:
        assert db.tables() == ["customer"]
    assert con.fetchone() == (1,)
    con.execute(f"ATTACH '{tmp_path / 'other.duckdb'}' AS other")
    con.execute("CREATE TABLE other.orders (id INTEGER)")
    con.execute("USE other")
    pending = con.execute("SELECT * FROM range(5)")
    assert pending.fetchone() == (0,)
    with pytest.raises(SourceError, match=r"unread result from execute\(\).*fetchall\(\).*con\.abort\(\)"):
        relsql.connect(con)
    assert con.fetchall() == [(1,), (2,), (3,), (4,)]
    con.close()
