"""The public API as a user meets it: compile, values, named weights, explain, devices, CLI."""

from __future__ import annotations

import re

import pytest
import torch

import relsql
from relsql.cli import main

TEMPLATE = """
CREATE TABLE node_h AS SELECT n.node_id, tanh(linear(n.x, 4, 'w_in') + embed(n.kind, 4)) FROM node n;
CREATE TABLE hop AS
SELECT e.dst AS node_id, relu(sum(linear(s.h, 4, 'w_msg')) + bias(4, 'b_msg'))
FROM edge e JOIN node_h s ON s.node_id = e.src GROUP BY e.dst;
CREATE TABLE score AS SELECT h.node_id, linear(h.h, 1, 'w_out') FROM hop h;
"""


@pytest.fixture
def db(tmp_path):
    db = relsql.connect(tmp_path / "graph.duckdb")
    db.execute("""
        CREATE TABLE node(node_id INT PRIMARY KEY, kind VARCHAR, x DOUBLE[]);
        INSERT INTO node VALUES (10, 'a', [1, 0]), (20, 'b', [0, 1]), (30, 'a', [1, 1]), (40, 'c', [0.5, 2]);
        CREATE TABLE edge(src INT, dst INT);
        INSERT INTO edge VALUES (10, 20), (20, 30), (30, 10), (40, 10), (20, 10);
    """)
    yield db
    db.con.close()


@pytest.mark.smoke
def test_compile_values_and_weights(db):
    net = relsql.compile(relsql.Template.from_sql(TEMPLATE), db, seed=3)
    out = net()
    assert out["node_h"].dtype == torch.float32
    assert out["hop"].shape == (3, 4)  # node 40 receives no edge: no head
    hop = net.values("hop")
    assert hop["node_id"].to_list() == [10, 20, 30]
    weights = net.named_weights()
    assert {"w_in", "w_msg", "b_msg", "w_out"} <= set(weights)
    assert tuple(weights["w_in"].shape) == (4, 2) and tuple(weights["w_msg"].shape) == (4, 4)
    kinds = net.dictionary("node_h.embed0")["value"].to_list()
    assert sorted(kinds) == ["a", "b", "c"] and tuple(weights["node_h.embed0"].shape) == (3, 4)
    # hop(10) sums the messages of its three in-neighbours 30, 40, 20, by hand:
    node_h = dict(zip(net.values("node_h")["node_id"].to_list(), out["node_h"]))
    expected = torch.relu(sum(weights["w_msg"] @ node_h[s] for s in (30, 40, 20)) + weights["b_msg"])
    assert torch.allclose(out["hop"][0], expected, atol=1e-6)


def test_seed_makes_weights_reproducible(db):
    tpl = relsql.Template.from_sql(TEMPLATE)
    a = relsql.compile(tpl, db, seed=5)().get("score")
    b = relsql.compile(tpl, db, seed=5)().get("score")
    c = relsql.compile(tpl, db, seed=6)().get("score")
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_user_tables_untouched_and_temp_tables_private(db):
    before = {t: db.arrow(f'SELECT * FROM "{t}"') for t in db.tables()}
    net = relsql.compile(relsql.Template.from_sql(TEMPLATE), db)
    net().get("score").sum().backward()
    assert set(db.tables()) == set(before)
    for table, data in before.items():
        assert db.arrow(f'SELECT * FROM "{table}"').equals(data)


def test_a_compiled_net_pickles_and_runs_the_same(db, tmp_path):
    """torch.save(net) / torch.load: the executor's bound kernels are rebuilt, not pickled."""
    net = relsql.compile(relsql.Template.from_sql(TEMPLATE), db, seed=3)
    before = net()
    torch.save(net, tmp_path / "net.pt")
    loaded = torch.load(tmp_path / "net.pt", weights_only=False)
    after = loaded()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    after["score"].sum().backward()
    assert all(p.grad is not None for p in loaded.parameters() if p.requires_grad)


def test_explain_lists_every_relation_with_sizes(db):
    text = relsql.compile(relsql.Template.from_sql(TEMPLATE), db).explain()
    assert "-- hop statement 2" in text
    # sum over edges as a matmul, its matrix dense because it is small (a large one shows as sparse(...))
    assert re.search(r"  t\d+ = in\d+\[3, 4\] @ t\d+\s+\[3 x 4\]", text), text
    assert "optimizer: compress_groundings" in text and "sparse_aggregate: 1 " in text
    assert "outputs: node_h=" in text


def test_float64_and_gradients_flow(db):
    net = relsql.compile(relsql.Template.from_sql(TEMPLATE), db, dtype=torch.float64)
    loss = net()["score"].pow(2).sum()
    loss.backward()
    grads = {n: p.grad for n, p in net.named_weights().items()}
    assert all(g is not None and g.dtype == torch.float64 for g in grads.values())
    assert grads["w_out"].abs().sum() > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_matches_cpu(db):
    tpl = relsql.Template.from_sql(TEMPLATE)
    cpu = relsql.compile(tpl, db, dtype=torch.float64, seed=1)
    gpu = relsql.compile(tpl, db, dtype=torch.float64, seed=1, device="cuda")
    assert torch.allclose(cpu()["score"], gpu()["score"].cpu(), atol=1e-10)


@pytest.mark.smoke
def test_cli_explain(db, tmp_path, capsys):
    path = tmp_path / "t.sql"
    path.write_text(TEMPLATE)
    db.con.close()
    assert main(["explain", str(tmp_path / "graph.duckdb"), "--template", str(path)]) == 0
    assert "outputs: node_h=" in capsys.readouterr().out


def test_cli_reports_bad_template(tmp_path, capsys):
    path = tmp_path / "t.sql"
    path.write_text("CREATE TABLE h AS SELECT n.id, frob(n.x) FROM node n;")
    relsql.connect(tmp_path / "x.duckdb").con.close()
    assert main(["explain", str(tmp_path / "x.duckdb"), "--template", str(path)]) == 1  # a runtime error
    assert "unknown function frob" in capsys.readouterr().err


def test_demo_trains_mutagenesis_well_above_majority(capsys, tmp_path):
    """The README's main job: relational Mutagenesis, relsql/sql_templates/mutagenesis.sql, seed 0."""
    path = tmp_path / "demo.duckdb"
    assert main(["demo", "--db", str(path)]) == 0
    out = capsys.readouterr().out
    accuracy, majority = map(float, re.search(r"test accuracy (\d\.\d+) \(majority class (\d\.\d+)\)", out).groups())
    assert accuracy >= majority + 0.05 and accuracy >= 0.75, out
    db = relsql.connect(path, read_only=True)
    assert db.arrow('SELECT count(*) AS n FROM "mutagenesis_predictions"').column("n")[0].as_py() == 188
    assert {"molecule", "atom", "bond"} <= set(db.tables())

def test_cte_shadows_a_relation_of_the_same_name(db):
    tpl = relsql.Template.from_sql("""
        CREATE TABLE node_h AS SELECT n.node_id, linear(n.x, 2, 'w') FROM node n;
        CREATE TABLE other AS SELECT s.node_id, linear(s.x, 2, 'w2')
        FROM (WITH node_h AS (SELECT node_id, x FROM node) SELECT * FROM node_h) s;
    """)
    out = relsql.compile(tpl, db, dtype=torch.float64)()
    assert out["other"].shape == (4, 2)


def test_sql_max_is_elementwise(db):
    tpl = relsql.Template.from_sql("CREATE TABLE m AS SELECT n.kind, max(n.x) FROM node n GROUP BY n.kind;")
    net = relsql.compile(tpl, db, dtype=torch.float64)
    assert net.values("m").sort("kind")["value"].to_list() == [[1.0, 1.0], [0.0, 1.0], [0.5, 2.0]]


def test_cli_inspect_train_predict(tmp_path, capsys):
    from tests.test_model import SIMPLE, build

    build(tmp_path / "shop.duckdb").con.close()
    template = tmp_path / "t.sql"
    template.write_text(SIMPLE)
    shop = str(tmp_path / "shop.duckdb")
    assert main(["inspect", shop]) == 0
    out = capsys.readouterr().out
    assert "customer: 300 rows" in out and re.search(r"customer_id\s+INTEGER\s+PK", out)
    model = str(tmp_path / "m.pt")
    assert main(["train", shop, "--template", str(template), "--target", "customer.churned", "--epochs", "5",
                 "--model", model, "--predictions", "preds"]) == 0
    assert "task binary" in capsys.readouterr().out and (tmp_path / "m.png").exists()
    assert main(["predict", shop, "--model", model, "--table", "preds"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["predict", shop, "--model", model, "--table", "preds", "--replace"]) == 0
    db = relsql.connect(shop, read_only=True)
    assert db.arrow('SELECT count(*) AS n FROM "preds"').column("n")[0].as_py() == 300


def test_cli_train_in_batches_with_checkpoint(tmp_path, capsys):
    from tests.test_model import SIMPLE, build

    build(tmp_path / "shop.duckdb").con.close()
    template = tmp_path / "t.sql"
    template.write_text(SIMPLE)
    shop, ckpt = str(tmp_path / "shop.duckdb"), tmp_path / "run.ckpt"
    args = ["train", shop, "--template", str(template), "--target", "customer.churned", "--batch-size", "64",
            "--memory-limit", "256MB", "--checkpoint", str(ckpt), "--model", str(tmp_path / "m.pt")]
    assert main([*args, "--epochs", "2"]) == 0
    assert ckpt.exists() and "task binary" in capsys.readouterr().out
    with relsql.connect(shop, read_only=True) as db:
        first = relsql.Model.load(tmp_path / "m.pt", db).history
    assert main([*args, "--epochs", "3"]) == 0
    with relsql.connect(shop, read_only=True) as db:
        resumed = relsql.Model.load(tmp_path / "m.pt", db).history
    assert len(first) == 2 and len(resumed) == 3 and resumed[:2] == first
