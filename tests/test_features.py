"""The feature layer: encodings computed in SQL, by column type, with NULL indicators."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import torch

import relsql
from relsql.ground.execute import Presets, ground


@pytest.fixture
def db(tmp_path):
    db = relsql.connect(tmp_path / "f.duckdb")
    db.execute("""
        CREATE TABLE t(id INT, amount DECIMAL(10, 2), flag BOOLEAN, day DATE, stamp TIMESTAMP, name VARCHAR);
        INSERT INTO t VALUES
          (1, 10.00, true,  DATE '2020-01-01', TIMESTAMP '2020-01-01 00:00:00', 'x'),
          (2, 30.00, false, DATE '2020-01-03', TIMESTAMP '2020-01-01 12:00:00', 'y'),
          (3, NULL,  NULL,  DATE '2020-01-05', NULL,                            'x');
    """)
    yield db
    db.con.close()


def features_of(db, columns: str) -> np.ndarray:
    net = relsql.compile(relsql.Template.from_sql(f"CREATE TABLE f AS SELECT t.id, features({columns}) FROM t;"), db,
                         dtype=torch.float64)
    return net()["f"].numpy()


def standardized(values):
    present = np.array([v for v in values if v is not None], dtype=float)
    mean, std = present.mean(), present.std() or 1.0
    return [0.0 if v is None else (v - mean) / std for v in values]


def test_numeric_with_nulls_gets_indicator(db):
    got = features_of(db, "t.amount")
    expected = np.array([standardized([10.0, 30.0, None]), [0, 0, 1]]).T
    assert np.allclose(got, expected)


def test_boolean_is_zero_one_with_indicator(db):
    assert np.allclose(features_of(db, "t.flag"), [[1, 0], [0, 0], [0, 1]])


def test_dates_and_timestamps_are_standardized_seconds(db):
    day = [dt.datetime(2020, 1, d, tzinfo=dt.UTC).timestamp() for d in (1, 3, 5)]
    stamp = [dt.datetime(2020, 1, 1, tzinfo=dt.UTC).timestamp(), dt.datetime(2020, 1, 1, 12, tzinfo=dt.UTC).timestamp(), None]
    got = features_of(db, "t.day, t.stamp")
    expected = np.array([standardized(day), standardized(stamp), [0, 0, 1]]).T
    assert np.allclose(got, expected)


def test_text_in_features_is_refused(db):
    with pytest.raises(relsql.SchemaError, match=r"features\(t.name\).*embed"):
        features_of(db, "t.name")


def test_presets_reuse_statistics_and_dictionaries(db):
    """A trained model's encodings survive new data: same codes and statistics, new values appended."""
    tpl = relsql.Template.from_sql("CREATE TABLE f AS SELECT t.id, concat(features(t.amount), embed(t.name, 2, 'e')) FROM t;")
    first = ground(tpl, db, progress=False)
    db.execute("INSERT INTO t VALUES (4, 1000.00, true, DATE '2021-01-01', NULL, 'z')")
    again = ground(tpl, db, presets=Presets(first.dictionaries, first.feature_stats), progress=False)
    fresh = ground(tpl, db, progress=False)
    assert again.feature_stats == first.feature_stats != fresh.feature_stats
    codes = dict(zip(again.dictionaries["e"]["value"].to_pylist(), again.dictionaries["e"]["code"].to_pylist()))
    assert codes == {"x": 0, "y": 1, "z": 2}
