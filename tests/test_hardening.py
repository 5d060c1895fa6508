"""Bad input at the API boundary: each case raises a RelsqlError naming the argument and the fix,
nothing reaches SQL as text, and the user's tables, transactions and connections are untouched."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest
import torch

import relsql
from tests.test_batches import quiet, shop_db, shop_template
from tests.test_model import SIMPLE, build

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    db = build(tmp_path_factory.mktemp("shop") / "shop.duckdb", n=120)
    db.execute("CREATE TABLE other AS SELECT 1 AS x")
    return db


def _model(db, **kwargs):
    return relsql.Model(db, relsql.Template.from_sql(SIMPLE), **{"target": "customer.churned", "progress": False, **kwargs})


def test_fanout_never_reaches_sql_as_text(shop):
    for fanout in ["1; DROP TABLE other; --", 0, -1, 2.5, True, {"predict": "1; DROP TABLE other; --"}, {"nope": 3}]:
        with pytest.raises(relsql.RelsqlError, match="fanout"):
            _model(shop, batch_size=8, fanout=fanout)
    assert shop.arrow('SELECT * FROM "other"').num_rows == 1
    model = _model(shop, batch_size=8, fanout={"predict": 2})  # a valid one still works
    assert model.settings.fanout == {"predict": 2}


@pytest.mark.parametrize("kwargs, word", [
    ({"target": None}, "target"), ({"target": ["customer", "churned"]}, "target"), ({"target": "customer"}, "target"),
    ({"target": "a.b.c"}, "target"), ({"split": (math.nan, 0.5, 0.5)}, "split"), ({"split": (-0.2, 0.6, 0.6)}, "split"),
    ({"split": "random"}, "three fractions"), ({"split": (0.5, 0.5)}, "three fractions"), ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"), ({"seed": "0"}, "seed"), ({"batch_size": 0}, "batch_size"), ({"batch_size": 1.5}, "batch_size"),
    ({"batch_size": "8"}, "batch_size"), ({"dtype": torch.int64}, "dtype"), ({"device": "nonsense"}, "device"),
    ({"embedding_lr": math.nan}, "embedding_lr"), ({"embedding_lr": 0}, "embedding_lr"), ({"task": "ranking"}, "task"),
    ({"output": 3}, "output"), ({"time_column": 3}, "time_column"), ({"embedding_optimizer": "adam"}, "embedding_optimizer"),
])
def test_bad_model_arguments_are_named(shop, kwargs, word):
    with pytest.raises(relsql.RelsqlError, match=word):
        _model(shop, **kwargs)


@pytest.mark.parametrize("kwargs, word", [
    ({"epochs": 0}, "epochs"), ({"epochs": -1}, "epochs"), ({"epochs": 2.5}, "epochs"), ({"lr": math.nan}, "lr"),
    ({"lr": 0}, "lr"), ({"lr": -1}, "lr"), ({"lr": "0.1"}, "lr"), ({"batch_size": 0}, "batch_size"),
    ({"patience": -1}, "patience"), ({"weight_decay": math.inf}, "weight_decay"), ({"checkpoint_every": 0}, "checkpoint_every"),
    ({"callback": 3}, "callback"),
])
def test_bad_fit_arguments_are_named_before_training(shop, kwargs, word):
    model = _model(shop)
    before = {n: p.detach().clone() for n, p in model.named_weights().items()}
    with pytest.raises(relsql.RelsqlError, match=word):
        model.fit(**kwargs)
    assert all(torch.equal(before[n], p) for n, p in model.named_weights().items()) and model.history == []


def test_fit_refuses_a_checkpoint_in_a_missing_folder_or_onto_a_folder(shop, tmp_path):
    model = _model(shop)
    for path, message in [(tmp_path / "nope" / "c.ckpt", "does not exist"), (tmp_path, "is a folder")]:
        with pytest.raises(relsql.RelsqlError, match=message):
            model.fit(epochs=1, checkpoint=path)
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("key", ["prediction", "probability", "Prediction"])
def test_a_key_column_named_like_an_output_column_keeps_its_values(tmp_path, key):
    db = build(tmp_path / "shop.duckdb", n=60)
    db.execute(f'ALTER TABLE customer RENAME COLUMN customer_id TO "{key}"')
    db.execute(f'ALTER TABLE orders RENAME COLUMN customer_id TO "{key}"')
    template = SIMPLE.replace("customer_id", f'"{key}"')
    model = relsql.Model(db, relsql.Template.from_sql(template), target="customer.churned", progress=False)
    model.fit(epochs=2)
    frame = model.predict()
    assert frame.columns[0] == key and sorted(frame[key].to_list()) == list(range(60))
    model.write_predictions("out")
    written = db.arrow(f'SELECT "{key}" FROM "out" ORDER BY 1').column(0).to_pylist()
    assert written == list(range(60))
    assert len({c.casefold() for c in frame.columns}) == len(frame.columns)


def test_a_grounding_error_leaves_the_users_transaction_alone(tmp_path):
    con = duckdb.connect(str(tmp_path / "user.duckdb"))
    con.execute("CREATE TABLE t(id INT, x DOUBLE)")
    con.execute("INSERT INTO t VALUES (1, 1.0), (2, 2.0)")
    con.begin()
    con.execute("INSERT INTO t VALUES (3, 3.0)")  # the user's uncommitted row
    with relsql.connect(con) as db:
        bad = relsql.Template.from_sql("CREATE TABLE p AS SELECT t.id, linear(features(t.x), 2) FROM t JOIN u ON u.id = t.id;")
        with pytest.raises(relsql.RelsqlError) as caught:
            relsql.compile(bad, db)
        assert "aborted" not in str(caught.value) and "u" in str(caught.value)
    con.commit()  # still the user's transaction, and the connection is still open
    assert con.execute("SELECT count(*) FROM t").fetchone()[0] == 3


def test_gradients_as_relations_writes_all_or_nothing(shop):
    model = _model(shop)
    model.fit(epochs=1)
    shop.execute('CREATE TABLE "grad_w_out" AS SELECT 1 AS x')  # the second of the names it would write
    before = set(shop.tables())
    with pytest.raises(relsql.RelsqlError, match="grad_w_out"):
        model.gradients_as_relations("grad_")
    assert set(shop.tables()) == before
    shop.execute('DROP TABLE "grad_w_out"')


def test_a_user_table_named_like_relsqls_step_counter_is_refused_untouched():
    db = shop_db()
    db.execute('CREATE TABLE "Relsql_Embedding_Steps" AS SELECT 42 AS answer')
    model = quiet(relsql.Model, db, shop_template("database"), target="item.y", seed=0, progress=False, batch_size=300)
    with pytest.raises(relsql.RelsqlError, match="step counters"):
        quiet(model.fit, epochs=1)
    assert db.arrow('SELECT * FROM "Relsql_Embedding_Steps"').column(0).to_pylist() == [42]
    assert not [t for t in db.tables() if t.startswith("relsql_embedding_user")]


@pytest.mark.parametrize("value", ["'inf'::DOUBLE", "'nan'::DOUBLE", "1e308"])
def test_features_over_values_that_cannot_be_standardized(value):
    db = relsql.connect()
    db.execute(f"CREATE TABLE t AS SELECT i AS id, CASE WHEN i = 3 THEN {value} ELSE 1e308 * (i % 2) END AS x FROM range(5) r(i)")
    with pytest.raises(relsql.SchemaError, match=r"features\(t.x\)"):
        relsql.compile(relsql.Template.from_sql("CREATE TABLE p AS SELECT t.id, linear(features(t.x), 2) FROM t t;"), db)


def test_mini_batch_training_shows_no_internal_warnings():
    """In a fresh process: torch reports some warnings once per process, so an earlier test could hide them."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import relsql
        from tests.test_batches import shop_db, shop_template
        model = relsql.Model(shop_db(), shop_template("database"), target="item.y", seed=0, progress=False,
                             batch_size=300, fanout=2)
        model.fit(epochs=1)
        model.predict()
        model.evaluate()
        print("done")
    """)
    run = subprocess.run([sys.executable, "-W", "always", "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr
    assert "Warning" not in run.stderr, run.stderr


def test_a_relation_named_like_a_user_table_it_hides_is_refused():
    db = relsql.connect()
    db.execute("CREATE TABLE t AS SELECT i AS id, i * 1.0 AS x FROM range(4) r(i)")
    db.execute("CREATE TABLE H AS SELECT 1 AS id")  # the user's table, which statement 2 would not read
    template = relsql.Template.from_sql("CREATE TABLE h AS SELECT t.id, linear(features(t.x), 2) FROM t t;\n"
                                        "CREATE TABLE p AS SELECT x.id, linear(x.h, 1) FROM h x;")
    with pytest.raises(relsql.SchemaError, match="relation `h` has the name of table `H`.*rename the relation"):
        relsql.compile(template, db)


@pytest.mark.parametrize("head", ["CAST(c.customer_id AS VARCHAR)", "c.customer_id * 1.0"])
def test_an_output_key_of_another_type_than_the_targets_is_refused(shop, head):
    template = (f"CREATE TABLE predict AS SELECT {head} AS customer_id, linear(features(c.spend), 1) "
                "FROM customer c;")
    with pytest.raises(relsql.SchemaError, match="has key `customer_id` of type"):
        relsql.Model(shop, relsql.Template.from_sql(template), target="customer.churned", progress=False)


def test_no_value_reaches_sql_as_text():
    """The class of the fanout injection: numbers become SQL only through the typed literal
    helpers (relsql/sql.py `integer`/`real`), and no SQL is formatted from variables."""
    import re

    offenders = []
    for path in sorted(ROOT.glob("relsql/**/*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if path.relative_to(ROOT).as_posix() == "relsql/sql.py" and ("Literal.number(str(int(value)))" in line
                                                                        or "Literal.number(repr(value))" in line):
                continue  # the helpers themselves
            if re.search(r"Literal\.number\((?!\d+\))", line) or re.search(r"\.(execute|sql|arrow)\(f[\"']", line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_relations_are_read_as_the_database_reads_names_ignoring_case():
    db = relsql.connect()
    db.execute("CREATE TABLE t AS SELECT i AS id, i * 1.0 AS x FROM range(4) r(i)")
    template = relsql.Template.from_sql("CREATE TABLE Layer1 AS SELECT t.id, linear(features(t.x), 2, 'w') FROM t t;\n"
                                        "CREATE TABLE p AS SELECT l.id, linear(l.h, 1, 'out') FROM layer1 l;")
    assert template.relations["p"].rules[0].refs == ["Layer1"]
    net = relsql.compile(template, db, dtype=torch.float64)
    weights = net.named_weights()
    x = torch.arange(4, dtype=torch.float64)
    expected = ((x - x.mean()) / x.std(unbiased=False))[:, None] @ weights["w"].T @ weights["out"].T
    assert torch.allclose(net()["p"], expected)


def test_a_key_named_value_keeps_its_values_in_net_values():
    db = relsql.connect()
    db.execute("CREATE TABLE t AS SELECT i + 10 AS value, i * 1.0 AS x FROM range(3) r(i)")
    net = relsql.compile(relsql.Template.from_sql("CREATE TABLE p AS SELECT t.value, linear(features(t.x), 2) FROM t t;"), db)
    frame = net.values("p")
    assert frame["value"].to_list() == [10, 11, 12] and frame.columns == ["value", "value_1"]


@pytest.mark.parametrize("column, message", [
    ("[[1.0, 2.0]]", "not nested lists"), ("[]::DOUBLE[]", "empty lists"), ("[1.0, NULL]", "NULL inside"),
])
def test_value_columns_that_are_not_vectors_of_numbers(column, message):
    db = relsql.connect()
    db.execute(f"CREATE TABLE t AS SELECT 1 AS id, {column} AS v")
    with pytest.raises(relsql.SchemaError, match=message):
        relsql.compile(relsql.Template.from_sql("CREATE TABLE p AS SELECT t.id, linear(t.v, 2) FROM t t;"), db)


def test_compile_arguments_are_named():
    db = relsql.connect()
    db.execute("CREATE TABLE t AS SELECT 1 AS id, 1.0 AS x")
    template = relsql.Template.from_sql("CREATE TABLE p AS SELECT t.id, linear(features(t.x), 2) FROM t t;")
    for kwargs, word in [({"dtype": "float"}, "dtype"), ({"device": "meta"}, "device"), ({"passes": "x"}, "passes"),
                         ({"passes": (3,)}, "passes"), ({"outputs": "p"}, "outputs"), ({"seed": -1}, "seed"),
                         ({"gather_strength": math.nan}, "gather_strength")]:
        with pytest.raises(relsql.RelsqlError, match=word):
            relsql.compile(template, db, **kwargs)
    with pytest.raises(relsql.RelsqlError, match="target"):
        relsql.Template.auto(db, target=None)
    with pytest.raises(relsql.RelsqlError, match="hops"):
        relsql.Template.auto(db, target="t.x", hops=-1)


def test_table_names_the_database_cannot_hold_are_refused(shop):
    model = _model(shop)
    for name in ["\ud800", "a\x00b", " ", "__relsql_x"]:
        with pytest.raises(relsql.SchemaError, match="cannot write a table named"):
            model.write_predictions(name)
    with pytest.raises(relsql.SchemaError, match="cannot write a table named"):
        model.gradients_as_relations("\ud800")
