"""Grounding on fit's default DuckDB threads: an instance relsql opens starts on them (relsql.data.duckdb
.start_on_half_the_cores) and is never switched back and forth; on the user's own connection the count
is set only inside relsql's calls (engine_threads, used by Template.auto and Model) and put back; a
count the user set is kept; the groundings and predictions are those of a connection whose threads the
user set."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
import torch

import relsql
import relsql.data.duckdb
import relsql.train.learner.learner as learner_module
from bench import relgen
from relsql import cores
from relsql.data.duckdb import duckdb_default_threads, engine_threads


def threads_of(db) -> int:
    return int(db.con.execute("SELECT current_setting('threads')").fetchone()[0])


def test_an_instance_relsql_opens_starts_on_half_the_cores_and_stays(tmp_path, monkeypatch):
    changes = []
    real = relsql.data.duckdb._set_duckdb_threads
    monkeypatch.setattr(relsql.data.duckdb, "_set_duckdb_threads", lambda con, count: (changes.append(count),
                                                                                       real(con, count)))
    count = duckdb_default_threads() + 1  # differs from DuckDB's default on any machine
    monkeypatch.setattr(cores, "half", lambda: count)
    path = relgen.write(relgen.shop(0, scale=0.05), tmp_path / "shop.duckdb", "customer.churned")
    db = relsql.connect(str(path), read_only=True)
    assert threads_of(db) == count and changes == [count]  # set once, when opened
    relsql.Model(db, relsql.Template.auto(db, target="customer.churned"), target="customer.churned",
                 progress=False).fit(epochs=1)
    assert threads_of(db) == count and changes == [count]  # no SET and RESET around each call
    given = relsql.connect(threads=2)
    assert threads_of(given) == 2 and changes == [count, 2]


def test_the_users_connection_set_inside_and_reset_after():
    db = relsql.connect(duckdb.connect())  # the user's instance, still on DuckDB's default
    default = duckdb_default_threads()
    assert threads_of(db) == default
    with engine_threads(db, default + 1):
        assert threads_of(db) == default + 1
    assert threads_of(db) == default
    with pytest.raises(KeyError), engine_threads(db, default + 2):  # put back on an error too
        raise KeyError("x")
    assert threads_of(db) == default


def test_a_count_the_user_set_wins():
    default = duckdb_default_threads()
    given = relsql.connect(threads=default)  # the user's count, even when it is DuckDB's default
    with engine_threads(given, default + 1):
        assert threads_of(given) == default
    assert threads_of(given) == default
    con = duckdb.connect()
    con.execute(f"SET threads = {default + 3}")  # set on the user's own connection before relsql saw it
    theirs = relsql.connect(con)
    with engine_threads(theirs, 1):
        assert threads_of(theirs) == default + 3
    assert int(con.execute("SELECT current_setting('threads')").fetchone()[0]) == default + 3


def test_engines_without_the_setting_are_left_alone():
    with engine_threads(None, 1):
        pass

    class NoConnection:  # as SparkDatabase: no DuckDB connection
        con = None
        threads_given = None

    with engine_threads(NoConnection(), 1):
        pass


@pytest.fixture(scope="module")
def shop_file(tmp_path_factory):
    return relgen.write(relgen.shop(0, scale=0.1), tmp_path_factory.mktemp("shop") / "shop.duckdb", "customer.churned")


def test_model_grounds_on_the_policy_count_and_matches_the_users_threads(shop_file, monkeypatch):
    default = duckdb_default_threads()
    count = default + 1  # a count that differs from DuckDB's default on any machine
    monkeypatch.setattr(cores, "half", lambda: count)  # the policy: relsql/cores.py, read where each stage starts
    seen = []
    real_ground = learner_module.ground

    def recording(template, db, **kwargs):
        seen.append(threads_of(db))
        return real_ground(template, db, **kwargs)

    monkeypatch.setattr(learner_module, "ground", recording)
    results = {}
    for name, threads in (("policy", None), ("user", default)):
        db = relsql.connect(str(shop_file), read_only=True, threads=threads)
        template = relsql.Template.auto(db, target="customer.churned")
        model = relsql.Model(db, template, target="customer.churned", progress=False)
        assert threads_of(db) == (count if threads is None else default)  # relsql's instance, or the user's count
        results[name] = (model.learner.net, model.predict())
        db.close()
    assert seen == [count, default]
    (net_a, pred_a), (net_b, pred_b) = results["policy"], results["user"]
    assert pred_a.columns == pred_b.columns and pred_a.height == pred_b.height > 0
    for column in pred_a.columns:
        a, b = pred_a[column].to_numpy(), pred_b[column].to_numpy()
        assert np.array_equal(a, b) if a.dtype.kind in "OU" else np.array_equal(a, b, equal_nan=True)
    state_a, state_b = net_a.state_dict(), net_b.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
