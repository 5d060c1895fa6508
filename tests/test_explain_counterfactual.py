"""Explanations against a planted signal two hops away: the planted table.column ranks first, and
deleting each row's most attributed rows (in a copy of the database) moves its prediction more
than deleting as many random rows of the same table."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

import relsql

TEMPLATE = """
CREATE TABLE grand_h AS
SELECT g.id, tanh(linear(g.x, 4, 'gx') + linear(g.noise, 4, 'gn')) AS h FROM grandchild g;

CREATE TABLE child_h AS
SELECT c.id, tanh(linear(avg(h.h), 4, 'cg') + linear(avg(c.noise), 4, 'cn')) AS h
FROM child c JOIN grandchild g ON g.child_id = c.id JOIN grand_h h ON h.id = g.id
GROUP BY c.id;

CREATE TABLE predict AS
SELECT p.id, linear(avg(h.h), 1, 'out') + linear(avg(p.z), 1, 'pz') AS h
FROM parent p JOIN child c ON c.parent_id = p.id JOIN child_h h ON h.id = c.id
GROUP BY p.id;
"""

TABLES = {"parent": "id INTEGER PRIMARY KEY, z DOUBLE, y DOUBLE",
          "child": "id INTEGER PRIMARY KEY, parent_id INTEGER, noise DOUBLE",
          "grandchild": "id INTEGER PRIMARY KEY, child_id INTEGER, x DOUBLE, noise DOUBLE"}


def _tables(seed: int = 0) -> dict[str, list[tuple]]:
    """y = the sum of x over the parent's grandchildren (two hops away); z and both noise columns are noise."""
    rng = np.random.default_rng(seed)
    parents, children, grand = [], [], []
    for p in range(120):
        total = 0.0
        for _ in range(int(rng.integers(1, 4))):
            c = len(children)
            children.append((c, p, float(rng.normal())))
            for _ in range(int(rng.integers(1, 4))):
                x = float(rng.normal())
                total += x
                grand.append((len(grand), c, x, float(rng.normal())))
        parents.append((p, float(rng.normal()), total))
    return {"parent": parents, "child": children, "grandchild": grand}


def _database(rows: dict[str, list[tuple]], dropped: set[int] = frozenset()) -> relsql.Database:
    db = relsql.connect()
    for table, columns in TABLES.items():
        db.con.execute(f'CREATE TABLE "{table}" ({columns})')
        kept = [r for r in rows[table] if table != "grandchild" or r[0] not in dropped]
        db.con.executemany(f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(kept[0]))})', kept)
    return db


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    rows = _tables()
    db = _database(rows)
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="parent.y", seed=0, dtype=torch.float64,
                         progress=False)
    model.fit(epochs=300, lr=0.02, patience=300, refit=False)
    path = model.save(tmp_path_factory.mktemp("planted") / "m.pt")
    return rows, model, path


def test_planted_column_ranks_first(trained):
    _, model, _ = trained
    summary = relsql.explain_summary(model.explain(where="id < 40"), model)
    columns = summary.filter(pl.col("kind") == "column").sort("mean_abs_attribution", descending=True)
    assert columns["name"][0] == "grandchild.x"
    assert columns["share"][0] > 0.5


def test_removing_top_rows_moves_prediction_more_than_random(trained):
    rows, model, path = trained
    explained = list(range(0, 40, 2))
    explanation = model.explain(keys={"id": explained})
    rng = np.random.default_rng(1)
    of_parent: dict[int, list[int]] = {}
    parent_of_child = {c: p for c, p, _ in rows["child"]}
    for g, c, _, _ in rows["grandchild"]:
        of_parent.setdefault(parent_of_child[c], []).append(g)
    before = dict(model.predict(keys={"id": explained}).select("id", "prediction").iter_rows())
    top_moves, random_moves = [], []
    for pid in explained:
        mine = explanation.filter((pl.col("id") == pid) & (pl.col("table") == "grandchild"))
        ranked = mine.group_by("row_key").agg(pl.col("attribution").sum().abs()).sort("attribution", descending=True)
        k = max(1, len(of_parent[pid]) // 2)
        if k == len(of_parent[pid]):  # removing every grandchild drops the parent's groundings: keep one
            continue
        top = {int(r) for r in ranked["row_key"].head(k)}
        chance = {int(g) for g in rng.choice(of_parent[pid], size=k, replace=False)}
        for dropped, moves in ((top, top_moves), (chance, random_moves)):
            copy = _database(rows, dropped)
            after = relsql.Model.load(path, copy).predict(keys={"id": [pid]})["prediction"][0]
            moves.append(abs(after - before[pid]))
    assert len(top_moves) >= 5
    assert np.mean(top_moves) > np.mean(random_moves)
