"""Issue 27, keys and Template.auto's columns: a shared key name is no foreign key, given keys
replace inference for their tables and add to declared ones, foreign keys of mismatched types, SQLite values DuckDB cannot
read, INTERVAL columns, and time-zone-aware snapshots. Real DuckDB, SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import hashlib
import sqlite3
import uuid

import numpy as np
import pandas as pd
import polars as pl
import pytest

import relsql
from relsql.data.catalog import ForeignKey
from relsql.data.keys import schema


def _fks(keys) -> set[tuple[str, ForeignKey]]:
    return set(keys.foreign_keys)


def _digest(db: relsql.Database) -> dict[str, str]:
    """Each user table's rows, sorted, hashed: what no case may change."""
    names = [r[0] for r in db.con.execute("SELECT table_name FROM duckdb_tables() "
                                          "WHERE database_name = current_database()").fetchall()]
    return {n: hashlib.sha256(repr(db.con.execute(f'SELECT * FROM "{n}" ORDER BY ALL').fetchall()).encode()).hexdigest()
            for n in names}


# -- 1. a column that is its own table's whole primary key --------------------------------------------------------
def _row_idx_tables(db: relsql.Database, declared: bool) -> None:
    key = " PRIMARY KEY" if declared else ""
    db.execute(f"CREATE TABLE table_0(row_idx BIGINT{key}, x DOUBLE, y BOOLEAN)")
    db.execute(f"CREATE TABLE table_1(row_idx BIGINT{key}, z DOUBLE)")
    db.execute("INSERT INTO table_0 SELECT i, i * 1.5, i % 2 = 0 FROM range(50) t(i)")
    db.execute("INSERT INTO table_1 SELECT i, i * 0.5 FROM range(80) t(i)")  # every table_0.row_idx is found here


def test_declared_primary_keys_sharing_a_name_are_not_linked():
    """Before: `table_0 row_idx FK -> table_1.row_idx (inferred)`, all values found."""
    db = relsql.connect()
    _row_idx_tables(db, declared=True)
    keys = schema(db, db.catalog())
    assert keys.primary_keys["table_0"] == ("row_idx",) and keys.primary_keys["table_1"] == ("row_idx",)
    assert not keys.foreign_keys and not keys.inferred_foreign
    source = relsql.Template.auto(db, "table_0.y").source
    assert "table_1" not in source.split("-- tables used:")[1].splitlines()[0]
    assert "inferred foreign key" not in source
    db.close()


def test_given_primary_keys_sharing_a_name_are_not_linked():
    db = relsql.connect()
    _row_idx_tables(db, declared=False)
    keys = schema(db, db.catalog(), given="PRIMARY KEY table_0(row_idx)\nPRIMARY KEY table_1(row_idx)")
    assert keys.primary_note("table_0") == "given in the keys text line 1"
    assert not keys.foreign_keys
    db.close()


def test_plain_id_primary_keys_are_not_linked():
    db = relsql.connect()
    db.execute("CREATE TABLE a(id INT PRIMARY KEY, v DOUBLE); CREATE TABLE b(id INT PRIMARY KEY, w DOUBLE)")
    db.execute("INSERT INTO a SELECT i, i FROM range(10) t(i); INSERT INTO b SELECT i, i FROM range(20) t(i)")
    assert not schema(db, db.catalog()).foreign_keys
    db.close()


def test_a_one_to_one_extension_is_still_a_foreign_key():
    """label_spend(c_customer_sk) extends customer(c_customer_sk): the key names customer, not label_spend."""
    db = relsql.connect()
    db.execute("CREATE TABLE customer(c_customer_sk BIGINT PRIMARY KEY, c_age DOUBLE, c_city VARCHAR)")
    db.execute("INSERT INTO customer SELECT i, i % 70, 'c' || (i % 5) FROM range(1, 61) t(i)")
    db.execute("CREATE TABLE label_spend(c_customer_sk BIGINT PRIMARY KEY, label BOOLEAN)")
    db.execute("INSERT INTO label_spend SELECT i, i % 3 = 0 FROM range(1, 61) t(i)")
    keys = schema(db, db.catalog())
    assert ("label_spend", ForeignKey(("c_customer_sk",), "customer", ("c_customer_sk",))) in _fks(keys)
    assert ("customer", ForeignKey(("c_customer_sk",), "label_spend", ("c_customer_sk",))) not in _fks(keys)
    db.close()


def test_given_keys_replace_foreign_key_inference_for_their_tables():
    """A table named by a given key takes only its given foreign keys; others still get inferred ones."""
    db = relsql.connect()
    db.execute("""
        CREATE TABLE store AS SELECT range AS s_store_sk, range * 2.0 AS s_size FROM range(1, 11);
        CREATE TABLE sale AS SELECT range AS sale_sk, 1 + range % 10 AS sale_store_sk, range % 7 AS amount FROM range(1, 101);
        CREATE TABLE visit AS SELECT range AS visit_sk, 1 + range % 10 AS visit_store_sk FROM range(1, 51);
    """)
    inferred = _fks(schema(db, db.catalog()))
    assert ("sale", ForeignKey(("sale_store_sk",), "store", ("s_store_sk",))) in inferred  # inference finds it alone
    keys = schema(db, db.catalog(), given="PRIMARY KEY sale(sale_sk)")
    assert not [fk for child, fk in keys.foreign_keys if child == "sale"]  # before: sale_store_sk was still inferred
    assert ("visit", ForeignKey(("visit_store_sk",), "store", ("s_store_sk",))) in _fks(keys)
    db.close()


def test_given_foreign_keys_add_to_declared_ones_and_replace_only_those_over_the_same_columns(tmp_path):
    """A keys file that adds what the catalog cannot hold (a self-reference) keeps the table's
    declared key to its parent; before, it dropped it (hostile databases lost item -> grp)."""
    path = tmp_path / "shop.duckdb"
    db = relsql.connect(str(path))
    db.execute("""
        CREATE TABLE grp(grp_id BIGINT PRIMARY KEY, rate DOUBLE);
        CREATE TABLE shelf(shelf_id BIGINT PRIMARY KEY, width DOUBLE);
        CREATE TABLE item(item_id BIGINT PRIMARY KEY, grp_id BIGINT REFERENCES grp(grp_id), parent_id BIGINT, y BOOLEAN);
        INSERT INTO grp SELECT range, range * 0.5 FROM range(5);
        INSERT INTO shelf SELECT range, range * 2.0 FROM range(5);
        INSERT INTO item SELECT range, range % 5, CASE WHEN range > 0 THEN range - 1 END, range % 2 = 0 FROM range(40);
    """)
    before = _digest(db)
    declared = ("item", ForeignKey(("grp_id",), "grp", ("grp_id",)))
    self_ref = ("item", ForeignKey(("parent_id",), "item", ("item_id",)))
    added = _fks(schema(db, db.catalog(), given="FOREIGN KEY item(parent_id) REFERENCES item(item_id)"))
    assert declared in added and self_ref in added
    moved = _fks(schema(db, db.catalog(), given="FOREIGN KEY item(grp_id) REFERENCES shelf(shelf_id)"))
    assert ("item", ForeignKey(("grp_id",), "shelf", ("shelf_id",))) in moved and declared not in moved
    template = relsql.Template.auto(db, "item.y", keys="FOREIGN KEY item(parent_id) REFERENCES item(item_id)")
    assert "\"grp\"" in template.source and "\"rate\"" in template.source  # the declared parent's column is read
    assert _digest(db) == before
    db.close()


# -- 2. foreign keys whose types do not match; keys="\x00" ----------------------------------------------------------
def test_composite_foreign_key_of_mismatched_types_is_named_before_any_query():
    """Before: duckdb.ConversionException from Template.auto's first join."""
    db = relsql.connect()
    db.execute("CREATE TABLE parent AS SELECT range AS a, range % 4 AS b, range * 1.0 AS v, range % 2 = 0 AS y FROM range(40)")
    db.execute("CREATE TABLE child AS SELECT range AS cid, range % 40 AS a, 'x' || (range % 4) AS b, range * 2.0 AS w "
               "FROM range(100)")
    before = _digest(db)
    keys = "PRIMARY KEY parent(a, b)\nPRIMARY KEY child(cid)\nFOREIGN KEY child(a, b) REFERENCES parent(a, b)"
    message = (r"foreign key child\(a, b\) -> parent\(a, b\) \(given in the keys text line 3\): column types do not "
               r"match \(child\.b is VARCHAR, parent\.b is BIGINT\)")
    with pytest.raises(relsql.SchemaError, match=message):
        relsql.Template.auto(db, "parent.y", keys=keys)
    with pytest.raises(relsql.SchemaError, match=message):
        schema(db, db.catalog(), infer=False, given=keys)
    assert _digest(db) == before
    db.close()


def test_keys_with_a_nul_is_a_relsql_error():
    db = relsql.connect()
    db.execute("CREATE TABLE t AS SELECT range AS t_sk FROM range(3)")
    with pytest.raises(relsql.RelsqlError):
        relsql.connect(keys="\x00")
    with pytest.raises(relsql.RelsqlError):
        schema(db, db.catalog(), given="\x00")
    db.close()


# -- 3. SQLite: text in an INTEGER column --------------------------------------------------------------------------
def test_sqlite_text_in_an_integer_column_names_the_column(tmp_path):
    """Before: duckdb.TypeMismatchException from Template.auto."""
    path = tmp_path / "shop.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, age INTEGER, churned INTEGER)")
    con.executemany("INSERT INTO customer VALUES (?, ?, ?)",
                    [(i, (i * 7) % 60 if i != 5 else "unknown", i % 2) for i in range(40)])
    con.commit()
    con.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    db = relsql.connect(path)
    with pytest.raises(relsql.SourceError, match=r"column customer\.age \(declared BIGINT\) holds values DuckDB cannot read"):
        relsql.Template.auto(db, "customer.churned")
    db.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


# -- 4. INTERVAL columns --------------------------------------------------------------------------------------------
def _trains(db: relsql.Database, target: str) -> relsql.Template:
    template = relsql.Template.auto(db, target)
    model = relsql.Model(db, template, target=target, seed=0, progress=False).fit(epochs=1)
    assert np.isfinite(model.evaluate()["loss"])
    return template


def test_duckdb_interval_column_is_encoded_as_seconds():
    """Before: features(t."tenure") ... got month_day_nano_interval, for the template auto wrote."""
    db = relsql.connect()
    db.execute("CREATE TABLE customer AS SELECT range AS customer_id, range % 2 = 0 AS churned, "
               "to_seconds(range * 37) AS tenure, range * 1.5 AS age FROM range(40)")
    before = _digest(db)
    source = _trains(db, "customer.churned").source
    assert 'EPOCH("tenure") AS "tenure"' in source and 't."tenure"' in source
    assert _digest(db) == before
    db.close()


def test_polars_duration_and_pandas_timedelta_frames_are_encoded():
    customer = pl.DataFrame({"customer_id": list(range(30)), "churned": [i % 2 == 0 for i in range(30)],
                             "wait": [dt.timedelta(seconds=i * 100) for i in range(30)]})
    orders = pd.DataFrame({"order_id": range(60), "customer_id": [i % 30 for i in range(60)],
                           "gap": pd.to_timedelta([i * 3 for i in range(60)], unit="h")})
    db = relsql.connect({"customer": customer, "orders": orders})
    assert db.catalog()["customer"].column("wait").type == "INTERVAL"
    source = _trains(db, "customer.churned").source
    assert 'EPOCH("wait")' in source and 'EPOCH("gap")' in source  # the events' durations too
    db.close()


def test_postgres_interval_column_is_encoded(pg_server):
    name = f"iv_{uuid.uuid4().hex[:10]}"
    url = pg_server.createdb(name)
    pg_server.psql(name, "CREATE TABLE customer (customer_id INTEGER PRIMARY KEY, churned BOOLEAN, tenure INTERVAL, "
                         "age DOUBLE PRECISION);\nINSERT INTO customer SELECT i, i % 2 = 0, make_interval(days => i, "
                         "hours => i % 5), i * 1.5 FROM generate_series(1, 40) i;")
    db = relsql.connect(url, read_only=True)
    before = _digest_pg(db)
    assert 'EPOCH("tenure")' in _trains(db, "customer.churned").source
    assert _digest_pg(db) == before
    db.close()


def _digest_pg(db: relsql.Database) -> str:
    return hashlib.sha256(repr(db.arrow("SELECT * FROM customer ORDER BY customer_id").to_pylist()).encode()).hexdigest()


# -- 5. time-zone-aware snapshots ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["'2020-01-01 12:00:00+05:00'", "'2020-01-01T12:00Z'"])
def test_a_snapshot_with_a_time_zone_is_refused_with_the_fix(text):
    """Before: TypeError (an aware snapshot compared with the naive data)."""
    with pytest.raises(relsql.RelsqlError, match=r"has a time zone, but the events' times hold none; write it in the "
                                                 r"data's own clock without an offset, e.g. '2020-01-01 12:00:00'"):
        relsql.PredictiveQuery.parse(f"COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT {text}")


def test_aware_datetimes_are_refused_in_the_python_api():
    aware = dt.datetime(2020, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    with pytest.raises(relsql.RelsqlError, match=r"snapshots\[1\] 2020-01-01 12:00:00\+05:00 has a time zone"):
        relsql.PredictiveQuery("customer", "orders", 30, snapshots=[dt.date(2020, 1, 1), aware])
    with pytest.raises(relsql.RelsqlError, match=r"start 2020-01-01 12:00:00\+05:00 has a time zone"):
        relsql.PredictiveQuery("customer", "orders", 30, every_days=7, start=aware)
    naive = relsql.PredictiveQuery.parse("COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT '2020-01-01 12:00:00'")
    assert naive.snapshots == (dt.datetime(2020, 1, 1, 12),)


def test_deeply_nested_parentheses_in_a_keys_file_are_a_schema_error(tmp_path):
    """Found by tests/test_fuzz_inputs.py: RecursionError from sqlglot's parser (a long line of `(`)."""
    path = tmp_path / "keys.sql"
    path.write_text("PRIMARY KEY customer(customer_id)\nPRIMARY KEY orders(order_id) " + "(" * 5000 + "\n")
    with pytest.raises(relsql.SchemaError, match=r"keys\.sql line 2: parentheses nested more than 16 deep"):
        relsql.connect(keys=path)
