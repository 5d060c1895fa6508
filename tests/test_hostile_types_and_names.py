"""Issue #41 item 1, hostile but valid schemas: column types whose names hold a number's name
(STRUCT(a INTEGER), MAP(VARCHAR, INTEGER), UNION, INTEGER[3]) are no numbers; DECIMAL, HUGEINT,
UBIGINT, ENUM, UUID, INTERVAL, TIME, BLOB and TIMESTAMPTZ columns and names with spaces, quotes,
accents, keywords and a file-like dot (`grp.x`) go through Template.auto, fit, predict, save/load
and write_predictions on a real DuckDB file; a template still may not read a file by a table name
the database lacks."""

from __future__ import annotations

import hashlib

import duckdb
import numpy as np
import pytest

import relsql
from relsql.data.coltypes import is_integer, is_nested, is_number
from relsql.errors import TemplateError


def _typed_database(path: str) -> None:
    con = duckdb.connect(path)
    rng = np.random.default_rng(0)
    con.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    con.execute('CREATE TABLE "Shop Group" ("Group ID" UUID PRIMARY KEY, "select" DECIMAL(12,2), kind mood, "naïve" VARCHAR)')
    groups = [f"00000000-0000-0000-0000-{i:012d}" for i in range(20)]
    con.executemany('INSERT INTO "Shop Group" VALUES (?, ?, ?, ?)',
                    [[g, float(rng.normal() * 100), ["sad", "ok", "happy"][i % 3], "ab"[i % 2]] for i, g in enumerate(groups)])
    con.execute('CREATE TABLE "order" (id HUGEINT PRIMARY KEY, "Group ID" UUID REFERENCES "Shop Group"("Group ID"), '
                "amount DECIMAL(18,4), qty UBIGINT, flag BOOLEAN, t TIME, iv INTERVAL, blobby BLOB, "
                "s STRUCT(a INTEGER, b VARCHAR), m MAP(VARCHAR, INTEGER), u UNION(n INTEGER, w VARCHAR), "
                "fixed INTEGER[3], ts TIMESTAMPTZ, small TINYINT, label BOOLEAN)")
    for i in range(300):
        amount = float(rng.normal() * 50)
        con.execute('INSERT INTO "order" VALUES (?, ?, ?, ?, ?, ?, ?, ?, {a: ?, b: ?}, MAP {\'k\': ?}, ?, [?, ?, ?], '
                    "?, ?, ?)",
                    [i, groups[i % 20], amount, int(rng.integers(0, 10)), bool(i % 2), "12:00:00", f"{i % 7} days",
                     b"\x00\x01", i, "x", i % 5, i, i, i + 1, i + 2, "2020-01-01 00:00:00+00", i % 100,
                     amount + (i % 20) * 3 > 20])
    con.close()


def _digest(path: str) -> str:
    con = duckdb.connect(path, read_only=True)
    tables = sorted(r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall())
    text = repr([(t, con.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall()) for t in tables])
    con.close()
    return hashlib.sha256(text.encode()).hexdigest()


def test_duckdb_type_names_are_read_by_their_head(tmp_path):
    """The type names DuckDB's catalog gives: a struct, map, union or fixed array holding an
    INTEGER is no number; DECIMAL, HUGEINT and UBIGINT are, INTERVAL is not."""
    path = str(tmp_path / "t.duckdb")
    _typed_database(path)
    con = duckdb.connect(path, read_only=True)
    types = dict(con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'order'").fetchall())
    con.close()
    assert "INTEGER" in types["s"] and "INTEGER" in types["m"] and "INTEGER" in types["u"]  # what fooled substring tests
    assert [c for c in types if is_number(types[c])] == ["id", "amount", "qty", "small"]
    assert [c for c in types if is_integer(types[c])] == ["id", "qty", "small"]
    assert {c for c in types if is_nested(types[c])} == {"s", "m", "u", "fixed"}


def test_struct_map_union_and_other_types_train_predict_and_reload(tmp_path):
    path = str(tmp_path / "typed.duckdb")
    _typed_database(path)
    before = _digest(path)
    db = relsql.connect(path)
    template = relsql.Template.auto(db, target="order.label")
    skipped = next(line for line in template.source.splitlines() if line.startswith("-- skipped columns"))
    assert {"s", "m", "u", "fixed", "blobby", "t"} <= {c.strip() for c in skipped.split(":", 1)[1].split(",")}
    encoder = template.source.split("CREATE TABLE enc_order AS", 1)[1].split(";", 1)[0]
    assert 'ple(t."amount"' in encoder and 't."s"' not in encoder.split("FROM", 1)[0]  # DECIMAL read, the struct not
    assert "embed(t.\"kind\"" in template.source  # the ENUM is a code
    model = relsql.Model(db, template, target="order.label", seed=0, progress=False)
    model.fit(epochs=3)
    predicted = model.predict()
    assert predicted.height == 300 and predicted["probability"].is_between(0, 1).all()
    saved = model.save(tmp_path / "m.pt")
    again = relsql.Model.load(saved, db).predict()
    assert np.allclose(again["probability"].to_numpy(), predicted["probability"].to_numpy(), atol=1e-6)
    assert model.write_predictions("order_predictions") == 300
    db.close()
    con = duckdb.connect(path, read_only=True)
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    con.close()
    assert tables == {"Shop Group", "order", "order_predictions"}
    assert _digest(path) != before  # the predictions table is new ...
    con = duckdb.connect(path)
    con.execute('DROP TABLE "order_predictions"')
    con.close()
    assert _digest(path) == before  # ... and nothing else changed


def _named_database(path: str) -> None:
    """A parent table named like a file (`grp.x`) keyed by a column named h (every template
    relation's value column), columns named like the template's own aliases and columns (h,
    r_id, e, age, unknown, time, n_h) and a quote in a column name."""
    con = duckdb.connect(path)
    rng = np.random.default_rng(1)
    con.execute('CREATE TABLE "grp.x" (h VARCHAR PRIMARY KEY, "we""ird" DOUBLE, age INTEGER, n_h DOUBLE)')
    con.executemany('INSERT INTO "grp.x" VALUES (?, ?, ?, ?)',
                    [[f"g{i}é", float(rng.normal()), i % 4, float(i)] for i in range(15)])
    con.execute('CREATE TABLE item (r_id INTEGER PRIMARY KEY, h VARCHAR REFERENCES "grp.x"(h), e DOUBLE, label DOUBLE, '
                '"time" DATE, unknown DOUBLE)')
    con.executemany("INSERT INTO item VALUES (?, ?, ?, ?, ?, ?)",
                    [[i, f"g{i % 15}é", e, e + (i % 15) / 3, f"2020-01-{1 + i % 28:02d}", float(rng.normal())]
                     for i, e in enumerate(rng.normal(size=400))])
    con.execute('CREATE TABLE ev (ev_id INTEGER PRIMARY KEY, r_id INTEGER REFERENCES item(r_id), amount DOUBLE, '
                '"time" DATE)')
    con.executemany("INSERT INTO ev VALUES (?, ?, ?, ?)",
                    [[k, i, float(rng.normal()), f"2019-12-{1 + k % 28:02d}"] for k, i in enumerate(range(0, 400, 2))])
    con.close()


def _auto(tmp_path, make, target: str, time_column: str | None):
    """A database written by `make` into tmp_path, connected; the time option; Template.auto's template."""
    path = str(tmp_path / "db.duckdb")
    make(path)
    db = relsql.connect(path)
    options = {"time_column": time_column} if time_column else {}
    return db, options, relsql.Template.auto(db, target=target, **options)


@pytest.mark.parametrize("time_column", [None, "time"])
def test_a_table_named_like_a_file_and_columns_named_like_the_templates_own(tmp_path, time_column):
    db, options, template = _auto(tmp_path, _named_database, "item.label", time_column)
    assert 'JOIN "grp.x" ' in template.source  # quoted where it is read
    assert 'SELECT t."h" AS "h_key", ' in template.source  # the parent's key, renamed in its encoder only
    model = relsql.Model(db, template, target="item.label", seed=0, progress=False, **options)
    model.fit(epochs=3)
    assert model.predict().height == 400
    assert relsql.Model.load(model.save(tmp_path / "n.pt"), db).predict().height == 400


def test_a_file_named_as_a_table_the_database_lacks_is_never_read(tmp_path, monkeypatch):
    """`FROM "data.parquet"` parses (a table may have that name) but grounding refuses it before any
    statement runs where the database has no such table, though the file lies in the working folder."""
    monkeypatch.chdir(tmp_path)
    duckdb.connect().execute("COPY (SELECT 1 AS id, 2.0 AS x) TO 'data.parquet' (FORMAT parquet)")
    path = str(tmp_path / "db.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, x DOUBLE, label DOUBLE)")
    con.execute("INSERT INTO item SELECT i, i, i % 2 FROM range(20) t(i)")
    con.close()
    template = relsql.Template.from_sql(
        'CREATE TABLE predict AS SELECT i.id, linear(features(i.x, d.x), 1) AS h '
        'FROM item i JOIN "data.parquet" d ON d.id = i.id;')
    db = relsql.connect(path)
    with pytest.raises(TemplateError) as err:
        relsql.Model(db, template, target="item.label", progress=False)
    assert "`data.parquet`" in str(err.value) and "only read the database's tables" in str(err.value)
    db.close()
    con = duckdb.connect(path)  # with a table of that name, the same template reads the table, not the file
    con.execute('CREATE TABLE "data.parquet" AS SELECT i AS id, 10.0 * i AS x FROM range(20) t(i)')
    con.close()
    db = relsql.connect(path)
    model = relsql.Model(db, template, target="item.label", progress=False)
    model.fit(epochs=2)
    assert model.predict().height == 20


def test_a_target_keyed_by_a_column_named_h_is_refused_with_the_way_round(tmp_path):
    """Predictions are keyed by the target's key names and h is every relation's value column:
    no template can have both, so Template.auto says so and how to predict anyway."""
    path = str(tmp_path / "h.duckdb")
    con = duckdb.connect(path)
    con.execute('CREATE TABLE item ("H" INTEGER PRIMARY KEY, x DOUBLE, label DOUBLE)')
    con.execute("INSERT INTO item SELECT i, i, i % 2 FROM range(30) t(i)")
    con.close()
    db = relsql.connect(path)
    with pytest.raises(relsql.RelsqlError) as err:
        relsql.Template.auto(db, target="item.label")
    text = str(err.value)
    assert "`H`" in text and "CREATE VIEW item_v AS SELECT \"H\" AS item_key" in text and "keys file" in text


def _nonfinite_database(path: str) -> None:
    """NaN and infinities in DOUBLE columns of every table, ±infinity in DATE and TIMESTAMP
    columns (the time column too), NaN on some regression labels."""
    con = duckdb.connect(path)
    rng = np.random.default_rng(2)
    con.execute("CREATE TABLE grp (grp_id INTEGER PRIMARY KEY, r DOUBLE, born DATE)")
    con.executemany("INSERT INTO grp VALUES (?, ?, ?)",
                    [[i, [float("nan"), float("inf"), -float("inf"), 1.0][i % 4],
                      ["infinity", "-infinity", "2020-01-01", None][i % 4]] for i in range(12)])
    con.execute("CREATE TABLE item (item_id INTEGER PRIMARY KEY, grp_id INTEGER REFERENCES grp(grp_id), x DOUBLE, "
                "t TIMESTAMP, y DOUBLE)")
    rows = []
    for i in range(300):
        x = float(rng.normal())
        y = x + (i % 12) * 0.5 if i % 11 else float("nan")
        rows.append([i, i % 12, [x, float("nan"), float("inf"), -float("inf")][i % 4 if i % 5 == 0 else 0],
                     ["infinity", "2020-01-02 10:00:00", "2021-03-04 00:00:00", "-infinity"][i % 4], y])
    con.executemany("INSERT INTO item VALUES (?, ?, ?, ?, ?)", rows)
    con.execute('CREATE TABLE ev (ev_id INTEGER PRIMARY KEY, item_id INTEGER REFERENCES item(item_id), a DOUBLE, "at" TIMESTAMP)')
    con.executemany("INSERT INTO ev VALUES (?, ?, ?, ?)",
                    [[k, k % 300, [float("nan"), k / 10, float("inf")][k % 3], ["infinity", "2019-01-01 00:00:00"][k % 2]]
                     for k in range(900)])
    con.close()


@pytest.mark.parametrize("time_column", [None, "t"])
def test_nan_and_infinite_values_are_missing_inputs_and_nan_labels_are_unlabelled(tmp_path, time_column):
    db, options, template = _auto(tmp_path, _nonfinite_database, "item.y", time_column)
    said = [line for line in template.source.splitlines() if line.startswith("-- numbers holding NaN")]
    assert sorted(s.rsplit(": ", 1)[1] for s in said) == ["a", "r", "x"], said  # one line per table
    model = relsql.Model(db, template, target="item.y", seed=0, progress=False, **options)
    assert len(model.learner.labelled) == 300 - len(range(0, 300, 11))  # the 28 NaN labels are no labels
    model.fit(epochs=5)
    scores = model.evaluate()
    assert np.isfinite(scores["rmse"]) and np.isfinite(model.predict()["prediction"].to_numpy()).all()
    linear = next(line for line in model.report().splitlines() if "a linear model of item's own columns" in line)
    assert "nan" not in linear.split(" on test: ", 1)[1], linear  # its inputs' NaN and infinities are missing too


def _reserved_key_database(path: str, key: str) -> None:
    """grp keyed by `key`, item referencing it, a child with columns named like relsql's own (_rule,
    _rid, code); the label reads the group's and the item's columns."""
    con = duckdb.connect(path)
    rng = np.random.default_rng(3)
    con.execute(f'CREATE TABLE grp ("{key}" INTEGER PRIMARY KEY, r DOUBLE, code VARCHAR)')
    con.executemany("INSERT INTO grp VALUES (?, ?, ?)", [[i, float(rng.normal()), "ab"[i % 2]] for i in range(12)])
    con.execute(f'CREATE TABLE item (item_id INTEGER PRIMARY KEY, g INTEGER REFERENCES grp("{key}"), x DOUBLE, y DOUBLE)')
    con.executemany("INSERT INTO item VALUES (?, ?, ?, ?)",
                    [[i, i % 12, x, x + (i % 12) / 4] for i, x in enumerate(rng.normal(size=240))])
    con.execute("CREATE TABLE ev (ev_id INTEGER PRIMARY KEY, item_id INTEGER REFERENCES item(item_id), "
                "_rule DOUBLE, _rid INTEGER)")
    con.executemany("INSERT INTO ev VALUES (?, ?, ?, ?)", [[k, k % 240, float(rng.normal()), k % 3] for k in range(480)])
    con.close()


def test_a_parent_keyed_by_a_name_of_relsqls_own_is_renamed_and_predicts_as_any_name_does(tmp_path):
    """A parent keyed by `_rid` (a name the grounding queries use) is renamed in its encoder, as h is:
    the model predicts what the same database with the key named `gid` predicts, bit for bit."""
    predictions = {}
    for key in ("_rid", "gid"):
        folder = tmp_path / key
        folder.mkdir()
        db, options, template = _auto(folder, lambda p, k=key: _reserved_key_database(p, k), "item.y", None)
        if key == "_rid":
            assert 'SELECT t."_rid" AS "rid_key", ' in template.source
        model = relsql.Model(db, template, target="item.y", seed=0, progress=False)
        model.fit(epochs=4)
        predictions[key] = model.predict()
        assert relsql.Model.load(model.save(folder / "m.pt"), db).predict().equals(predictions[key])
    assert predictions["_rid"].height == 240 and predictions["_rid"].equals(predictions["gid"])


def test_a_target_keyed_by_a_name_of_relsqls_own_is_refused_with_the_way_round(tmp_path):
    path = str(tmp_path / "r.duckdb")
    con = duckdb.connect(path)
    con.execute('CREATE TABLE item ("_rule" INTEGER PRIMARY KEY, x DOUBLE, label DOUBLE)')
    con.execute("INSERT INTO item SELECT i, i, i % 2 FROM range(30) t(i)")
    con.close()
    with pytest.raises(relsql.RelsqlError) as err:
        relsql.Template.auto(relsql.connect(path), target="item.label")
    text = str(err.value)
    assert "`_rule`" in text and "relsql's grounding queries use" in text and 'SELECT "_rule" AS item_key' in text


def test_a_target_in_another_schema_is_named_with_the_way_to_read_it(tmp_path):
    """Tables in a schema other than the connection's are not read: the error says where the table
    is and how to read it, and doing so trains and predicts."""
    path = str(tmp_path / "s.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE SCHEMA shop")
    con.execute("CREATE TABLE shop.customer (customer_id INTEGER PRIMARY KEY, age DOUBLE, label BOOLEAN)")
    con.execute("CREATE TABLE shop.orders (order_id INTEGER PRIMARY KEY, "
                "customer_id INTEGER REFERENCES shop.customer(customer_id), amount DOUBLE)")
    con.execute("INSERT INTO shop.customer SELECT i, i % 7, i % 3 = 0 FROM range(90) t(i)")
    con.execute("INSERT INTO shop.orders SELECT i, i % 90, i % 11 FROM range(270) t(i)")
    con.close()
    with pytest.raises(relsql.RelsqlError) as err:
        relsql.Template.auto(relsql.connect(path), target="customer.label")
    assert "schema `shop` of catalog `s`" in str(err.value) and 'USE "s"."shop"' in str(err.value)
    con = duckdb.connect(path)
    con.execute('USE "s"."shop"')
    db = relsql.connect(con)
    model = relsql.Model(db, relsql.Template.auto(db, target="customer.label"), target="customer.label", progress=False)
    model.fit(epochs=2)
    assert model.predict().height == 90


def _shop(path: str, target: str, child: str) -> None:
    con = duckdb.connect(path)
    rng = np.random.default_rng(4)
    con.execute(f'CREATE TABLE "{target}" (customer_id INTEGER PRIMARY KEY, age DOUBLE, label DOUBLE)')
    con.execute(f'CREATE TABLE "{child}" (e_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES "{target}"(customer_id), '
                "v DOUBLE)")
    ages, values = rng.normal(size=150), rng.normal(size=450)
    con.executemany(f'INSERT INTO "{target}" VALUES (?, ?, ?)',
                    [[i, float(a), float(a + values[i::150].mean())] for i, a in enumerate(ages)])
    con.executemany(f'INSERT INTO "{child}" VALUES (?, ?, ?)', [[k, k % 150, float(v)] for k, v in enumerate(values)])
    con.close()


def test_tables_named_like_the_relations_template_auto_writes(tmp_path):
    """A target table named `predict` with a child `enc_predict` (names Template.auto gives its output
    and the child's encoder): its relations are renamed clear of the tables, which a relation of the
    same name would shadow, and the model predicts what the same data under other names does."""
    predictions = {}
    for target, child in (("predict", "enc_predict"), ("cust", "orders_c")):
        folder = tmp_path / target
        folder.mkdir()
        db, _, template = _auto(folder, lambda p, t=target, c=child: _shop(p, t, c), f"{target}.label", None)
        tables = {t.casefold() for t in db.catalog().names}
        assert not tables & {r.casefold() for r in template.relations}
        if target == "predict":
            assert "CREATE TABLE predict_rel AS" in template.source and "CREATE TABLE enc_predict_rel AS" in template.source
        model = relsql.Model(db, template, target=f"{target}.label", seed=0, progress=False)
        model.fit(epochs=4)
        predictions[target] = model.predict()
        assert relsql.Model.load(model.save(folder / "m.pt"), db).predict().equals(predictions[target])
    assert predictions["predict"].height == 150 and predictions["predict"]["prediction"].equals(
        predictions["cust"]["prediction"])
