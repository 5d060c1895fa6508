"""relsql/train/gbm/flat.py at depth 2 (the blend's GBM features): the parents' parents, each
parent's other children (under the time cut: strictly earlier rows, the target column's earlier
values among them; untimed: never the target column) and the mean of a child's own parents'
columns equal a naive Python evaluation over tiny tables (float64, 1e-9); a hub whose timed join
would read more than MAX_PAIRS pairs is left out; descriptions round-trip and old ones still load."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import sqlglot.expressions as exp

import relsql
from relsql.train.gbm import flat

SCHEMA = """
CREATE TABLE league(league_id INT PRIMARY KEY, size DOUBLE);
CREATE TABLE team(team_id INT PRIMARY KEY, league_id INT REFERENCES league(league_id), budget DOUBLE);
CREATE TABLE player(player_id INT PRIMARY KEY, height DOUBLE);
CREATE TABLE sponsor(sponsor_id INT PRIMARY KEY, wealth DOUBLE);
CREATE TABLE salary(salary_id INT PRIMARY KEY, player_id INT REFERENCES player(player_id),
                    team_id INT REFERENCES team(team_id), year INT, pay DOUBLE);
CREATE TABLE award(award_id INT PRIMARY KEY, player_id INT REFERENCES player(player_id), year INT, points DOUBLE);
CREATE TABLE bonus(bonus_id INT PRIMARY KEY, salary_id INT REFERENCES salary(salary_id),
                   sponsor_id INT REFERENCES sponsor(sponsor_id), year INT, amount DOUBLE);
"""


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    db = relsql.connect()
    for statement in SCHEMA.split(";")[:-1]:
        db.execute(statement)
    rows = {
        "league": [(g, float(rng.normal())) for g in range(2)],
        "team": [(t, t % 2, None if t == 3 else float(rng.normal())) for t in range(5)],
        "player": [(p, float(rng.normal())) for p in range(6)],
        "sponsor": [(s, None if s == 1 else float(rng.normal())) for s in range(3)],
        "salary": [(s, int(rng.integers(0, 6)), int(rng.integers(0, 5)), int(rng.integers(2000, 2006)),
                    None if s % 9 == 4 else float(rng.normal())) for s in range(40)],
        "award": [(a, int(rng.integers(0, 6)), int(rng.integers(1999, 2006)), float(rng.normal())) for a in range(25)],
        "bonus": [(b, int(rng.integers(0, 40)), None if b % 5 == 0 else int(rng.integers(0, 3)),
                   int(rng.integers(1999, 2007)), float(rng.normal())) for b in range(50)],
    }
    for table, values in rows.items():
        db.con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(values[0]))})", values)
    return db, rows


def _stats(values: list) -> list[float]:
    """count, then avg/min/max of each column of `values` (rows of numbers or None), as SQL gives them."""
    out = [float(len(values))]
    for column in zip(*values) if values else []:
        known = [v for v in column if v is not None]
        out += [sum(known) / len(known), min(known), max(known)] if known else [math.nan] * 3
    return out


def _mean(values: list) -> float:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else math.nan


def naive(rows: dict, timed: bool) -> tuple[list[str], dict[int, list[float]]]:
    """Feature names and each salary row's values, by hand."""
    league = {g: size for g, size in rows["league"]}
    team = {t: (g, budget) for t, g, budget in rows["team"]}
    height = dict(rows["player"])
    wealth = dict(rows["sponsor"])
    out = {}
    for s, p, t, year, _pay in rows["salary"]:
        def earlier(y: int, year: int = year) -> bool:
            return not timed or y < year

        values = [] if timed else [float(year)]
        values += [height[p], team[t][1], league[team[t][0]]]
        bonuses = [b for b in rows["bonus"] if b[1] == s and earlier(b[3])]
        values += _stats([(b[3], b[4]) for b in bonuses]) if bonuses else [0.0] + [math.nan] * 6
        values.append(_mean([wealth[b[2]] if b[2] is not None else None for b in bonuses]))
        awards = [a for a in rows["award"] if a[1] == p and earlier(a[2])]
        values += _stats([(a[2], a[3]) for a in awards]) if awards else [0.0] + [math.nan] * 6
        mates = [r for r in rows["salary"] if r[1] == p and earlier(r[3])]  # untimed: the row itself too
        values += _stats([(r[3], r[4]) if timed else (r[3],) for r in mates]) if mates else [0.0] + [math.nan] * 6
        crew = [r for r in rows["salary"] if r[2] == t and earlier(r[3])]
        values += _stats([(r[3], r[4]) if timed else (r[3],) for r in crew]) if crew else [0.0] + [math.nan] * 6
        out[s] = [math.nan if v is None else v for v in values]
    three = ("avg", "min", "max")
    cousin = (["year", "pay"] if timed else ["year"])
    names = ([] if timed else ["year"]) + ["player(player_id).height", "team(team_id).budget", "team.league(league_id).size",
                                           "count(bonus(salary_id))"]
    names += [f"{a}(bonus.{c})" for c in ("year", "amount") for a in three]
    names += ["avg(bonus.sponsor(sponsor_id).wealth)"]
    names += ["count(player.award(player_id))"] + [f"{a}(player.award.{c})" for c in ("year", "points") for a in three]
    names += ["count(player.salary(player_id))"] + [f"{a}(player.salary.{c})" for c in cousin for a in three]
    names += ["count(team.salary(team_id))"] + [f"{a}(team.salary.{c})" for c in cousin for a in three]
    return names, out


@pytest.mark.parametrize(("timed", "running"), [(False, False), (True, False), (True, True)])
def test_two_hop_features_equal_a_naive_evaluation(data, timed, running, monkeypatch):
    """`running`: the timed cousins as running aggregates (as a hub's many pairs are), not a join."""
    db, rows = data
    monkeypatch.setattr(flat, "RUNNING_PAIRS_PER_ROW", 0 if running else 10**9)
    spec = flat.plan(db, "salary", "pay", time_column="year" if timed else None, depth=2)
    assert [c.running for c in spec.children if c.through] == [running] * 3
    names, expected = naive(rows, timed)
    assert spec.names == names
    wanted = list(range(40))[::-1] + [99]
    db.register("__relsql_rows", pa.table({"salary_id": wanted, "_rid": list(range(len(wanted)))}))
    try:
        rids, matrix = spec.matrix(db, exp.Table(this=exp.to_identifier("__relsql_rows", quoted=True)))
    finally:
        db.unregister("__relsql_rows")
    assert rids.tolist() == list(range(len(wanted)))
    for rid, key in zip(rids, wanted):
        if key == 99:
            assert np.isnan(matrix[rid]).all()
            continue
        assert np.allclose(matrix[rid], expected[key], rtol=1e-9, atol=1e-9, equal_nan=True), (key, matrix[rid], expected[key])
    assert flat.Flat.from_plain(spec.to_plain()) == spec


STORES = """
CREATE TABLE store(store_id INT PRIMARY KEY, size DOUBLE);
CREATE TABLE day(day_id INT PRIMARY KEY, date DATE);
CREATE TABLE visit(visit_id INT PRIMARY KEY, store_id INT REFERENCES store(store_id), seen TIMESTAMP, x DOUBLE,
                   rating DOUBLE);
CREATE TABLE audit(audit_id INT PRIMARY KEY, store_id INT REFERENCES store(store_id), year INT, score DOUBLE);
CREATE TABLE sale(sale_id INT PRIMARY KEY, store_id INT REFERENCES store(store_id), day_id INT REFERENCES day(day_id),
                  amount DOUBLE);
"""


@pytest.mark.parametrize("running", [False, True])
def test_earlier_cousins_across_time_kinds_equal_a_naive_evaluation(running, monkeypatch):
    """A parent's other children under the time cut, joined pair by pair or (`running`, as where a
    hub's pairs are many) as running aggregates: a timestamp target against its own table's rows
    (ties in time are not earlier), a year table (a year is earlier than a date only once it is
    over), a date dimension's dates; a year target against timestamps (earlier than its first day);
    NULL keys and times never count."""
    import datetime as dt

    monkeypatch.setattr(flat, "RUNNING_PAIRS_PER_ROW", 0 if running else 10**9)

    rng = np.random.default_rng(11)
    db = relsql.connect()
    for statement in STORES.split(";")[:-1]:
        db.execute(statement)
    start = dt.datetime(2019, 12, 30, 6)
    days = [(d, (start + dt.timedelta(days=3 * d)).date()) for d in range(12)]
    stamps = [start + dt.timedelta(days=int(k), hours=int(h)) for k, h in zip(rng.integers(0, 40, 30), rng.integers(0, 3, 30))]
    visits = [(v, None if v % 11 == 5 else int(rng.integers(0, 3)), None if v % 13 == 7 else stamps[v % 20],
               None if v % 7 == 3 else float(rng.normal()), float(rng.normal())) for v in range(30)]
    audits = [(a, None if a == 4 else int(rng.integers(0, 3)), None if a == 6 else int(rng.integers(2019, 2022)),
               float(rng.normal())) for a in range(14)]
    sales = [(s, int(rng.integers(0, 3)), None if s % 9 == 2 else int(rng.integers(0, 12)), float(rng.normal()))
             for s in range(25)]
    for table, values in {"store": [(k, float(k)) for k in range(3)], "day": days, "visit": visits, "audit": audits,
                          "sale": sales}.items():
        db.con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(values[0]))})", values)
    date_of = dict(days)
    epoch = dt.datetime(1970, 1, 1)

    def check(target: str, label: str, time: str, keyed: list, expected: dict[str, dict[int, float]]):
        spec = flat.plan(db, target, label, time, depth=2)
        assert {c.running for c in spec.children if c.through} == {running}
        db.register("__relsql_rows", pa.table({keyed[0]: [r[0] for r in keyed[1]], "_rid": list(range(len(keyed[1])))}))
        try:
            _, matrix = spec.matrix(db, exp.Table(this=exp.to_identifier("__relsql_rows", quoted=True)))
        finally:
            db.unregister("__relsql_rows")
        assert set(expected) <= set(spec.names), sorted(set(expected) - set(spec.names))
        for name, by_row in expected.items():
            got = matrix[:, spec.names.index(name)]
            want = np.array([by_row[r[0]] for r in keyed[1]])
            assert np.allclose(got, want, rtol=1e-9, atol=1e-9, equal_nan=True), (name, got, want)

    def summary(prefix: str, rows_of, column_values: dict) -> dict[str, dict[int, float]]:
        """count and avg/min/max per column of each target row's earlier cousins (`rows_of`)."""
        out = {f"count({prefix})": {}}
        for column in column_values:
            for a in ("avg", "min", "max"):
                out[f"{a}({prefix.split('(')[0]}.{column})"] = {}
        for key, rows in rows_of.items():
            out[f"count({prefix})"][key] = float(len(rows))
            for column, value in column_values.items():
                known = [value(r) for r in rows if value(r) is not None]
                for a, fn in (("avg", lambda v: sum(v) / len(v)), ("min", min), ("max", max)):
                    out[f"{a}({prefix.split('(')[0]}.{column})"][key] = fn(known) if known else math.nan
        return out

    # a timestamp target: its store's earlier visits (strictly: the same time is not earlier), audits
    # of years already over, sales on earlier dates of the date dimension
    mates, audited, sold = {}, {}, {}
    for v, store, at, _x, _label in visits:
        live = store is not None and at is not None
        mates[v] = [w for w in visits if live and w[1] == store and w[2] is not None and w[2] < at]
        audited[v] = [a for a in audits if live and a[1] == store and a[2] is not None and a[2] < at.year]
        sold[v] = [s for s in sales if live and s[1] == store and s[2] is not None
                   and dt.datetime.combine(date_of[s[2]], dt.time()) < at]
    expected = summary("store.visit(store_id)", mates, {"seen": lambda w: (w[2] - epoch).total_seconds(),
                                                        "x": lambda w: w[3], "rating": lambda w: w[4]})
    expected |= summary("store.audit(store_id)", audited, {"year": lambda a: float(a[2]), "score": lambda a: a[3]})
    expected |= summary("store.sale(store_id)", sold, {"amount": lambda s: s[3]})
    assert any(len(rows) for rows in mates.values()) and any(len(rows) for rows in sold.values())
    assert any(w[2] == v[2] and w[1] == v[1] and w[0] != v[0] for v in visits for w in visits if v[2] is not None)  # ties
    check("visit", "rating", "seen", ["visit_id", visits], expected)

    # a year target: visits before its year's first day
    seen = {a: [w for w in visits if a_store is not None and year is not None and w[1] == a_store and w[2] is not None
                and w[2] < dt.datetime(year, 1, 1)] for a, a_store, year, _ in audits}
    assert any(len(rows) for rows in seen.values())
    check("audit", "score", "year", ["audit_id", audits],
          summary("store.visit(store_id)", seen, {"x": lambda w: w[3], "rating": lambda w: w[4]}))


def test_depth_one_is_unchanged_and_old_descriptions_load(data):
    db, _ = data
    one, two = flat.plan(db, "salary", "pay", "year"), flat.plan(db, "salary", "pay", "year", depth=2)
    assert two.names[:len(one.own)] == one.names[:len(one.own)] and set(one.names) < set(two.names)
    assert not any(p.of >= 0 for p in one.parents) and not any(c.through or c.lookups for c in one.children)
    plain = one.to_plain()
    for p in plain["parents"]:
        del p["of"]
    for c in plain["children"]:
        del c["through"], c["lookups"]
    assert flat.Flat.from_plain(plain) == one  # a model saved before depth 2 existed


def test_a_hub_too_large_for_a_timed_join_is_left_out(data, monkeypatch):
    db, rows = data
    crew = sum(sum(1 for r in rows["salary"] if r[2] == t) ** 2 for t in range(5))
    mates = sum(sum(1 for r in rows["salary"] if r[1] == p) ** 2 for p in range(6))
    assert mates < crew
    monkeypatch.setattr(flat, "MAX_PAIRS", crew - 1)
    names = flat.plan(db, "salary", "pay", "year", depth=2).names
    assert "count(player.salary(player_id))" in names and "count(team.salary(team_id))" not in names
    monkeypatch.setattr(flat, "MAX_PAIRS", crew)
    assert "count(team.salary(team_id))" in flat.plan(db, "salary", "pay", "year", depth=2).names


def test_damaged_links_are_refused(data):
    plain = flat.plan(data[0], "salary", "pay", "year", depth=2).to_plain()
    grand = next(i for i, p in enumerate(plain["parents"]) if p["of"] >= 0)
    broken = {**plain, "parents": [{**p, "of": len(plain["parents"])} if i == grand else p
                                   for i, p in enumerate(plain["parents"])]}
    with pytest.raises(relsql.RelsqlError, match="damaged: a parent's link"):
        flat.Flat.from_plain(broken)
    with pytest.raises(relsql.RelsqlError, match="damaged"):
        flat.Flat.from_plain({**plain, "children": [{**plain["children"][0], "lookups": [{"table": 3}]}]})


def test_a_model_blends_with_two_hop_features_and_loads_with_them(tmp_path):
    """fit()'s blend reads depth-2 features (a player's earlier salaries); the saved model's blend
    recomputes them after Model.load and predicts the same."""
    rng = np.random.default_rng(5)
    db = relsql.connect(tmp_path / "pay.duckdb")
    for statement in SCHEMA.split(";")[:-1]:
        db.execute(statement)
    db.con.executemany("INSERT INTO league VALUES (?, ?)", [(0, 1.0)])
    db.con.executemany("INSERT INTO team VALUES (?, ?, ?)", [(t, 0, float(t)) for t in range(4)])
    level = rng.normal(size=60)
    db.con.executemany("INSERT INTO player VALUES (?, ?)", [(p, float(rng.normal())) for p in range(60)])
    salaries = [(p * 5 + k, p, int(rng.integers(0, 4)), 2000 + k, float(level[p] + 0.1 * rng.normal()))
                for p in range(60) for k in range(5)]
    db.con.executemany("INSERT INTO salary VALUES (?, ?, ?, ?, ?)", salaries)
    model = relsql.Model(db, relsql.Template.auto(db, "salary.pay", time_column="year", hops=1), target="salary.pay",
                         time_column="year", progress=False, seed=0)
    model.fit(epochs=3)
    blend = model.learner.hybrid
    assert blend is not None and "avg(player.salary.pay)" in blend.features.names
    ours = model.predict()
    model.save(tmp_path / "m.pt")
    theirs = relsql.Model.load(tmp_path / "m.pt", db).predict()
    assert theirs.equals(ours)


def test_a_wide_schema_keeps_every_one_hop_feature_and_at_most_max_features(data, monkeypatch):
    db, _ = data
    one = flat.plan(db, "salary", "pay", "year").names
    whole = flat.plan(db, "salary", "pay", "year", depth=2).names
    for cap in (len(one) + 1, len(one) + 12, len(whole) - 1):
        monkeypatch.setattr(flat, "MAX_FEATURES", cap)
        names = flat.plan(db, "salary", "pay", "year", depth=2).names
        assert set(one) <= set(names) <= set(whole) and len(names) <= cap and names == [n for n in whole if n in names]
    monkeypatch.setattr(flat, "MAX_FEATURES", len(one) - 1)
    assert flat.plan(db, "salary", "pay", "year", depth=2).names == one  # one hop is never cut


def _pay_database(path):
    """60 players x 5 seasons of salaries, each the player's level (visible only through their
    earlier salaries) plus noise."""
    rng = np.random.default_rng(7)
    db = relsql.connect(path)
    for statement in SCHEMA.split(";")[:-1]:
        db.execute(statement)
    db.con.executemany("INSERT INTO league VALUES (?, ?)", [(0, 1.0)])
    db.con.executemany("INSERT INTO team VALUES (?, ?, ?)", [(t, 0, float(t)) for t in range(4)])
    db.con.executemany("INSERT INTO player VALUES (?, ?)", [(p, float(rng.normal())) for p in range(60)])
    level = rng.normal(size=60)
    salaries = []
    for p in range(60):
        for k in range(5):
            team = int(rng.integers(0, 4))
            salaries.append((p * 5 + k, p, team, 2000 + k, float(level[p] + 0.05 * rng.normal())))
    db.con.executemany("INSERT INTO salary VALUES (?, ?, ?, ?, ?)", salaries)
    return db


def test_the_blend_reads_two_hops_where_the_schema_has_them(tmp_path):
    """hybrid.fit's GBM reads the depth-2 features (describe() says so); a player's earlier salaries
    carry the label here, and the GBM alone on them beats the one-hop GBM on validation."""
    from relsql.train.gbm import baselines, hybrid

    db = _pay_database(tmp_path / "pay.duckdb")
    model = relsql.Model(db, relsql.Template.auto(db, "salary.pay", time_column="year", hops=1), target="salary.pay",
                         time_column="year", progress=False, seed=0)
    model.fit(epochs=2, hybrid=False, refit=False)
    learner = model.learner
    blend = hybrid.fit(learner)
    assert blend.features.depth == 2 and "two-hop" in blend.describe()
    assert blend.features.names == flat.plan(db, "salary", "pay", "year", depth=2).names
    _, y = (t.detach().double().numpy() for t in learner.split_outputs("val"))
    one = flat.plan(db, "salary", "pay", "year")
    x = one.of_output(db, learner.output, int(learner.output_rows))[learner.labelled]
    shallow = hybrid.score(learner.task, baselines.fit_trees(learner, x).raw(x[learner.rows["val"]]), y, blend.metric)
    assert blend.metric in hybrid.LOWER_IS_BETTER and blend.scores[0.0] < shallow


@pytest.mark.parametrize("signal", ["earlier salaries", "team budget", "own column"])
def test_the_blend_keeps_the_gbm_whose_blend_scores_better_on_validation(tmp_path, signal):
    """hybrid.fit fits a GBM on the two-hop features, one on their one-hop part and one on the
    salary's own columns, and keeps the blend that scores better on validation (by the loss,
    computed here), the wider one on a tie: a player's earlier salaries carry the label in one
    database (two hops win), the team's budget in another (one hop wins), a column of the salary
    row itself in the third, every other column noise there (its own columns win). Each blend's
    features are those of a fresh plan, and a fresh query of them gives the matrix fit kept."""
    from relsql.train.gbm import baselines, hybrid

    db = _pay_database(tmp_path / "pay.duckdb")
    rng = np.random.default_rng(11)
    noise = [(float(rng.normal()), i) for i in range(300)]
    db.execute("CREATE TEMP TABLE noise(value DOUBLE, salary_id INT)")
    db.con.executemany("INSERT INTO noise VALUES (?, ?)", noise)
    if signal == "team budget":
        db.con.executemany("UPDATE team SET budget = ? WHERE team_id = ?", [(float(rng.normal()), t) for t in range(4)])
        db.execute("UPDATE salary SET pay = (SELECT t.budget FROM team t WHERE t.team_id = salary.team_id) "
                   "+ (SELECT n.value FROM noise n WHERE n.salary_id = salary.salary_id)")
    if signal == "own column":
        db.execute("ALTER TABLE salary ADD COLUMN grade DOUBLE")
        db.execute("UPDATE salary SET grade = (SELECT n.value FROM noise n WHERE n.salary_id = salary.salary_id)")
        db.execute("UPDATE salary SET pay = 3 * grade + 1.0 * sin(salary_id)")
    model = relsql.Model(db, relsql.Template.auto(db, "salary.pay", time_column="year", hops=1), target="salary.pay",
                         time_column="year", progress=False, seed=0)
    model.fit(epochs=3, hybrid=False, refit=False)
    learner = model.learner
    blend = hybrid.fit(learner)
    net, y = (t.detach().double().numpy()[:, 0] if t.ndim > 1 else t.detach().double().numpy()
              for t in learner.split_outputs("val"))
    one = flat.plan(db, "salary", "pay", "year")
    specs = {"two-hop": flat.plan(db, "salary", "pay", "year", depth=2), "one-hop": one,
             "own-column": baselines.own_only(one)}
    best = {}
    for reach, spec in specs.items():
        if not spec.names or any(len(spec.names) == len(other[2]) for other in best.values()):
            continue  # no features, or the same ones as a wider candidate
        x = spec.of_output(db, learner.output, int(learner.output_rows))[learner.labelled]
        quick = {} if reach == "one-hop" else {"learning_rate": 0.1, "patience": 25}  # see the next test
        theirs = baselines.fit_trees(learner, x, **quick).raw(x[learner.rows["val"]])[:, 0]
        # 45 validation rows: too few for MAE to select on, so the loss picks (fit's default, Huber with
        # delta 1 in standardized units)
        gaps = {a: np.abs(a * net + (1 - a) * theirs - y) for a in hybrid.WEIGHTS}
        losses = {a: float(np.mean(np.where(g <= 1, 0.5 * g ** 2, g - 0.5))) for a, g in gaps.items()}
        weight = min(hybrid.WEIGHTS, key=lambda a: (round(losses[a], 10), -a))
        best[reach] = (round(losses[weight], 10), weight, spec.names)
    reach = min(best, key=lambda r: best[r][0])  # dicts keep order: a tie keeps the wider
    assert reach == {"earlier salaries": "two-hop", "team budget": "one-hop", "own column": "own-column"}[signal]
    assert f"GBM on {reach} features" in blend.describe()
    assert blend.metric == "loss" and blend.weight == best[reach][1] and blend.features.names == best[reach][2]
    assert blend.scores[blend.weight] == pytest.approx(best[reach][0], abs=1e-8)
    kept = blend._cache[hybrid._key(learner)]
    assert np.array_equal(kept, blend.features.of_output(db, learner.output, int(learner.output_rows)), equal_nan=True)
    predicted = model.predict()
    model.save(tmp_path / "m.pt")
    assert relsql.Model.load(tmp_path / "m.pt", db).predict().equals(predicted)
    db.close()


def test_the_one_hop_gbm_is_the_users_and_the_others_refit_at_the_rate_they_stopped_at(tmp_path):
    """The blend's one-hop GBM is the one-hop GBM with gbm.py's defaults (the baseline of
    baselines.compare: the same trees, the same test scores); the two-hop and own-column GBMs learn
    at rate 0.1 and stop after 25 rounds without a better validation loss (where the features carry
    the label, fewer rounds than at the defaults), and the refit trains at that rate: refitted on the
    training rows alone for the rounds early stopping kept, it gives the same trees again."""
    from relsql.train.gbm import baselines, gbm, hybrid

    db = _pay_database(tmp_path / "pay.duckdb")
    db.execute("ALTER TABLE salary ADD COLUMN grade DOUBLE")  # an own column: the third GBM's
    db.execute("UPDATE salary SET grade = sin(salary_id)")
    model = relsql.Model(db, relsql.Template.auto(db, "salary.pay", time_column="year", hops=1), target="salary.pay",
                         time_column="year", progress=False, seed=0)
    learner = model.learner
    found = {c.features.depth if c.features.parents or c.features.children else 0: c for c in hybrid.candidates(learner)}
    assert sorted(found) == [0, 1, 2]  # own columns, one hop, two hops
    one = baselines.one_hop(learner)
    x = baselines.features(learner, one)
    test, truth = learner.rows["test"], baselines._labels(learner, "test")
    peer = learner.task.scores(baselines.fit_trees(learner, x).raw(x[test]), truth)
    near = found[1]
    assert near.features.names == one.names
    assert learner.task.scores(near.trees.raw(near.x()[learner.labelled][test]), truth) == peer
    for depth in (0, 2):
        candidate = found[depth]
        labelled = candidate.x()[learner.labelled]
        train, val = learner.rows["train"], learner.rows["val"]
        y_train, y_val = baselines._labels(learner, "train"), baselines._labels(learner, "val")
        slow = gbm.fit(labelled[train], y_train, "regression", 1, learner.seed, x_val=labelled[val], y_val=y_val)
        quick = gbm.fit(labelled[train], y_train, "regression", 1, learner.seed, x_val=labelled[val], y_val=y_val,
                        learning_rate=0.1, patience=25)
        assert np.array_equal(candidate.trees.raw(labelled), quick.raw(labelled))
        assert len(quick.roots) < len(slow.roots) if depth == 2 else len(quick.roots) <= len(slow.roots)  # 0: noise
        blend = hybrid.Hybrid(candidate.features, candidate.trees, 0.0, "loss")
        blend.keep_features(learner, candidate.x())
        rounds = blend.refit(learner, train)
        assert rounds == len(quick.roots) and np.allclose(blend.trees.raw(labelled), quick.raw(labelled), atol=1e-12)
    db.close()
