"""Model.explain: attributions of input rows, checked against a naive evaluator written here.

The evaluator walks the groundings one by one in Python (parent -> its children, read back from the
database with plain SQL) with the model's named weights: it gives each parent's output and its
output with every input at the baseline (numbers at 0, embedding vectors at 0), and for a linear
template the exact attribution of every child row (its term of the sum)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

import relsql

LINEAR = """
CREATE TABLE predict AS
SELECT p.id, linear(avg(c.x), 1, 'w') + bias(1, 'b') AS h
FROM parent p JOIN child c ON c.parent_id = p.id
GROUP BY p.id;
"""

DEEP = """
CREATE TABLE child_h AS
SELECT c.id, tanh(linear(c.x, 3, 'wx') + embed(c.kind, 3, 'ek')) AS h
FROM child c;

CREATE TABLE predict AS
SELECT p.id, linear(avg(tanh(linear(h.h, 3, 'wh'))), 1, 'out') + linear(avg(p.z), 1, 'wz') AS h
FROM parent p JOIN child c ON c.parent_id = p.id JOIN child_h h ON h.id = c.id
GROUP BY p.id;
"""


@pytest.fixture(scope="module")
def small():
    """parent(id, z, y), child(id, parent_id, x, kind): y depends on the children's x."""
    rng = np.random.default_rng(0)
    db = relsql.connect()
    parents, children = 40, []
    for p in range(parents):
        for _ in range(int(rng.integers(1, 5))):
            children.append((len(children), p, float(rng.normal()), str(rng.choice(["a", "b", "c"]))))
    xs = {}
    for _, p, x, _ in children:
        xs.setdefault(p, []).append(x)
    db.con.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY, z DOUBLE, y BOOLEAN)")
    db.con.execute("CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent(id), x DOUBLE, "
                   "kind VARCHAR)")
    db.con.executemany("INSERT INTO parent VALUES (?, ?, ?)",
                       [(p, float(rng.normal()), bool(np.mean(xs[p]) > 0)) for p in range(parents)])
    db.con.executemany("INSERT INTO child VALUES (?, ?, ?, ?)", children)
    return db


def _model(db, template: str) -> relsql.Model:
    model = relsql.Model(db, relsql.Template.from_sql(template), target="parent.y", seed=0, dtype=torch.float64,
                         progress=False)
    return model.fit(epochs=3, refit=False)


def on_file(db, path) -> relsql.Database:
    """The same parent and child rows in a DuckDB file (one the command line can open)."""
    copy = relsql.connect(path)
    for table in ("parent", "child"):
        copy.con.register("rows", db.arrow(f'SELECT * FROM "{table}"'))
        copy.con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM rows')
        copy.con.unregister("rows")
    return copy


def _rows(db) -> tuple[dict[int, float], dict[int, list[tuple[int, float, str]]]]:
    z = dict(db.con.execute("SELECT id, z FROM parent").fetchall())
    kids: dict[int, list] = {}
    for cid, pid, x, kind in db.con.execute("SELECT id, parent_id, x, kind FROM child ORDER BY id").fetchall():
        kids.setdefault(pid, []).append((cid, x, kind))
    return z, kids


def _weights(model) -> dict[str, np.ndarray]:
    return {n: w.detach().double().numpy() for n, w in model.named_weights().items()}


def _deep_output(w: dict, model, z: float, kids: list, at_baseline: bool) -> float:
    """One parent's output, grounding by grounding (the DEEP template)."""
    codes = model.net.dictionary("ek")
    code = dict(zip(codes["value"].to_list(), codes["code"].to_list()))
    total = np.zeros(3)
    for _, x, kind in kids:
        x = 0.0 if at_baseline else x
        e = np.zeros(3) if at_baseline else w["ek"][code[kind]]
        h = np.tanh(w["wx"] @ np.array([x]) + e)
        total += np.tanh(w["wh"] @ h)
    return float((w["out"] @ (total / len(kids)))[0] + (w["wz"] @ np.array([0.0 if at_baseline else z]))[0])


def test_linear_attributions_are_each_child_rows_term(small):
    model = _model(small, LINEAR)
    w = _weights(model)
    z, kids = _rows(small)
    explanation = model.explain()
    assert set(explanation["table"].unique()) == {"child"} and set(explanation["column"].unique()) == {"x"}
    found = {(r["id"], r["row_key"]): r["attribution"] for r in explanation.iter_rows(named=True)}
    expected = {}
    for pid, rows in kids.items():
        for _cid, x, _ in rows:  # avg: each child's x enters as w * x / n; grouped rules name the head's row
            key = (pid, str(pid))
            expected[key] = expected.get(key, 0.0) + float(w["w"][0, 0] * x / len(rows))
    assert found.keys() == expected.keys()
    assert max(abs(found[k] - expected[k]) for k in expected) < 1e-12
    per_row = explanation.group_by("id").agg(pl.col("output").first(), pl.col("baseline").first())
    for row in per_row.iter_rows(named=True):  # the baseline is the bias alone
        assert abs(row["baseline"] - float(w["b"][0])) < 1e-12


def test_deep_completeness_against_naive_evaluator(small):
    model = _model(small, DEEP)
    w = _weights(model)
    z, kids = _rows(small)
    explanation = model.explain(where="id < 25")
    assert sorted(explanation["id"].unique().to_list()) == list(range(25))
    totals = explanation.group_by("id").agg(pl.col("attribution").sum(), pl.col("output").first(),
                                            pl.col("baseline").first())
    for row in totals.iter_rows(named=True):
        pid = row["id"]
        output = _deep_output(w, model, z[pid], kids[pid], at_baseline=False)
        baseline = _deep_output(w, model, z[pid], kids[pid], at_baseline=True)
        assert abs(row["output"] - output) < 1e-10
        assert abs(row["baseline"] - baseline) < 1e-10
        assert abs(row["attribution"] - (output - baseline)) < 1e-6  # completeness
    probability = model.predict(where="id < 25").sort("id")["probability"].to_numpy()
    logits = totals.sort("id")["output"].to_numpy()
    assert np.allclose(1 / (1 + np.exp(-logits)), probability, atol=1e-9)


def test_deep_rows_and_columns_reached(small):
    model = _model(small, DEEP)
    z, kids = _rows(small)
    explanation = model.explain(keys={"id": [3, 7]})
    assert explanation["id"].unique(maintain_order=True).to_list() == [3, 7]
    for pid in (3, 7):
        mine = explanation.filter(pl.col("id") == pid)
        child_rows = set(mine.filter((pl.col("table") == "child") & (pl.col("column") == "kind"))["row_key"].to_list())
        assert child_rows == {str(c) for c, _, _ in kids[pid]}  # exactly its own children, no other parent's
        assert set(mine.filter(pl.col("table") == "parent")["row_key"].to_list()) == {str(pid)}
    whole = model.explain(keys={"id": [3]}, per="row")
    assert whole["column"].null_count() == whole.height
    by_column = explanation.filter(pl.col("id") == 3)
    assert math.isclose(whole["attribution"].sum(), by_column["attribution"].sum(), rel_tol=1e-12)


def test_summary_and_write_back(small):
    model = _model(small, DEEP)
    explanation = model.explain(where="id < 10")
    summary = relsql.explain_summary(explanation, model)
    columns = summary.filter(pl.col("kind") == "column")
    assert set(columns["name"]) == {"child.x", "child.kind", "parent.z"}
    assert abs(columns["share"].sum() - 1) < 1e-12
    naive = {}  # mean over rows of |sum of a row's attributions of one column|
    for (name,), part in explanation.with_columns(pl.concat_str(["table", "column"], separator=".").alias("n")) \
            .group_by(["n"]):
        per_row = part.group_by("id").agg(pl.col("attribution").sum())
        naive[name] = float(per_row["attribution"].abs().sum()) / 10
    for row in columns.iter_rows(named=True):
        assert abs(row["mean_abs_attribution"] - naive[row["name"]]) < 1e-12
    written = relsql.write_explanation(small, "why", explanation)
    assert written == explanation.height
    assert small.con.execute('SELECT count(*) FROM "why"').fetchone()[0] == explanation.height
    with pytest.raises(relsql.RelsqlError):
        relsql.write_explanation(small, "child", explanation, replace=True)  # a user's table is never replaced
    with pytest.raises(relsql.RelsqlError, match="per must be"):
        model.explain(per="cell")


def test_cli_writes_tables_and_refuses_user_tables(small, tmp_path, capsys):
    from relsql.cli import main

    path = tmp_path / "small.duckdb"
    db = on_file(small, path)
    model = _model(db, DEEP)
    expected = model.explain(where="id < 4")
    model.save(tmp_path / "m.pt")
    db.con.close()
    args = ["explain-prediction", str(path), "--model", str(tmp_path / "m.pt"), "--where", "id < 4"]
    assert main([*args, "--table", "child"]) == 1  # a user's table is never replaced
    assert "child" in capsys.readouterr().err
    assert main([*args, "--table", "why", "--summary-table", "why_summary"]) == 0
    assert main([*args, "--table", "why"]) == 1  # exists: needs --replace
    assert main([*args, "--table", "why", "--replace"]) == 0
    assert main([*args[:-2], "--where", "nope > 1"]) == 2
    again = relsql.connect(path)
    written = pl.from_arrow(again.arrow('SELECT * FROM "why"'))
    assert written.height == expected.height
    assert abs(written["attribution"].sum() - expected["attribution"].sum()) < 1e-9
    kinds = set(again.con.execute('SELECT kind FROM "why_summary"').fetchall())
    assert {("column",), ("relation",)} <= kinds
    again.con.close()


def test_shared_backward_equals_per_row_gradients(small):
    """Rows reading disjoint inputs share each backward pass (owners): the same attributions as one
    gradient per row (the batched path, taken where two asked rows read one input)."""
    from relsql.explain.inputs import plain_plan
    from relsql.explain.integrate import Runner, attribute, owners

    model = _model(small, DEEP)
    learner = model.learner
    plan, inputs = plain_plan(learner.template, learner.net.grounding)
    runner = Runner(plan, inputs, learner.net.weights_by_name(), learner.head, learner.output)
    rids = np.arange(0, 30, 3)
    units = np.zeros(len(rids), dtype=np.int64)
    reach = owners(learner.net.grounding, learner.output, rids)
    shared = attribute(runner, rids, units, 8, reach)
    per_row = attribute(runner, rids, units, 8)

    def table(found):
        return {(int(r), int(s), int(g), int(p)): v for r, s, g, p, v in
                zip(found.row, found.source, found.grounding, found.part, found.value)}

    a, b = table(shared), table(per_row)
    assert a.keys() == b.keys() and len(a) > 0
    assert max(abs(a[k] - b[k]) for k in a) < 1e-12
    lo, hi = reach["predict"]
    assert lo[rids].tolist() == list(range(len(rids))) and hi[rids].tolist() == list(range(len(rids)))


def test_summary_of_a_blend_has_the_gbm_share_and_importances(small):
    model = relsql.Model(small, relsql.Template.from_sql(DEEP), target="parent.y", seed=0, dtype=torch.float64,
                         progress=False).fit(epochs=3, refit=False, hybrid=True)
    hybrid = model.learner.hybrid
    assert hybrid is not None
    summary = relsql.explain_summary(model.explain(where="id < 5"), model)
    blend = dict(summary.filter(pl.col("kind") == "blend").select("name", "share").iter_rows())
    assert blend == {"network": hybrid.weight, "gbm": pytest.approx(1 - hybrid.weight)}
    features = summary.filter(pl.col("kind") == "gbm_feature")
    splits = {}  # a naive walk over the trees' nodes: every inner node is one split on its feature
    for f in hybrid.trees.feature.tolist():
        if f >= 0:
            splits[f] = splits.get(f, 0) + 1
    names = list(hybrid.features.names)
    expected = {names[f]: n / sum(splits.values()) for f, n in splits.items()}
    found = {n: s for n, s in features.select("name", "share").iter_rows() if s > 0}
    assert found.keys() == expected.keys() and all(abs(found[k] - expected[k]) < 1e-12 for k in expected)


def _runner(model):
    from relsql.explain.inputs import plain_plan
    from relsql.explain.integrate import Runner

    learner = model.learner
    plan, inputs = plain_plan(learner.template, learner.net.grounding)
    return Runner(plan, inputs, learner.net.weights_by_name(), learner.head, learner.output)


def test_points_in_one_pass_equal_one_pass_per_point(small):
    """The plan run at several alphas at once (blocks stacked along rows, indices offset) gives each
    alpha's outputs and input gradients as a pass of its own does."""
    model = _model(small, DEEP)
    runner = _runner(model)
    alphas = [0.0, 0.3, 1.0]
    together, leaves = runner.outputs(alphas, grad=True)
    grads = torch.autograd.grad(together.sum(), list(leaves.values()))
    for p, alpha in enumerate(alphas):
        alone, own = runner.outputs([alpha], grad=True)
        assert torch.allclose(together[p], alone[0], rtol=0, atol=1e-13)
        for grad, leaf in zip(grads, own.values()):
            mine = grad.reshape(len(alphas), *leaf.shape)[p]
            assert torch.allclose(mine, torch.autograd.grad(alone.sum(), leaf, retain_graph=True)[0], rtol=0, atol=1e-13)


def test_adaptive_points_meet_the_tolerance_and_match_a_fine_rule(small):
    """The default rule (Clenshaw-Curtis points, doubled until completeness holds) reports a gap
    that is the real one and within its tolerance, and gives the attributions of a 64-point
    Gauss-Legendre rule (another rule, converged) to 1e-6, with rows sharing a backward or not."""
    from relsql.explain.integrate import adaptive, attribute, clenshaw_curtis, owners

    for n in (4, 12, 24):  # an n-interval rule integrates polynomials of degree n exactly
        x, w = clenshaw_curtis(n)
        assert len(x) == n + 1 and all(abs(float(w @ x**k) - 1 / (k + 1)) < 1e-14 for k in range(n + 1))
    model = _model(small, DEEP)
    runner = _runner(model)
    rids = np.arange(40)
    units = np.zeros(len(rids), dtype=np.int64)
    reach = owners(model.learner.net.grounding, model.learner.output, rids)

    def table(found):
        return {(int(r), int(s), int(g), int(p)): v for r, s, g, p, v in
                zip(found.row, found.source, found.grounding, found.part, found.value)}

    fine = table(attribute(runner, rids, units, 64, reach))
    coarse = None
    for shared in (reach, None):
        found = adaptive(runner, rids, units, shared, tolerance=1e-6, first=2)
        sums = np.bincount(found.row, weights=found.value, minlength=len(rids))
        real = np.abs(sums - (found.output - found.baseline)) / np.maximum(1, np.maximum(abs(found.output), abs(found.baseline)))
        assert found.gap == pytest.approx(real.max(), abs=1e-15) and found.gap <= 1e-6
        assert found.steps > 3  # two intervals were not enough: it doubled
        got = table(found)
        assert got.keys() == fine.keys() and max(abs(got[k] - fine[k]) for k in got) < 1e-6
        coarse = coarse or adaptive(runner, rids, units, shared, tolerance=1e-2, first=2)
    assert coarse.steps < found.steps and coarse.gap <= 1e-2  # a looser tolerance stops sooner


def test_a_target_key_named_like_explains_columns_gets_the_same_summary(small):
    """The same data with the target's key named `table` and the parent's own column `name`:
    explain's own columns get suffixes, and explain_summary (with and without the model) reads them
    by position, giving the summary of the plainly named database."""
    plain = relsql.explain_summary(_model(small, LINEAR).explain(where="id < 10"))
    db = relsql.connect()
    db.con.execute('CREATE TABLE bin ("table" INTEGER PRIMARY KEY, name DOUBLE, y BOOLEAN)')
    db.con.execute('CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES bin("table"), x DOUBLE, '
                   "kind VARCHAR)")
    for table in ("bin", "child"):
        source = "parent" if table == "bin" else "child"
        db.con.append(table, small.con.execute(f'SELECT * FROM "{source}" ORDER BY id').df())
    template = LINEAR.replace("p.id", 'p."table"').replace("FROM parent p", "FROM bin p")
    model = relsql.Model(db, relsql.Template.from_sql(template), target="bin.y", seed=0, dtype=torch.float64,
                         progress=False).fit(epochs=3, refit=False)
    explanation = model.explain(where='"table" < 10')
    assert explanation.columns[:2] == ["table", "table_1"]
    for found in (relsql.explain_summary(explanation, model), relsql.explain_summary(explanation)):
        assert found["kind"].to_list() == plain["kind"].to_list()
        assert [n.replace("bin.", "parent.") for n in found["name"].to_list()] == plain["name"].to_list()
        assert np.allclose(found["mean_abs_attribution"].to_numpy(), plain["mean_abs_attribution"].to_numpy(),
                           rtol=1e-12, atol=0)
