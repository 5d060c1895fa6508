"""The index query of rules that never aggregate sorts by (rule, head) only (`one_per_head`): such a
rule has at most one grounding per head, so (rule, head) orders its rows totally. Its groundings
must be those of the full sort (every id and column), on a hand-written template and on
Template.auto's, with NULLs, ties and rows inserted out of key order."""

from __future__ import annotations

import warnings

import duckdb
import pytest
import torch

import relsql
from relsql import sql as q
from relsql.ground import execute as ex

HAND = """
CREATE TABLE enc_item AS
SELECT t.id, tanh(linear(ple(t.price, t.qty, 4), 4, 'w_num') + embed(t.grp, 4, 'w_grp')) AS h
FROM item t;
CREATE TABLE f_item AS
SELECT t.id, linear(features(t.price), 4, 'w_ff') AS h FROM item t WHERE t.qty > 1;
CREATE TABLE predict AS
SELECT s.sale_id, avg(linear(e.h + f.h, 1, 'w_out')) AS h
FROM sale s JOIN enc_item e ON e.id = s.item_id JOIN f_item f ON f.id = s.item_id
GROUP BY s.sale_id;
"""


def _db(path) -> relsql.Database:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE item(id INTEGER PRIMARY KEY, grp VARCHAR, price DOUBLE, qty INTEGER)")
    con.execute("INSERT INTO item SELECT (i * 37) % 101, CASE WHEN i % 9 = 0 THEN NULL ELSE ['a', 'b'][1 + i % 2] END, "
                "CASE WHEN i % 7 = 0 THEN NULL ELSE (i % 5) * 2.5 END, i % 4 FROM range(101) r(i)")
    con.execute("CREATE TABLE sale(sale_id INTEGER PRIMARY KEY, item_id INTEGER REFERENCES item(id), amount DOUBLE, "
                "big BOOLEAN)")
    con.execute("INSERT INTO sale SELECT i, (i * 13) % 101, (i * 31) % 97 / 3.0, i % 3 = 0 FROM range(400) r(i)")
    con.close()
    return relsql.connect(path)


def _ground(template, db, monkeypatch, full_sort: bool) -> ex.Grounding:
    with monkeypatch.context() as patch:
        if full_sort:  # every index query sorted by all its columns, as before `one_per_head`
            full = q.relation_index_query
            patch.setattr(q, "relation_index_query", lambda *args, one_per_head=False, **kw: full(*args, **kw))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ex.ground(template, db, progress=False)


@pytest.mark.parametrize("auto", [False, True])
def test_sorting_by_rule_and_head_gives_the_full_sorts_groundings(tmp_path, monkeypatch, auto):
    db = _db(tmp_path / "s.duckdb")
    template = relsql.Template.auto(db, target="sale.big") if auto else relsql.Template.from_sql(HAND)
    new, old = (_ground(template, db, monkeypatch, full_sort) for full_sort in (False, True))
    assert any(not r.rule.grouped and r.size > 1 for g in new.relations.values() for r in g.rules)
    assert list(new.relations) == list(old.relations)
    for name, relation in new.relations.items():
        before = old.relations[name]
        assert relation.keys.equals(before.keys), name
        for rule, was in zip(relation.rules, before.rules, strict=True):
            for a, b in [(rule.head, was.head), (rule.segment_heads, was.segment_heads), (rule.offsets, was.offsets),
                         *zip(rule.refs, was.refs, strict=True)]:
                assert torch.equal(a, b), (name, rule.rule.origin)
            assert rule.columns.keys() == was.columns.keys()
            assert all(torch.equal(rule.columns[k], was.columns[k]) for k in rule.columns), name
    assert new.feature_stats == old.feature_stats
