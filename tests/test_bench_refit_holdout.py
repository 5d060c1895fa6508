"""bench/refit_holdout.py: the outer hold-out hides the latest labelled rows in a copy (the source
untouched), and the summary compares each variant with the restart on the runs where it refit the network."""

from __future__ import annotations

import duckdb

from bench import refit_holdout


def test_the_latest_labelled_rows_are_hidden_in_a_copy(tmp_path):
    source = tmp_path / "s.duckdb"
    con = duckdb.connect(str(source))
    con.execute("CREATE TABLE t AS SELECT i AS id, DATE '2020-01-01' + CAST(i AS INTEGER) AS day, "
                "CASE WHEN i % 10 = 9 THEN NULL ELSE i % 2 = 0 END AS label FROM range(50) r(i)")
    con.close()
    (tmp_path / "w").mkdir()
    path, truth = refit_holdout.hide(str(source), tmp_path / "w", "t", "label", "day", seed=0)
    labelled = [i for i in range(50) if i % 10 != 9]
    hidden = sorted(labelled)[-round(0.15 * len(labelled)):]  # the latest by day
    assert sorted(truth["id"].to_list()) == hidden and truth["label"].null_count() == 0
    copy = duckdb.connect(str(path))
    assert sorted(r[0] for r in copy.execute("SELECT id FROM t WHERE label IS NULL").fetchall()) == sorted(
        hidden + [i for i in range(50) if i % 10 == 9])
    copy.close()
    original = duckdb.connect(str(source))
    assert original.execute("SELECT count(*) FROM t WHERE label IS NULL").fetchone()[0] == 5
    original.close()


def test_the_summary_counts_only_runs_whose_restart_refit_the_network():
    def run(db, variant, score, refit, cpu):
        return {"database": db, "seed": 0, "kind": "regression", "variant": variant, "score": score,
                "refit_epochs": refit, "fit_cpu_s": cpu}
    rows = [run("a", "restart", 2.0, 10, 4.0), run("a", "0.5", 1.0, 5, 2.0),  # RMSE halved: gain +0.5
            run("b", "restart", 1.0, 0, 1.0), run("b", "0.5", 3.0, 0, 1.0)]  # network weight 0: not counted
    (line,) = refit_holdout.summary(rows)
    assert line.startswith("0.5 vs restart: 1 runs, better 1, worse 0, mean gain +0.5000") and "fit CPU 0.50x" in line
