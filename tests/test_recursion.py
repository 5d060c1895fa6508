"""Recursive templates unrolled to a declared depth: against PyNeuraLogic's fixpoint grounding
(Datalog, float64, values and gradients to 1e-6) and against the same template unrolled by hand
(SQL, in one batch and in mini-batches), plus the errors a user can make."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relsql
from tests.oracles.compare import compare_template, facts_db

PATHS = """% relsql: depth {depth}
{{2,2}} path(X, Y) :- {{2,2}} edge(X, Y).
{{2,2}} path(X, Y) :- {{2,2}} edge(X, Z), {{2,2}} path(Z, Y).
{{1,2}} predict :- path(a, Y).
"""
# two samples; the first one's longest chain a -> b -> c -> d -> e needs 3 levels above the base
EXAMPLES = ["[0.5, -0.2] edge(a, b), [0.1, 0.3] edge(b, c), [0.7, 0.2] edge(c, d), [0.3, 0.9] edge(a, c), "
            "[0.2, 0.4] edge(d, e).",
            "[0.5, 0.1] edge(a, b), [0.3, 0.3] edge(b, a2)."]
QUERIES = ["1.0 predict.", "0.0 predict."]


def paths_db() -> relsql.Database:
    return facts_db(EXAMPLES, QUERIES)


def test_recursive_datalog_equals_neuralogic_once_deep_enough(neuralogic_workdir):
    deviations = compare_template(PATHS.format(depth=3), "/tmp", paths_db(), EXAMPLES, QUERIES, "query_predict", ("path",))
    assert deviations["outputs"] < 1e-6 and deviations["path"] < 1e-6 and deviations["gradients"] < 1e-6
    # one level fewer leaves out the longest path's atom: NeuraLogic's fixpoint has it, relsql not
    with pytest.raises(AssertionError):
        compare_template(PATHS.format(depth=2), "/tmp", paths_db(), EXAMPLES, QUERIES, "query_predict", ("path",))


@pytest.mark.parametrize("examples, depth", [("examples.txt", 1), ("texamples.txt", 2), ("texamples.txt", 4)])
def test_the_wheels_recursive_xor_template_equals_neuralogic(examples, depth, neuralogic_workdir):
    """NeuraLogic's own generalized XOR (simple/xor/generalized): xor_at(Y) reads xor_at(X) along
    hidden template facts *next(X, Y). Unrolled as deep as the longest chain (or deeper), equal."""
    from pathlib import Path

    import neuralogic

    from relsql.datasets.neuralogic_files import import_files

    folder = Path(neuralogic.__file__).parent / "utils" / "data" / "datasets" / "simple" / "xor" / "generalized"
    db = relsql.connect()
    import_files(db.con, str(folder / examples), None)
    text = f"% relsql: depth {depth}\n" + (folder / "template.txt").read_text()
    deviations = compare_template(text, str(folder), db, str(folder / examples), None, "query_xor_at", ("xor_at",))
    assert max(deviations.values()) < 1e-6


def test_levels_share_weights_and_the_last_keeps_the_name():
    template = relsql.Template.from_datalog(PATHS.format(depth=2))
    assert list(template.relations) == ["path_level0", "path_level1", "path", "predict"]
    assert [len(template.relations[n].rules) for n in ("path_level0", "path_level1", "path")] == [1, 2, 2]
    assert template.relations["path"].rules[1].refs == ["path_level1"]
    net = relsql.compile(template, paths_db(), dtype=torch.float64, seed=0)
    assert len(net.named_weights()) == 6  # the template's weights, not one set per level
    assert "path_level1" in net.explain()


RECURSIVE = """-- relsql: depth 3
CREATE TABLE reach AS SELECT n.id, linear(n.x, 4, 'w0') AS h FROM node n;
CREATE TABLE reach AS
SELECT e.dst AS id, avg(tanh(linear(r.h, 4, 'w1') + linear(t.x, 4, 'w2'))) AS h
FROM edge e JOIN reach r ON r.id = e.src JOIN node t ON t.id = e.dst
GROUP BY e.dst;
CREATE TABLE out AS SELECT r.id, linear(tanh(r.h), 1, 'out') AS h FROM reach r;
"""


def unrolled(depth: int) -> str:
    """RECURSIVE written out level by level, as a user would without recursion."""
    parts = ["CREATE TABLE reach0 AS SELECT n.id, linear(n.x, 4, 'w0') AS h FROM node n;"]
    for k in range(1, depth + 1):
        parts.append(f"CREATE TABLE reach{k} AS SELECT n.id, linear(n.x, 4, 'w0') AS h FROM node n;")
        parts.append(f"CREATE TABLE reach{k} AS SELECT e.dst AS id, avg(tanh(linear(r.h, 4, 'w1') + linear(t.x, 4, 'w2'))) AS h "
                     f"FROM edge e JOIN reach{k - 1} r ON r.id = e.src JOIN node t ON t.id = e.dst GROUP BY e.dst;")
    parts.append(f"CREATE TABLE out AS SELECT r.id, linear(tanh(r.h), 1, 'out') AS h FROM reach{depth} r;")
    return "\n".join(parts)


def graph(path) -> relsql.Database:
    db = relsql.connect(path)
    db.execute("CREATE TABLE node AS SELECT i AS id, [sin(i), cos(0.7 * i)] AS x, (i % 3 = 0) AS y FROM range(80) t(i)")
    db.execute("CREATE TABLE edge AS SELECT (i * 7) % 80 AS src, (i * 13 + 5) % 80 AS dst FROM range(240) t(i)")
    return db


def test_recursive_sql_equals_the_hand_unrolled_template(tmp_path):
    db = graph(tmp_path / "g.duckdb")
    ours = relsql.compile(relsql.Template.from_sql(RECURSIVE), db, dtype=torch.float64, seed=3)
    hand = relsql.compile(relsql.Template.from_sql(unrolled(3)), db, dtype=torch.float64, seed=3)
    a, b = ours.values("out").sort("id"), hand.values("out").sort("id")
    assert a["id"].to_list() == b["id"].to_list()
    assert np.allclose(np.array(a["value"].to_list()), np.array(b["value"].to_list()), atol=1e-12, rtol=0)
    ours()["out"].sum().backward()
    hand()["out"].sum().backward()
    for name, weight in ours.named_weights().items():
        assert torch.allclose(weight.grad, hand.named_weights()[name].grad, atol=1e-12, rtol=0), name
    # depth given as an option equals the comment; a different depth gives different values
    option = relsql.compile(relsql.Template.from_sql(RECURSIVE.replace("-- relsql: depth 3\n", ""), depth=3), db,
                            dtype=torch.float64, seed=3)
    assert option.values("out").sort("id").equals(a)
    shallow = relsql.compile(relsql.Template.from_sql(RECURSIVE.replace("depth 3", "depth 1")), db, dtype=torch.float64, seed=3)
    assert not np.allclose(np.array(shallow.values("out").sort("id")["value"].to_list()), np.array(a["value"].to_list()))


def test_a_database_table_named_like_a_level_is_still_read(tmp_path):
    """A table `reach_level0` that the template reads stays the table: the level is named apart."""
    db = graph(tmp_path / "g.duckdb")
    db.execute("CREATE TABLE reach_level0 AS SELECT id, [x[1] * 2] AS z FROM node")
    extra = " + linear(w.z, 1, 'side') AS h FROM reach r JOIN reach_level0 w ON w.id = r.id;"
    ours = RECURSIVE.replace(" AS h FROM reach r;", extra)
    hand = unrolled(3).replace(" AS h FROM reach3 r;", extra.replace("FROM reach r", "FROM reach3 r"))
    assert ours != RECURSIVE and hand != unrolled(3)
    template = relsql.Template.from_sql(ours)
    assert "reach_level0" not in template.relations and "reach_level0_2" in template.relations
    a = relsql.compile(template, db, dtype=torch.float64, seed=3).values("out").sort("id")
    b = relsql.compile(relsql.Template.from_sql(hand), db, dtype=torch.float64, seed=3).values("out").sort("id")
    assert np.allclose(np.array(a["value"].to_list()), np.array(b["value"].to_list()), atol=1e-12, rtol=0)
    db.close()


def test_recursive_model_trains_in_mini_batches_saves_and_loads(tmp_path):
    db = graph(tmp_path / "g.duckdb")
    kwargs = dict(target="node.y", seed=0, dtype=torch.float64, progress=False)
    template = relsql.Template.from_sql(RECURSIVE.replace("-- relsql: depth 3\n", ""), depth=2)
    full = relsql.Model(db, template, **kwargs).fit(epochs=3, lr=0.05)
    batched = relsql.Model(db, template, batch_size=10_000, **kwargs).fit(epochs=3, lr=0.05)
    for x, y in zip(full.history, batched.history):
        assert x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-10, abs=1e-12)
    small = relsql.Model(db, template, batch_size=16, **kwargs).fit(epochs=2, lr=0.05)
    saved = small.save(tmp_path / "recursive.pt")  # the depth given as an option travels in the source
    assert relsql.Model.load(saved, db).predict().equals(small.predict())
    db.close()


TWO = """CREATE TABLE a AS SELECT n.id, linear(n.x, 2, 'base') AS h FROM node n;
CREATE TABLE b AS SELECT e.dst AS id, sum(linear(a.h, 2, 'ab')) AS h FROM edge e JOIN a ON a.id = e.src GROUP BY e.dst;
CREATE TABLE a AS SELECT e.dst AS id, sum(tanh(linear(b.h, 2, 'ba'))) AS h FROM edge e JOIN b ON b.id = e.src GROUP BY e.dst;
CREATE TABLE out AS SELECT a.id, linear(a.h, 1, 'out') AS h FROM a;
"""


def test_a_cycle_of_two_relations_unrolls_in_step(tmp_path):
    """a reads b, b reads a: level k of each reads level k - 1 of the other; b has no base rule,
    so its level 0 is empty and a's level 1 gets only its base rule."""
    template = relsql.Template.from_sql(TWO, depth=2)
    assert list(template.relations) == ["a_level0", "a_level1", "a", "b_level1", "b", "out"]
    assert template.relations["b"].rules[0].refs == ["a_level1"] and template.relations["a"].rules[1].refs == ["b_level1"]
    assert template.relations["b_level1"].rules[0].refs == ["a_level0"] and len(template.relations["a_level1"].rules) == 1
    db = graph(tmp_path / "g.duckdb")
    net = relsql.compile(template, db, dtype=torch.float64, seed=1)
    x = torch.tensor([[np.sin(i), np.cos(0.7 * i)] for i in range(80)], dtype=torch.float64)
    edges = db.con.execute("SELECT src, dst FROM edge").fetchall()
    w = net.named_weights()

    def over_edges(values: dict[int, torch.Tensor], fn) -> dict[int, torch.Tensor]:  # sum per destination
        found: dict[int, torch.Tensor] = {}
        for src, dst in edges:
            if src in values:
                found[dst] = found.get(dst, 0) + fn(values[src])
        return found

    a0 = {i: w["base"] @ x[i] for i in range(80)}  # a_level0 and a_level1 (b has no level 0)
    b1 = over_edges(a0, lambda v: w["ab"] @ v)
    a = {i: w["base"] @ x[i] + over_edges(b1, lambda v: torch.tanh(w["ba"] @ v)).get(i, 0) for i in range(80)}
    out = net.values("out")
    for node, value in zip(out["id"].to_list(), out["value"].to_list()):
        assert torch.allclose(torch.tensor(value, dtype=torch.float64), (w["out"] @ a[node]).detach(), atol=1e-12), node


@pytest.mark.parametrize("make, needles", [
    (lambda: relsql.Template.from_sql(RECURSIVE.replace("-- relsql: depth 3\n", "")),
     ["recursive template", "reach -> reach", "depth"]),
    (lambda: relsql.Template.from_sql(RECURSIVE, depth=2), ["depth=2 disagrees", "depth 3"]),
    (lambda: relsql.Template.from_sql(RECURSIVE.replace("depth 3", "depth 0")), ["from 1 to 64", "'0'"]),
    (lambda: relsql.Template.from_sql(RECURSIVE.replace("depth 3", "depth three")), ["whole number", "three"]),
    (lambda: relsql.Template.from_sql(RECURSIVE, depth=True), ["whole number", "True"]),
    (lambda: relsql.Template.from_sql("-- relsql: depth 2\n-- relsql: depth 3\n" + RECURSIVE), ["more than once"]),
    (lambda: relsql.Template.from_datalog("% relsql: depth 2\nh(X) :- g(X).\ng(X) :- h(X)."), ["no base rule", "h -> g -> h"]),
])
def test_recursion_errors_name_the_fix(make, needles):
    with pytest.raises(relsql.TemplateError) as info:
        make()
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_a_recursive_statement_may_come_first_and_a_subquery_read_is_recursion_too(tmp_path):
    """Statements are read as declared anywhere in the template: the recursive statement before
    its base one gives the same relation; reading oneself only in a subquery is recursion too."""
    db = graph(tmp_path / "g.duckdb")
    base, recursive, out = RECURSIVE.replace("-- relsql: depth 3\n", "").strip().split(";\n")[:3]
    first = relsql.compile(relsql.Template.from_sql(f"{recursive};\n{base};\n{out}", depth=3), db, dtype=torch.float64, seed=3)
    second = relsql.compile(relsql.Template.from_sql(RECURSIVE), db, dtype=torch.float64, seed=3)
    one, two = first.values("out").sort("id"), second.values("out").sort("id")
    assert one["id"].to_list() == two["id"].to_list()  # the same rows; values to rounding (GEMM layouts differ)
    assert torch.allclose(torch.tensor(one["value"].to_list()), torch.tensor(two["value"].to_list()), rtol=0, atol=1e-12)
    filtered = (f"{base};\nCREATE TABLE reach AS SELECT n.id, linear(n.x, 4, 'w3') AS h FROM node n "
                f"WHERE n.id IN (SELECT q.id FROM reach q);\n{out}")
    with pytest.raises(relsql.TemplateError, match="reach -> reach"):
        relsql.Template.from_sql(filtered)
    assert list(relsql.Template.from_sql(filtered, depth=1).relations) == ["reach_level0", "reach", "out"]


def test_every_relation_of_a_cycle_must_reach_the_depth():
    """a -> b -> c -> a with a base rule in a only: at depth 1, c has no rule yet (it reads b's
    level 0, which does not exist): refused rather than left reading the unrolled b."""
    three = TWO.replace("CREATE TABLE a AS SELECT e.dst AS id, sum(tanh(linear(b.h, 2, 'ba'))) AS h FROM edge e JOIN b ON",
                        "CREATE TABLE c AS SELECT e.dst AS id, sum(linear(b.h, 2, 'bc')) AS h FROM edge e JOIN b ON "
                        "b.id = e.src GROUP BY e.dst;\nCREATE TABLE a AS SELECT e.dst AS id, sum(tanh(linear(c.h, 2, 'ca'))) "
                        "AS h FROM edge e JOIN c ON").replace("JOIN c ON b.id", "JOIN c ON c.id")
    assert "'ca'" in three and "'bc'" in three
    with pytest.raises(relsql.TemplateError, match="`c`: no rule reaches depth 1"):
        relsql.Template.from_sql(three, depth=1)
    deep = relsql.Template.from_sql(three, depth=3)
    assert deep.relations["c"].rules[0].refs == ["b_level2"] and deep.relations["a"].rules[1].refs == ["c_level2"]
