"""The grounding store (relsql/ground/store.py): bulk groundings read per batch without the
database, equal to grounding the batch in the database; seeded fan-out; reuse while the data
is unchanged and rebuild when it changed; never a stale or foreign store."""

from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import relsql
from relsql.ground.demand import BatchGrounder
from relsql.ground.store import MANIFEST, GroundingStore

ROOT = Path(__file__).resolve().parent.parent


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


class _NoDatabase:
    """Stands in for the DuckDB connection: any use is a failure."""

    def __getattr__(self, name):
        raise AssertionError(f"the database was used per batch ({name})")


def _same(a, b) -> None:
    """Two batch groundings are equal: rows, and per rule heads, row ids and values."""
    assert set(a.relations) == set(b.relations)
    for name in a.relations:
        assert torch.equal(a.rows[name], b.rows[name]), name
        ours, theirs = a.relations[name].rules, b.relations[name].rules
        assert [r.rule.origin for r in ours] == [r.rule.origin for r in theirs], name
        for x, y in zip(ours, theirs):
            assert torch.equal(x.head, y.head) and torch.equal(x.offsets, y.offsets), name
            assert all(torch.equal(p, r) for p, r in zip(x.refs, y.refs)), name
            assert set(x.columns) == set(y.columns)
            for k in x.columns:
                assert torch.equal(x.columns[k].to(torch.float64), y.columns[k].to(torch.float64)), (name, k)


def test_store_batches_equal_batches_grounded_in_the_database(molecules, tmp_path):
    tpl = relsql.Template.from_file(relsql.sql_templates.path("mutagenesis"))
    grounder = quiet(BatchGrounder, tpl, molecules, "predict", progress=False)
    store = GroundingStore.open(grounder, tmp_path / "store", progress=False)
    expected = {tuple(rows): grounder.ground(rows) for rows in
                [np.array([0, 5, 17]), np.array([3]), np.arange(grounder.sizes["predict"]),
                 np.random.default_rng(0).choice(grounder.sizes["predict"], 40, replace=False)]}
    connection, grounder.db.con = grounder.db.con, _NoDatabase()
    try:  # per batch, the store alone: no database work
        for rows, batch in expected.items():
            _same(store.ground(np.array(rows)), batch)
    finally:
        grounder.db.con = connection
    sizes = store.sizes
    assert sizes["predict"]["rows"] == grounder.sizes["predict"]
    assert all(v["groundings"] >= v["rows"] for v in sizes.values() if v["rows"])


def test_store_fanout_is_capped_seeded_and_independent_of_the_batch(molecules):
    tpl = relsql.Template.from_file(relsql.sql_templates.path("mutagenesis"))
    exact = GroundingStore.open(quiet(BatchGrounder, tpl, molecules, "predict", progress=False), progress=False)
    capped = GroundingStore.open(quiet(BatchGrounder, tpl, molecules, "predict", fanout=2, seed=3, progress=False),
                                 progress=False)
    rows = np.arange(20)
    full, first = exact.ground(rows), capped.ground(rows, sample=0)
    again, other = capped.ground(rows, sample=0), capped.ground(rows, sample=1)
    grouped = [(n, i) for n, r in full.relations.items() for i, g in enumerate(r.rules) if g.rule.grouped]
    assert grouped
    cut = False
    for name, i in grouped:
        counts = first.relations[name].rules[i].offsets.diff()
        assert int(counts.max()) <= 2, name
        assert torch.equal(first.relations[name].rules[i].refs[0], again.relations[name].rules[i].refs[0])
        cut |= int(full.relations[name].rules[i].offsets.diff().max()) > 2
        if name == "predict":  # the batch's own heads: each keeps min(its groundings, 2)
            kept, whole = first.relations[name].rules[i], full.relations[name].rules[i]
            assert torch.equal(kept.offsets.diff(), whole.offsets.diff().clamp(max=2))
    assert cut
    assert any(not torch.equal(first.relations[n].rules[i].refs[0], other.relations[n].rules[i].refs[0]) for n, i in grouped)
    # a head's sample does not depend on the other rows of its batch
    name = "predict"
    alone = capped.ground(np.array([7]), sample=0)
    together = capped.ground(np.array([7, 2, 11]), sample=0)
    pick = together.relations[name].rules[0]
    row = int(torch.searchsorted(together.rows[name], torch.tensor(7)))
    mine = pick.refs[0][pick.head == row]
    ref = pick.rule.refs[0]
    assert torch.equal(together.rows[ref][mine], alone.rows[ref][alone.relations[name].rules[0].refs[0]])


SHOP = """
CREATE TABLE pred AS
SELECT i.id, linear(tanh(embed(i.user_id, 4, 'user', storage='{storage}') + linear(features(i.x), 4, 'wx')), 1, 'out') AS h
FROM item i;
"""


def _shop(path: Path | None = None, users: int = 300, key: str = "BIGINT") -> relsql.Database:
    db = relsql.connect(path) if path else relsql.connect()
    db.execute(f"CREATE TABLE item AS SELECT i AS id, ((i * 7919) % {users})::{key} AS user_id, (i % 13) * 0.1 AS x, "
               f"((i * 7919) % {users}) % 3 = 0 AS y FROM range(2000) t(i)")
    return db


@pytest.mark.parametrize("key", ["BIGINT", "VARCHAR"])
def test_database_embeddings_train_the_same_with_and_without_a_store(tmp_path, key):
    trained = []
    for store in (True, False):
        db = _shop(tmp_path / f"{store}.duckdb", key=key)
        model = quiet(relsql.Model, db, relsql.Template.from_sql(SHOP.format(storage="database")), target="item.y",
                      seed=0, batch_size=256, dtype=torch.float64, progress=False, store=store)
        quiet(model.fit, epochs=3, lr=0.05)
        rows = db.con.execute("SELECT key::VARCHAR, e0, e3 FROM relsql_embedding_user ORDER BY key::VARCHAR").fetchall()
        trained.append((model.history, rows))
        db.close()
    (h1, r1), (h2, r2) = trained
    assert [r[0] for r in r1] == [r[0] for r in r2] and len(r1) == 300
    assert np.allclose([r[1:] for r in r1], [r[1:] for r in r2], rtol=1e-10, atol=1e-12)
    for a, b in zip(h1, h2):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-10)


def test_a_kept_store_is_reused_while_the_data_is_unchanged_and_rebuilt_when_it_changed(tmp_path):
    db = _shop()
    folder = tmp_path / "store"
    template = relsql.Template.from_sql(SHOP.format(storage="memory"))

    def model():
        return quiet(relsql.Model, db, template, target="item.y", seed=0, batch_size=500, progress=False, store=folder)

    first = model()
    built = (folder / MANIFEST).stat().st_mtime_ns
    assert json.loads((folder / MANIFEST).read_text())["relations"]["pred"]["rows"] == 2000
    second = model()
    assert (folder / MANIFEST).stat().st_mtime_ns == built  # reused, not rebuilt
    assert second.output_rows == first.output_rows == 2000
    db.execute("INSERT INTO item VALUES (2000, 1, 0.5, false)")  # the user's data changed
    third = model()
    assert (folder / MANIFEST).stat().st_mtime_ns != built
    assert json.loads((folder / MANIFEST).read_text())["relations"]["pred"]["rows"] == 2001
    assert third.output_rows == 2001
    db.execute("UPDATE item SET x = x + 1 WHERE id = 3")  # same row count, other values: rebuilt too
    before = (folder / MANIFEST).stat().st_mtime_ns
    model()
    assert (folder / MANIFEST).stat().st_mtime_ns != before


def test_a_temporary_store_goes_with_its_model_and_bad_stores_are_refused(tmp_path):
    db = _shop()
    template = relsql.Template.from_sql(SHOP.format(storage="memory"))
    model = quiet(relsql.Model, db, template, target="item.y", seed=0, batch_size=500, progress=False)
    folder = model.batched.grounding_store.folder
    assert (folder / MANIFEST).exists()
    del model
    gc.collect()
    assert not folder.exists()
    broken = tmp_path / "broken"
    quiet(relsql.Model, db, template, target="item.y", batch_size=500, progress=False, store=broken)
    (broken / MANIFEST).write_text("{not json")  # a store of relsql's whose manifest was damaged
    with pytest.raises(relsql.RelsqlError, match="cannot be read"):
        quiet(relsql.Model, db, template, target="item.y", batch_size=500, progress=False, store=broken)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(relsql.RelsqlError, match="is a file"):
        quiet(relsql.Model, db, template, target="item.y", batch_size=500, progress=False, store=a_file)
    with pytest.raises(relsql.RelsqlError, match="store must be"):
        quiet(relsql.Model, db, template, target="item.y", batch_size=500, progress=False, store=3)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.c1").write_text("a user's file")  # a folder of the user's: refused, left alone
    with pytest.raises(relsql.RelsqlError, match="not empty"):
        quiet(relsql.Model, db, template, target="item.y", batch_size=500, progress=False, store=mine)
    assert [f.name for f in mine.iterdir()] == ["notes.c1"] and (mine / "notes.c1").read_text() == "a user's file"


def test_explain_with_a_batch_size_shows_the_store_and_a_batch(tmp_path, capsys):
    import duckdb

    from relsql.cli import main
    from relsql.datasets.mutagenesis import load

    path = tmp_path / "mutagenesis.duckdb"
    con = duckdb.connect(str(path))
    load(con)
    con.close()
    assert main(["explain", str(path), "--template", str(relsql.sql_templates.path("mutagenesis")), "--batch-size", "32"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ") and "|" in line}
    molecules = duckdb.connect(str(path), read_only=True).execute("SELECT count(*) FROM molecule").fetchone()[0]
    assert lines["predict"][1] == f"{molecules:,}"  # every molecule is a row of the store
    assert lines["predict"][5] == "32"  # a batch of 32 molecules reads those 32 rows
    assert "the plan of one batch of 32 rows" in out and "outputs: predict=" in out


def test_a_damaged_store_is_a_clear_error(tmp_path):
    db = _shop()
    template = relsql.Template.from_sql(SHOP.format(storage="memory"))
    folder = tmp_path / "store"
    quiet(relsql.Model, db, template, target="item.y", batch_size=500, progress=False, store=folder)
    column = next(folder.rglob("*.c1"))  # in the build's own subfolder
    column.write_bytes(column.read_bytes()[:100])  # cut short behind relsql's back
    with pytest.raises(relsql.RelsqlError, match="damaged.*delete the folder"):
        quiet(relsql.Model, db, template, target="item.y", batch_size=500, progress=False, store=folder)


def test_unique_inverse_matches_numpy():
    """The batch's row ids and each reference's batch row number, against np.unique."""
    from relsql.ground.store.read import unique_inverse

    rng = np.random.default_rng(5)
    for values in (rng.integers(0, 50, 400), rng.integers(0, 10**12, 1000), np.zeros(0, np.int64), np.array([7, 7, 7])):
        expected, expected_inverse = np.unique(values, return_inverse=True)
        got, inverse = unique_inverse(values)
        assert np.array_equal(got, expected) and np.array_equal(inverse, expected_inverse.reshape(-1))
        assert np.array_equal(got[inverse], values)
