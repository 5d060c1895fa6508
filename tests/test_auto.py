"""Automatic templates: schema shapes, key inference, no label leakage, time, and that they learn."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
import torch

import relsql
from relsql.cli import main
from relsql.template import ir


@pytest.fixture
def school(tmp_path):
    """Composite keys, a self-referencing key, a link table without a key, an unreachable table."""
    db = relsql.connect(tmp_path / "school.duckdb")
    db.execute("""
        CREATE TABLE teacher(teacher_id INT PRIMARY KEY, mentor_id INT REFERENCES teacher(teacher_id), years DOUBLE);
        CREATE TABLE course(dept VARCHAR, number INT, teacher_id INT REFERENCES teacher(teacher_id), level VARCHAR,
                            PRIMARY KEY (dept, number));
        CREATE TABLE student(student_id INT PRIMARY KEY, age DOUBLE, passed BOOLEAN, enrolled DATE);
        CREATE TABLE enrolment(student_id INT REFERENCES student(student_id), dept VARCHAR, number INT,
                               grade DOUBLE, taken DATE, FOREIGN KEY (dept, number) REFERENCES course(dept, number));
        CREATE TABLE weather(day DATE, rain DOUBLE);
        INSERT INTO teacher VALUES (1, NULL, 10);
        INSERT INTO teacher VALUES (2, 1, 3), (3, 1, 1);
        INSERT INTO course VALUES ('cs', 101, 2, 'intro'), ('cs', 201, 3, 'advanced'), ('ma', 101, 1, 'intro');
        INSERT INTO student VALUES (1, 20, true, DATE '2021-01-01'), (2, 22, false, DATE '2021-06-01'),
                                   (3, 19, true, DATE '2022-01-01'), (4, 25, NULL, DATE '2022-06-01');
        INSERT INTO enrolment VALUES (1, 'cs', 101, 3.5, DATE '2020-09-01'), (1, 'ma', 101, 3.0, DATE '2021-09-01'),
                                     (2, 'cs', 201, 1.0, DATE '2021-02-01'), (3, 'cs', 101, 4.0, DATE '2021-09-01'),
                                     (4, 'ma', 101, 2.0, DATE '2022-01-01'), (2, 'cs', 101, 2.5, DATE '2021-09-01');
        INSERT INTO weather VALUES (DATE '2021-01-01', 3.0);
    """)
    yield db
    db.con.close()


def test_schema_shapes_are_handled(school):
    text = relsql.Template.auto(school, "student.passed", hops=4).source
    assert "left out (not reachable within 4 hops): weather" in text
    assert "inferred primary key enrolment(student_id, dept, number)" in text  # link table keyed by its FKs
    assert 'c.n_dept = y."dept" AND c.n_number = y."number"' in text  # a composite key joins on both columns
    assert "teacher_by_mentor_id" in text  # the self-referencing key, as its own edge
    net = relsql.compile(relsql.Template.from_sql(text), school, dtype=torch.float64, seed=0)
    assert net()["predict"].shape == (4, 1)


def test_target_column_never_reaches_the_inputs(school):
    """Weights fixed: permuting the labels leaves every output unchanged; the text never names it."""
    tpl = relsql.Template.auto(school, "student.passed", hops=3)
    assert not re.search(r'"passed"', tpl.source)
    before = relsql.compile(tpl, school, dtype=torch.float64, seed=0)()["predict"]
    school.execute("UPDATE student SET passed = NOT passed WHERE passed IS NOT NULL")
    after = relsql.compile(tpl, school, dtype=torch.float64, seed=0)()["predict"]
    assert torch.equal(before, after)


def test_time_column_keeps_later_rows_out(school):
    tpl = relsql.Template.auto(school, "student.passed", hops=2, time_column="enrolled")
    assert '"taken" < r."enrolled"' in tpl.source
    before = relsql.compile(tpl, school, dtype=torch.float64, seed=0)()["predict"]
    # Swap two grades taken on 2021-09-01 (the column's mean and spread stay the same): that day
    # is after students 1 and 2 enrolled, before student 3 did.
    school.execute("UPDATE enrolment SET grade = CASE WHEN student_id = 1 THEN 4.0 ELSE 3.0 END "
                   "WHERE taken = DATE '2021-09-01' AND ((student_id = 1 AND dept = 'ma') OR (student_id = 3))")
    after = relsql.compile(tpl, school, dtype=torch.float64, seed=0)()["predict"]
    assert torch.equal(before[:2], after[:2])  # students 1 and 2 see nothing from their future
    assert not torch.equal(before[2], after[2])  # student 3 sees the changed row


def test_hops_zero_is_the_target_table_alone(school):
    text = relsql.Template.auto(school, "student.passed", hops=0).source
    assert "enrolment" not in text.split("-- tables used:")[1].splitlines()[0]
    assert 'FROM enc_student v' in text


def test_cli_template_writes_an_editable_file(school, tmp_path, capsys):
    path = str(tmp_path / "school.duckdb")
    school.con.close()
    out = tmp_path / "auto.sql"
    assert main(["template", path, "--target", "student.passed", "--hops", "1", "-o", str(out)]) == 0
    edited = out.read_text().replace("tanh(p.h)", "relu(p.h)")
    out.write_text(edited)
    db = relsql.connect(path)
    model = relsql.Model(db, out, target="student.passed", split=(0.5, 0.25, 0.25), progress=False).fit(epochs=3)
    assert model.predict().height == 4
    db.close()
    gat = tmp_path / "gat.sql"
    assert main(["template", path, "--target", "student.passed", "--layer", "gat", "-o", str(gat)]) == 0
    assert "(gat layers)" in gat.read_text() and "attention(" in gat.read_text()


@pytest.mark.slow
def test_auto_template_on_mutagenesis_learns(tmp_path):
    from relsql.datasets.mutagenesis import load

    db = relsql.connect()
    load(db.con)
    model = relsql.Model(db, relsql.Template.auto(db, "molecule.mutagenic"), target="molecule.mutagenic", seed=0,
                         progress=False)
    model.fit(epochs=400, lr=0.01, patience=100)
    positive = float(model.y[torch.as_tensor(model.rows["test"])].mean())
    assert model.evaluate()["accuracy"] >= max(positive, 1 - positive) + 0.05
    assert np.isfinite(model.evaluate()["roc_auc"])


def test_bad_auto_targets(school):
    with pytest.raises(relsql.SchemaError, match="no primary key"):
        relsql.Template.auto(school, "weather.rain")
    with pytest.raises(relsql.SchemaError, match="no column `nope`"):
        relsql.Template.auto(school, "student.nope")
    with pytest.raises(relsql.SchemaError, match="time_column"):
        relsql.Template.auto(school, "student.passed", time_column="when")


def test_signal_two_hops_away_beats_majority_and_target_only():
    """The planted rule lives in product.quality, two foreign-key hops from customer.churned."""
    from demos.synthetic import build

    db = relsql.connect()
    build(db.con, customers=1500, seed=0, foreign_keys=False)  # keys must be inferred too
    accuracy = {}
    for hops, hybrid in ((2, False), (0, False), (0, True)):  # the networks alone; then hops=0 with its blend
        tpl = relsql.Template.auto(db, "customer.churned", hops=hops)
        model = relsql.Model(db, tpl, target="customer.churned", seed=0, progress=False)
        accuracy[hops, hybrid] = model.fit(epochs=200, patience=30, hybrid=hybrid).evaluate()["accuracy"]
    positive = float(model.y[torch.as_tensor(model.rows["test"])].mean())
    majority = max(positive, 1 - positive)
    assert "inferred foreign key orders(product_id) -> product(product_id)" in relsql.Template.auto(db, "customer.churned").source
    assert accuracy[2, False] >= majority + 0.2 and accuracy[2, False] >= accuracy[0, False] + 0.2, (accuracy, majority)
    # the blend's GBM reads two hops (the mean quality of a customer's ordered products) where the template reads none
    assert accuracy[0, True] >= accuracy[0, False] + 0.2 and "two-hop" in model.hybrid.describe(), accuracy


@pytest.mark.slow
def test_tpch_from_duckdb_and_postgres_end_to_end(pg_server):
    """dbgen declares no keys: they are inferred; the same template trains one epoch on both."""
    import uuid

    from relsql.datasets import tpch

    local = relsql.connect()
    tpch.generate(local.con, sf=0.01)
    url = pg_server.createdb(f"tpch_{uuid.uuid4().hex[:10]}")
    tpch.copy_to_postgres(local.con, url)
    remote = relsql.connect(url, read_only=True)
    texts = []
    for db in (local, remote):
        tpl = relsql.Template.auto(db, "orders.o_orderpriority", hops=2)
        assert "inferred foreign key lineitem(l_orderkey) -> orders(o_orderkey)" in tpl.source
        model = relsql.Model(db, tpl, target="orders.o_orderpriority", seed=0, progress=False).fit(epochs=1)
        assert model.task.kind == "multiclass" and len(model.task.classes) == 5
        assert model.predict().height == 15000 and np.isfinite(model.evaluate()["loss"])
        texts.append([line for line in tpl.source.splitlines() if not line.startswith("-- ")])
    assert texts[0] == texts[1]


def test_auto_template_hgt_layer_shares_table_weights_and_learns():
    """layer="hgt": keys, queries, values and outputs are one weight per table (node type) however
    many statements read that table, attention and messages one per key and direction; on the
    shop the target row attends over its orders and learns the two-hop signal."""
    from demos.synthetic import build
    from relsql.datasets.mutagenesis import load

    db = relsql.connect()
    load(db.con)
    hgt = relsql.Template.auto(db, "molecule.mutagenic", layer="hgt")
    assert "(hgt layers)" in hgt.source and "sum_per_head(" in hgt.source
    uses = Counter(re.findall(r"'(hgt_[kqva]_\w+)'", hgt.source))
    statements = [r for rel in hgt.relations.values() for r in rel.rules
                  if any(isinstance(e, ir.Attention) for e in ir.walk(r.expr))]
    assert len(statements) >= 3 and max(uses.values()) >= 3  # bond's keys/values serve several statements
    assert set(uses) == {n for n in hgt.weights if re.fullmatch(r"hgt_[kqva]_\w+", n)}
    per_edge = [n for n in hgt.weights if n.endswith(("_att", "_msg"))]
    assert len({n for n in per_edge if n.endswith("_att")}) == len(statements)  # one per key and direction
    shop = relsql.connect()
    build(shop.con, customers=1500, seed=0, foreign_keys=False)
    model = relsql.Model(shop, relsql.Template.auto(shop, "customer.churned", layer="hgt"), target="customer.churned",
                         seed=0, progress=False).fit(epochs=200, patience=30)
    positive = float(model.y[torch.as_tensor(model.rows["test"])].mean())
    assert model.evaluate()["accuracy"] >= max(positive, 1 - positive) + 0.2


def test_auto_template_layers():
    """layer="rgcn" is the mean per key and direction (the avg aggregation's statements);
    layer="gat" attends over child rows with a score from both ends and learns the signal two
    hops away; unknown layers are refused."""
    from demos.synthetic import build

    db = relsql.connect()
    build(db.con, customers=1500, seed=0, foreign_keys=False)
    body = lambda source: source[source.index("\n\n"):]  # noqa: E731  (the header names the layer)
    rgcn = relsql.Template.auto(db, "customer.churned", layer="rgcn")
    assert body(rgcn.source) == body(relsql.Template.auto(db, "customer.churned", aggregation="avg").source)
    gat = relsql.Template.auto(db, "customer.churned", layer="gat")
    assert "attention(leaky_relu(" in gat.source and "(gat layers)" in gat.source
    assert any(isinstance(e, ir.Attention) for r in gat.relations.values() for rule in r.rules for e in ir.walk(rule.expr))
    model = relsql.Model(db, gat, target="customer.churned", seed=0, progress=False).fit(epochs=200, patience=30)
    positive = float(model.y[torch.as_tensor(model.rows["test"])].mean())
    assert model.evaluate()["accuracy"] >= max(positive, 1 - positive) + 0.2
    with pytest.raises(relsql.SchemaError, match="layer must be one of sage, rgcn, gat, hgt"):
        relsql.Template.auto(db, "customer.churned", layer="gcn")
    with pytest.raises(relsql.SchemaError, match="mean per key and direction"):
        relsql.Template.auto(db, "customer.churned", layer="rgcn", aggregation="max")
