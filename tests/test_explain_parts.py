"""Model.explain over the asked rows' groundings only: the plan an explanation builds follows the
rows explained (not the database), models trained or loaded in mini-batches (and with embeddings
stored in the database) are explained from their batch groundings, and a multi-class target's
scores are explained class by class. Checked against the whole grounding's explanation, predict(),
and the completeness of every row."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

import relsql
from relsql.explain import asked, relation
from tests.test_explain import DEEP, _model, on_file, small  # noqa: F401  (small: the fixture)

KEYS = ["id", "table", "row_key", "column", "relation", "rule"]


def _same(a: pl.DataFrame, b: pl.DataFrame, tol: float) -> None:
    """The same attribution rows, each equal to `tol`."""
    assert a.height == b.height and a.height > 0
    joined = a.join(b, on=KEYS, how="inner", nulls_equal=True)
    assert joined.height == a.height
    for column in ("attribution", "output", "baseline"):
        assert float((joined[column] - joined[f"{column}_right"]).abs().max()) <= tol


@pytest.fixture
def plans(monkeypatch) -> list[int]:
    """The float elements of every plan an explanation runs (one integration point's values)."""
    seen: list[int] = []

    class Recording(relation.Runner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.elements)

    monkeypatch.setattr(relation, "Runner", Recording)
    return seen


def test_a_few_rows_run_a_plan_of_their_own_groundings(small, plans):  # noqa: F811
    model = _model(small, DEEP)
    every = model.explain(steps=16)
    whole = plans.pop()
    few = model.explain(keys={"id": [3, 7]}, steps=16)
    assert plans[-1] * 5 < whole  # 2 of 40 parents: a plan of their children, not the database's
    _same(few, every.filter(pl.col("id").is_in([3, 7])), 1e-12)


def test_rows_in_several_parts_equal_one_part(small, monkeypatch):  # noqa: F811
    model = _model(small, DEEP)
    one = model.explain(steps=16)
    monkeypatch.setattr(asked, "ROWS_PER_PART", 7)
    parts = model.explain(steps=16)
    assert parts["id"].unique(maintain_order=True).to_list() == one["id"].unique(maintain_order=True).to_list()
    _same(parts, one, 1e-12)


def test_a_model_loaded_in_mini_batches_explains_as_the_whole(small, tmp_path):  # noqa: F811
    model = _model(small, DEEP)
    model.save(tmp_path / "m.pt")
    loaded = relsql.Model.load(tmp_path / "m.pt", small, batch_size=8)
    assert loaded.learner.mini_batches
    _same(loaded.explain(keys={"id": [3, 7, 11]}, steps=16), model.explain(keys={"id": [3, 7, 11]}, steps=16), 1e-12)


def test_embeddings_stored_in_the_database_are_explained(small):  # noqa: F811
    template = DEEP.replace("embed(c.kind, 3, 'ek')", "embed(c.id, 3, 'ek', storage='database')")
    model = relsql.Model(small, relsql.Template.from_sql(template), target="parent.y", seed=0, dtype=torch.float64,
                         progress=False, batch_size=8).fit(epochs=3, refit=False)
    explanation = model.explain(where="id < 6")
    totals = explanation.group_by("id").agg(pl.col("attribution").sum(), pl.col("output").first(),
                                            pl.col("baseline").first()).sort("id")
    assert np.abs(totals["attribution"] - (totals["output"] - totals["baseline"])).max() < 1e-6  # completeness
    probability = model.predict(where="id < 6").sort("id")["probability"].to_numpy()
    assert np.allclose(1 / (1 + np.exp(-totals["output"].to_numpy())), probability, atol=1e-12)
    read = explanation.filter(pl.col("column") == "id")  # each child's own stored row, attributed to that child
    children = dict(small.con.execute("SELECT id, parent_id FROM child WHERE parent_id < 6").fetchall())
    assert set(read["row_key"].to_list()) == {str(c) for c in children}
    assert all(children[int(k)] == p for k, p in zip(read["row_key"], read["id"]))


MULTI = """
CREATE TABLE predict AS
SELECT p.id, linear(avg(tanh(linear(c.x, 4, 'wx') + embed(c.kind, 4, 'ek'))), 3, 'out') + linear(avg(p.z), 3, 'wz') AS h
FROM parent p JOIN child c ON c.parent_id = p.id
GROUP BY p.id;
"""


def test_each_class_score_of_a_multi_class_target(small):  # noqa: F811
    small.con.execute("CREATE OR REPLACE TABLE parent3 AS SELECT id, z, CASE WHEN z < -0.4 THEN 'low' WHEN z < 0.4 "
                      "THEN 'mid' ELSE 'high' END AS band FROM parent")
    template = MULTI.replace("parent p", "parent3 p")
    model = relsql.Model(small, relsql.Template.from_sql(template), target="parent3.band", seed=0, dtype=torch.float64,
                         progress=False).fit(epochs=5, refit=False)
    predicted = model.predict(where="id < 10").sort("id")
    probabilities = np.array(predicted["probabilities"].to_list())
    assert probabilities.shape == (10, 3)
    scores = []
    for unit in range(3):
        explanation = model.explain(where="id < 10", unit=unit)
        totals = explanation.group_by("id").agg(pl.col("attribution").sum(), pl.col("output").first(),
                                                pl.col("baseline").first()).sort("id")
        assert np.abs(totals["attribution"] - (totals["output"] - totals["baseline"])).max() < 1e-6
        scores.append(totals["output"].to_numpy())
    logits = np.stack(scores, axis=1)
    softmax = np.exp(logits - logits.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    assert np.allclose(softmax, probabilities, atol=1e-9)  # the classes in predict()'s order
    default = model.explain(where="id < 10").group_by("id").agg(pl.col("output").first()).sort("id")["output"].to_numpy()
    assert np.allclose(default, logits.max(1), atol=1e-12)  # by default: the predicted class's score
    with pytest.raises(relsql.RelsqlError, match="unit"):
        model.explain(keys={"id": [1]}, unit=3)


def test_cli_explains_a_model_with_stored_embeddings_in_mini_batches(small, tmp_path, capsys):  # noqa: F811
    from relsql.cli import main

    path = tmp_path / "small.duckdb"
    db = on_file(small, path)
    template = DEEP.replace("embed(c.kind, 3, 'ek')", "embed(c.id, 3, 'ek', storage='database')")
    model = relsql.Model(db, relsql.Template.from_sql(template), target="parent.y", seed=0, dtype=torch.float64,
                         progress=False, batch_size=8).fit(epochs=2, refit=False)
    expected = model.explain(where="id < 5")
    model.save(tmp_path / "m.pt")
    db.con.close()
    args = ["explain-prediction", str(path), "--model", str(tmp_path / "m.pt"), "--where", "id < 5", "--batch-size", "8"]
    assert main([*args, "--unit", "1"]) == 1  # a binary target has one score
    assert "unit" in capsys.readouterr().err
    assert main([*args, "--table", "why"]) == 0
    again = relsql.connect(path)
    written = pl.from_arrow(again.arrow('SELECT * FROM "why"'))
    again.con.close()
    _same(written, expected, 1e-12)
