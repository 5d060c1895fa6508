"""bench/relgen.py (seeded relational databases with planted targets) and bench/quality.py (the
side-by-side harness): determinism, declared keys, the planted dependence recomputed in SQL, and
a tiny run of the harness."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from bench import quality, relgen

# Each signal recomputed by DuckDB from the written tables, by the formula in relgen's docstrings
# (NULLs replaced by the constants named there), one row per target-table row in key order.
SIGNAL_SQL = {
    "product.return_rate": """
        SELECT 2 * tanh(coalesce(avg(o.quantity), 5) - 5)
               + CASE WHEN coalesce(p.weight, 10) > 10 THEN ln(coalesce(p.price, 20)) / 2 ELSE 0 END
               + 0.5 * sqrt(count(o.order_id))
        FROM product p LEFT JOIN orders o ON o.product_id = p.product_id
        GROUP BY p.product_id, p.weight, p.price ORDER BY p.product_id""",
    "region.growth": """
        WITH busy AS (SELECT s.store_id, s.region_id, (count(v.visit_id) > 3)::DOUBLE AS busy
                      FROM store s LEFT JOIN visit v ON v.store_id = s.store_id GROUP BY s.store_id, s.region_id)
        SELECT 3 * pow(coalesce(avg(b.busy), 0), 2) + 20 * pow(coalesce(r.tax, 0.15), 2)
        FROM region r LEFT JOIN busy b ON b.region_id = r.region_id
        GROUP BY r.region_id, r.tax ORDER BY r.region_id""",
    "member.premium": """
        SELECT 1.5 * ((ln(coalesce(c.population, 60000)) > 11) != (coalesce(m.age, 40) > 40))::DOUBLE
               + 1.2 * (count(p.post_id) > 4)::DOUBLE
        FROM member m JOIN city c ON c.city_id = m.city_id LEFT JOIN post p ON p.member_id = m.member_id
        GROUP BY m.member_id, c.population, m.age ORDER BY m.member_id""",
    "app.popular": """
        SELECT 1.5 * (count(p.post_id) > 8)::DOUBLE - 1.5 * tanh((coalesce(avg(m.age), 42.5) - 42.5) / 5)
               + (a.genre IN ('game', 'chat'))::DOUBLE
        FROM app a LEFT JOIN post p ON p.app_id = a.app_id LEFT JOIN member m ON m.member_id = p.member_id
        GROUP BY a.app_id, a.genre ORDER BY a.app_id""",
    "account.balance": """
        SELECT CASE WHEN a.kind = 'credit' THEN sqrt(coalesce(a.credit_limit, 3000)) / 10 ELSE 1 END
               * ln(1 + coalesce(sum(t.amount), 0))
        FROM account a LEFT JOIN txn t ON t.account_id = a.account_id
        GROUP BY a.account_id, a.kind, a.credit_limit ORDER BY a.account_id""",
}


@pytest.fixture(scope="module")
def targets():
    return relgen.all_targets(0)


def test_generator_is_deterministic_per_seed():
    first, again, other = relgen.databases(3, 0.2), relgen.databases(3, 0.2), relgen.databases(4, 0.2)
    for name, db in first.items():
        for table in db.tables:
            assert db.tables[table].frame.equals(again[name].tables[table].frame)
        for target in db.targets:
            assert np.array_equal(db.targets[target].values, again[name].targets[target].values)
            assert np.array_equal(db.targets[target].signal, again[name].targets[target].signal)
    assert not first["shop"].tables["customer"].frame.equals(other["shop"].tables["customer"].frame)


def test_shapes_sizes_nulls_and_kinds(targets):
    databases = {db.name: db for db, _ in targets.values()}
    assert len(databases) >= 4 and len(targets) >= 10
    assert {t.kind for _, t in targets.values()} == {"binary", "multiclass", "regression"}
    for db in databases.values():
        for table in db.tables.values():
            assert 500 <= len(table.frame) <= 5000, table.name
            for column in table.frame.columns:
                if table.frame[column].dtype.kind == "f":
                    assert 0.01 <= table.frame[column].isna().mean() <= 0.11, (table.name, column)
    kinds = {table.frame[c].dtype.kind for db in databases.values() for table in db.tables.values() for c in table.frame}
    assert {"i", "f", "O", "M"} <= kinds  # codes, numbers, text categories, a timestamp


def test_written_database_declares_keys_and_holds_one_label(tmp_path, targets):
    db, target = targets["post.likes"]
    con = duckdb.connect(str(relgen.write(db, tmp_path / "social.duckdb", "post.likes")), read_only=True)
    try:
        constraints = con.execute("SELECT table_name, constraint_type, constraint_column_names FROM duckdb_constraints() "
                                  "WHERE constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY')").fetchall()
        declared = {(t, kind, tuple(columns)) for t, kind, columns in constraints}
        for table in db.tables.values():
            assert (table.name, "PRIMARY KEY", (table.key,)) in declared
            for column in table.foreign:
                assert (table.name, "FOREIGN KEY", (column,)) in declared
        columns = {c for (c,) in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'post'").fetchall()}
        assert "likes" in columns
        others = {t.column for t in db.targets.values() if t.name != "post.likes"}
        every = {c for (c,) in con.execute("SELECT column_name FROM duckdb_columns()").fetchall()}
        assert not others & every  # no other target is an input
        assert con.execute("SELECT count(*) FROM post p LEFT JOIN app a ON a.app_id = p.app_id "
                           "WHERE a.app_id IS NULL").fetchone()[0] == 0
        nulls = con.execute("SELECT count(*) - count(length) FROM post").fetchone()[0]
        assert nulls == int(db.tables["post"].frame["length"].isna().sum()) > 0  # NaN written as NULL
    finally:
        con.close()


@pytest.mark.parametrize("name", sorted(SIGNAL_SQL))
def test_planted_signal_recomputed_in_sql(tmp_path, targets, name):
    db, target = targets[name]
    con = duckdb.connect(str(relgen.write(db, tmp_path / f"{db.name}.duckdb", name)), read_only=True)
    try:
        recomputed = np.asarray([v for (v,) in con.execute(SIGNAL_SQL[name]).fetchall()], dtype=np.float64)
    finally:
        con.close()
    np.testing.assert_allclose(recomputed, target.signal, rtol=0, atol=1e-9)
    assert np.unique(target.signal).size > 2  # not a constant


def test_step_function_of_one_code_is_planted(targets):
    """txn.fraud less its night-and-amount term is a function of the merchant's risk code alone."""
    db, target = targets["txn.fraud"]
    txn, merchant = db.tables["txn"].frame, db.tables["merchant"].frame
    night = (txn.ts.dt.hour < 5) & (txn.amount.fillna(33.0) > 40.0)
    rest = target.signal - 2.0 * night.to_numpy()
    risk = merchant.risk.to_numpy()[txn.merchant_id.to_numpy() - 1]
    for code in np.unique(risk):
        assert np.ptp(rest[risk == code]) == 0
    assert len({float(rest[risk == code][0]) for code in np.unique(risk)}) > 2


def test_labels_follow_their_signals(targets):
    for name, (_, target) in targets.items():
        if target.kind == "binary":
            assert roc_auc_score(target.values, target.signal) > 0.85, name
        elif target.kind == "regression":
            assert np.corrcoef(target.values, target.signal)[0, 1] > 0.95, name
        else:  # classes cut from signal + noise: their mean signals are far apart
            means = sorted(target.signal[target.values == c].mean() for c in np.unique(target.values))
            assert min(np.diff(means)) > 0.3 * target.signal.std(), name


def test_tiny_run_of_the_harness(tmp_path):
    out = tmp_path / "quality.json"
    names = ["app.popular", "region.growth"]
    quality.main(["--targets", *names, "--seeds", "0", "1", "--scale", "0.4", "--fit", '{"epochs": 3}',
                  "--peer", '{"epochs": 3}', "--out", str(tmp_path / "db"), "--json", str(out)])
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert ({(r["target"], r["method"], r["seed"]) for r in rows}
            == {(t, m, s) for t in names for m in quality.METHODS for s in (0, 1)})
    assert {(r["target"], r["metric"]) for r in rows} == {("app.popular", "roc_auc"), ("region.growth", "mae")}
    assert all(0 <= r["score"] <= 1 for r in rows if r["target"] == "app.popular")
    assert all(r["score"] > 0 and "r2" in r["scores"] for r in rows if r["target"] == "region.growth")
    assert {r["score"] for r in rows if r["method"] == "majority" and r["target"] == "app.popular"} == {0.5}
    relsql_rows = [r for r in rows if r["method"] == "relsql" and r["target"] == "app.popular"]
    assert all(r["epochs"] == 3 for r in relsql_rows)
    entry = result["summary"][0]
    scores = [r["score"] for r in relsql_rows]
    assert entry["target"] == "app.popular"
    assert entry["methods"]["relsql"]["mean"] == pytest.approx(np.mean(scores))
    assert entry["methods"]["relsql"]["std"] == pytest.approx(np.std(scores))
    assert set(entry["relsql_at_least"]) == set(quality.METHODS) - {"relsql"}
    assert result["settings"]["fit"] == {"epochs": 3}


def test_split_is_the_models(tmp_path, targets):
    """The peer is given exactly the relsql model's train/val/test rows."""
    import relsql

    db, target = targets["app.popular"]
    path = relgen.write(db, tmp_path / "social.duckdb", "app.popular")
    con = relsql.connect(str(path), read_only=True)
    model = relsql.Model(con, relsql.Template.auto(con, target="app.popular"), target="app.popular", seed=2, progress=False)
    positions = quality.split_positions(model.learner, len(target.values))
    for split, rows in model.learner.rows.items():
        assert len(positions[split]) == len(rows)
        labels = np.asarray(target.values[positions[split]], dtype=np.float64)
        assert np.array_equal(np.sort(labels), np.sort(model.learner.y[rows].double().numpy()))
    assert not set(positions["train"]) & set(positions["test"])
    con.close()


def test_search_column_counted(tmp_path, capsys):
    """--search adds relsql_search per seed, on the model's split, and a count against the one-hop GBM."""
    out = tmp_path / "quality.json"
    quality.main(["--targets", "region.growth", "--seeds", "0", "1", "--scale", "0.4", "--search", "3s", "--fit", '{"epochs": 3}',
                  "--peer", '{"epochs": 3}', "--out", str(tmp_path / "db"), "--json", str(out)])
    result = json.loads(out.read_text())
    searched = [r for r in result["rows"] if r["method"] == quality.SEARCH]
    assert sorted(r["seed"] for r in searched) == [0, 1]
    assert all(r["score"] > 0 and "r2" in r["scores"] and r["trials"] >= 1 for r in searched)
    entry = result["summary"][0]
    assert entry["methods"][quality.SEARCH]["mean"] == pytest.approx(np.mean([r["score"] for r in searched]))
    flat = entry["methods"]["gbm_one_hop"]
    assert entry["search_at_least_one_hop"] == quality.at_least(entry["methods"][quality.SEARCH], flat, "mae")
    assert quality.SEARCH not in entry["relsql_at_least"]
    printed = capsys.readouterr().out
    assert ("relsql with search >= gbm_one_hop (within one std of relsql_search): "
            f"{int(entry['search_at_least_one_hop'])} of 1") in printed
    assert result["settings"]["search"] == "3s"


def test_peer_reads_a_database_file_as_relgen_frames(tmp_path, targets):
    """rdl_peer.read + graph_of on a written relgen file give the encodings and edges graph() builds from its frames."""
    from bench import rdl_peer

    db, target = targets["txn.fraud"]
    path = relgen.write(db, tmp_path / "bank.duckdb", "txn.fraud")
    direct, direct_edges = rdl_peer.graph(db, target.column, target.table)
    read, read_edges = rdl_peer.graph_of(rdl_peer.read(path), target.table, target.column)
    assert set(direct) == set(read)
    for name in direct:
        np.testing.assert_allclose(read[name].numbers.numpy(), direct[name].numbers.numpy(), rtol=0, atol=1e-6)
        assert read[name].sizes == direct[name].sizes
    forward = {k: v for k, v in direct_edges.items() if not k[1].startswith("rev_")}
    assert {k: v.tolist() for k, v in forward.items()} == {k: read_edges[k].tolist() for k in forward}
    assert len(read_edges) == len(direct_edges)


def _declared(con) -> set[tuple[str, str, tuple[str, ...]]]:
    rows = con.execute("SELECT table_name, constraint_type, constraint_column_names FROM duckdb_constraints() "
                       "WHERE constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY')").fetchall()
    return {(t, kind, tuple(c)) for t, kind, c in rows}


def test_mutagenesis_and_nations_files(tmp_path):
    from bench import realdata

    con = duckdb.connect(str(realdata.write("molecule.mutagenic", tmp_path / "m.duckdb")), read_only=True)
    assert con.execute("SELECT count(*), sum(mutagenic::INT) FROM molecule").fetchone() == (188, 125)
    assert ("bond", "FOREIGN KEY", ("atom1_id",)) in _declared(con)
    con.close()
    facts, queries = realdata.nations_facts()
    con = duckdb.connect(str(realdata.write("holds.label", tmp_path / "n.duckdb")), read_only=True)
    assert con.execute("SELECT count(*), sum(label::INT) FROM holds").fetchone() == (806, 541)
    assert con.execute("SELECT count(*) FROM tie").fetchone()[0] == sum(len(f) == 3 for f in facts) == 996
    # every holds row is the query it came from, label included
    got = set(con.execute("SELECT n.name, a.name, h.label FROM holds h JOIN nation n USING (nation_id) "
                          "JOIN attribute a USING (attribute_id)").fetchall())
    assert got == {(a[0], a[1], v > 0.5) for v, a in queries if len(a) == 2}
    # no positive fact r(nation, attribute) is an input: the file has no table of them
    assert ({t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
            == {"nation", "attribute", "tie", "holds"})
    assert ("holds", "FOREIGN KEY", ("attribute_id",)) in _declared(con)
    con.close()


def test_tpcds_labels_come_from_later_sales_the_inputs_lack(tmp_path):
    """customer.buys_again / customer.spend recomputed from a separate dsdgen run; no input sale on or after the cut."""
    from bench import realdata
    from relsql.connectors.extensions import load

    path = realdata.write_tpcds(tmp_path / "tpcds.duckdb", "buys_again")
    spend = realdata.write_tpcds(tmp_path / "spend.duckdb", "spend")
    ref = duckdb.connect()
    load(ref, "tpcds")
    ref.execute("CALL dsdgen(sf=0.01)")
    expected = dict(ref.execute("""
        SELECT ss_customer_sk, bool_or(d_date >= DATE '2002-07-01') FROM store_sales JOIN date_dim ON d_date_sk = ss_sold_date_sk
        WHERE ss_customer_sk IS NOT NULL GROUP BY 1 HAVING bool_or(d_date < DATE '2002-07-01')""").fetchall())
    later = dict(ref.execute("""
        SELECT k, ln(1 + sum(p)) FROM (
          SELECT ss_customer_sk AS k, ss_net_paid AS p, d_date FROM store_sales JOIN date_dim ON d_date_sk = ss_sold_date_sk
          UNION ALL SELECT ws_bill_customer_sk, ws_net_paid, d_date FROM web_sales JOIN date_dim ON d_date_sk = ws_sold_date_sk)
        WHERE d_date >= DATE '2002-07-01' GROUP BY 1""").fetchall())
    ref.close()
    con = duckdb.connect(str(path), read_only=True)
    assert dict(con.execute("SELECT c_customer_sk, buys_again FROM customer").fetchall()) == expected
    assert 0.1 < np.mean(list(expected.values())) < 0.5
    assert con.execute("SELECT max(ss_sold_date) FROM store_sales").fetchone()[0].isoformat() < "2002-07-01"
    assert con.execute("SELECT max(ws_sold_date) FROM web_sales").fetchone()[0].isoformat() < "2002-07-01"
    assert ("store_sales", "FOREIGN KEY", ("ss_customer_sk",)) in _declared(con)
    con.close()
    con = duckdb.connect(str(spend), read_only=True)
    got = dict(con.execute("SELECT c_customer_sk, spend FROM customer").fetchall())
    con.close()
    assert set(got) == set(expected)
    np.testing.assert_allclose([got[k] for k in got], [later.get(k, 0.0) for k in got], rtol=1e-9, atol=1e-9)


def test_tiny_run_on_the_extra_targets(tmp_path):
    """Mutagenesis (text keys) and Nations through the harness: every method scored on the model's split."""
    out = tmp_path / "quality.json"
    names = ["molecule.mutagenic", "holds.label"]
    quality.main(["--targets", *names, "--seeds", "0", "--fit", '{"epochs": 3}', "--peer", '{"epochs": 3}',
                  "--out", str(tmp_path / "db"), "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    for name in names:
        methods = {r["method"] for r in rows if r["target"] == name}
        assert {"relsql", "majority", "gbm_one_hop", "rdl_peer"} <= methods, name
        assert all(0 <= r["score"] <= 1 and r["metric"] == "roc_auc" for r in rows if r["target"] == name)
    case = quality.make_case("molecule.mutagenic", tmp_path / "again", 1.0)
    assert len(case.keys) == 188 and case.keys.dtype == object and case.values.sum() == 125
