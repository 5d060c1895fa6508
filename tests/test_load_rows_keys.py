"""A loaded model's predict(keys=) over a target with a composite key (relsql/train/learner/results.py,
`BatchGrounder(rows_only=True).restrict`): its rows, predictions and split column equal a full
predict()'s of the same rows (the built model's; on another database, the loaded model's own
predict() of every row, which builds the whole grounding), keys absent from the table are the
usual error, and a model whose split is not kept there restricts the key tables all the same."""

from __future__ import annotations

import shutil

import numpy as np
import polars as pl
import pytest
import torch

import relsql
from tests.test_model import insert_rows

# `g.season = g.season` and `s.team = s.team`: equalities of a column with itself, which the
# candidate queries leave out (relsql/ground/closure.py); w_park's dictionary (min_count: fixed
# when built, with a rare value) is made from the file alone (`BatchGrounder.dictionary`), w_team's
# as a full model's
TEMPLATE = """
CREATE TABLE game_h AS
SELECT g.game_id,
       tanh(linear(features(g.runs), 6, 'w_game') + embed(g.park, 6, 'w_park', min_count=2) + embed(g.team, 6, 'w_team'))
FROM games g;
CREATE TABLE season_games AS
SELECT s.team, s.season, avg(gh.h)
FROM seasons s JOIN games g ON g.team = s.team AND g.season = s.season AND g.season = g.season
JOIN game_h gh ON gh.game_id = g.game_id
WHERE s.team = s.team
GROUP BY s.team, s.season;
CREATE TABLE predict AS
SELECT s.team, s.season, linear(avg(sg.h), 3, 'w_out')
FROM seasons s JOIN season_games sg ON sg.team = s.team AND sg.season = s.season GROUP BY s.team, s.season;
"""

TEAMS = ["BOS", "CHI", "NYA", "SFN", "LAN"]


def _build(path):
    rng = np.random.default_rng(3)
    db = relsql.connect(path)
    db.execute("CREATE TABLE seasons(team VARCHAR, season INT, won BOOLEAN, PRIMARY KEY (team, season))")
    db.execute("CREATE TABLE games(game_id INT PRIMARY KEY, team VARCHAR, season INT, runs DOUBLE, park VARCHAR)")
    seasons, games = [], []
    for i, team in enumerate(TEAMS):
        for season in range(2000, 2000 + 12 + i):  # not every team has every season: (BOS, 2014) is absent
            runs = rng.normal(4.5, 1.5, int(rng.integers(1, 5)))
            for r in runs:
                games.append((len(games), team, season, float(r), "dome" if not games else ["home", "away"][len(games) % 2]))
            won = None if (i + season) % 9 == 0 else bool(runs.mean() > 4.5)
            seasons.append((team, season, won))
    insert_rows(db, "seasons", seasons)
    insert_rows(db, "games", games)
    return db


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("load_rows_keys")
    db = _build(folder / "seasons.duckdb")
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="seasons.won", seed=4, dtype=torch.float64,
                         progress=False)
    model.fit(epochs=2, hybrid=False)
    path = model.save(folder / "m.pt")
    expected = model.predict()
    db.con.close()
    return folder, path, expected


def _asked(expected: pl.DataFrame) -> pl.DataFrame:
    """Some rows in an order of their own: labelled and unlabelled, each team, one season twice over teams."""
    picked = expected.filter((pl.col("season") * 7 + pl.col("team").str.len_chars()) % 5 == 0)
    return picked.sort("season", "team", descending=[True, False]).select("team", "season")


def test_composite_keys_as_the_full_predict(saved):
    folder, path, expected = saved
    db = relsql.connect(folder / "seasons.duckdb", read_only=True)
    loaded = relsql.Model.load(path, db)
    asked = _asked(expected)
    got = loaded.predict(keys=asked)
    assert got.select("team", "season").equals(asked)
    want = asked.join(expected, on=["team", "season"], how="left")  # the built model's rows, in the asked order
    np.testing.assert_allclose(got["probability"].to_numpy(), want["probability"].to_numpy(), rtol=0, atol=1e-12)
    assert got["split"].to_list() == want["split"].to_list()
    assert "train" in want["split"].to_list() and None in want["split"].to_list()
    grounder = loaded.learner.pending.rows_batched.grounder
    assert grounder.rows_only and grounder.sizes["predict"] == asked.height < expected.height
    # each column's value exists, the pair does not: BOS has no 2014; and a team that is nowhere
    for team, season in (["BOS", "LAN"], [2014, 2003]), (["CHI", "XXX"], [2001, 2001]):
        with pytest.raises(relsql.RelsqlError, match="not rows the model predicts"):
            loaded.predict(keys={"team": team, "season": season})
    again = loaded.predict(keys={"team": ["SFN"], "season": [2005]})  # the model still answers after the errors
    row = expected.filter((pl.col("team") == "SFN") & (pl.col("season") == 2005))
    np.testing.assert_allclose(again["probability"].to_numpy(), row["probability"].to_numpy(), rtol=0, atol=1e-12)
    db.close()


def test_split_not_kept_still_restricted(saved):
    """On a database with fewer labelled rows the saved split is not kept (a warning): every row's
    split is None, so the key tables are restricted to the asked rows, not filled whole. A park
    value unseen in training reads w_park's rare row there as in the full predict()."""
    folder, path, _ = saved
    other = folder / "other.duckdb"
    shutil.copy(folder / "seasons.duckdb", other)
    db = relsql.connect(other)
    db.execute("DELETE FROM seasons WHERE team = 'NYA'")
    db.execute("UPDATE games SET park = 'moon' WHERE game_id % 5 = 0")  # a value the embedding has not seen
    db.con.close()
    db = relsql.connect(other, read_only=True)
    with pytest.warns(RuntimeWarning, match="not kept"):
        full = relsql.Model.load(path, db).predict()  # every row: the whole grounding
    with pytest.warns(RuntimeWarning, match="not kept"):
        loaded = relsql.Model.load(path, db)
    asked = _asked(full)
    got = loaded.predict(keys=asked)
    want = asked.join(full, on=["team", "season"], how="left")
    assert got.select("team", "season").equals(asked) and "NYA" not in asked["team"].to_list()
    np.testing.assert_allclose(got["probability"].to_numpy(), want["probability"].to_numpy(), rtol=0, atol=1e-12)
    assert got["split"].to_list() == want["split"].to_list() == [None] * asked.height
    assert loaded.learner.pending.rows_batched.grounder.sizes["predict"] == asked.height
    db.close()
