"""`relsql task` with LIST_DISTINCT, `relsql train` on the list target and `relsql recommend`
end to end on a DuckDB file: what is written equals Model.recommend on the saved model, files and
tables are written only where allowed, bad values exit 2 with one line and no traceback."""

from __future__ import annotations

import polars as pl
import pyarrow.parquet as pq

import relsql
from relsql.cli import main
from relsql.data.duckdb import parquet_mark
from tests.test_ranking import shop


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_task_train_recommend(tmp_path, capsys):
    db_path = tmp_path / "shop.duckdb"
    shop(db_path, customers=30, items=20).close()
    code, out, _ = cli(capsys, "task", db_path, "LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT EVERY 30 DAYS",
                       "--name", "task2")
    assert code == 0 and "relsql recommend" in out and "--target task2.item_id" in out
    model_path = tmp_path / "m.relsql"
    code, out, _ = cli(capsys, "train", db_path, "--target", "task2.item_id", "--time-column", "snapshot", "--model", model_path,
                       "--epochs", "5", "--loss", "bpr", "--negatives", "popularity")
    assert code == 0 and "task ranking" in out and "most popular" in out and "relsql recommend" in out
    # a ranking task plots no history (Task.plots_history): the line names no plot, and none is there
    assert f"model saved to {model_path}\n" in out and not model_path.with_suffix(".png").exists()
    where = "customer_id < 4"
    out_file = tmp_path / "recs.parquet"
    code, out, _ = cli(capsys, "recommend", db_path, "--model", model_path, "--k", "3", "--where", where, "--out", out_file)
    assert code == 0, out
    written = pl.from_arrow(pq.read_table(out_file))
    assert parquet_mark(out_file) == "recommendations"
    with relsql.connect(str(db_path)) as db:
        model = relsql.Model.load(model_path, db)
        assert model.task.loss == "bpr" and model.task.negatives == "popularity"
        expected = model.recommend(k=3, where=where)
    assert written.equals(expected) and written.height == 3 * expected["task_id"].n_unique() > 0
    code, _, err = cli(capsys, "recommend", db_path, "--model", model_path, "--out", out_file)
    assert code == 2 and "--replace" in err
    code, _, _ = cli(capsys, "recommend", db_path, "--model", model_path, "--k", "2", "--where", where, "--out", out_file,
                     "--replace")
    assert code == 0 and pq.read_table(out_file).num_rows == 2 * expected["task_id"].n_unique()
    code, out, _ = cli(capsys, "recommend", db_path, "--model", model_path, "--where", where, "--table", "recs")
    assert code == 0
    with relsql.connect(str(db_path)) as db:
        assert db.arrow("SELECT count(*) AS n FROM recs").column("n")[0].as_py() == 10 * expected["task_id"].n_unique()
    code, _, err = cli(capsys, "recommend", db_path, "--model", model_path, "--table", "item", "--replace")
    assert code == 1 and "item" in err
    code, _, err = cli(capsys, "recommend", db_path, "--model", model_path, "--k", "0")
    assert code == 2 and "--k" in err


def test_recommend_refuses_a_model_that_predicts_a_label(tmp_path, capsys):
    db_path = tmp_path / "shop.duckdb"
    shop(db_path, customers=20, items=10).close()
    model_path = tmp_path / "age.relsql"
    with relsql.connect(str(db_path)) as db:
        tpl = relsql.Template.from_sql("CREATE TABLE c_h AS SELECT c.customer_id, linear(embed(c.customer_id, 4), 1) AS h "
                                       "FROM customer c;")
        model = relsql.Model(db, tpl, target="customer.age", task="regression")
        model.fit(epochs=2, hybrid=False)
        model.save(model_path)
    code, _, err = cli(capsys, "recommend", db_path, "--model", model_path)
    assert code == 1 and "relsql predict" in err


def test_train_takes_the_candidate_tower_pairs_and_hard_negatives(tmp_path, capsys):
    """--candidates, --pairs and --hard-negatives reach Model and fit: the saved model names the
    towers given, and a hard-negative rule over a missing table or a tower that does not exist is
    one line naming it (exit 1), no traceback."""
    from tests.test_ranking_pairs import BASE, PAIR, REBOUGHT, habit_shop

    db_path = tmp_path / "habits.duckdb"
    habit_shop(db_path, customers=20).close()
    template = tmp_path / "paired.sql"
    template.write_text(BASE + PAIR)
    model_path = tmp_path / "paired.relsql"
    common = ("train", db_path, "--template", template, "--target", "task_rec.item_id", "--output", "task_h",
              "--time-column", "snapshot", "--epochs", "3", "--model", model_path)
    code, out, err = cli(capsys, *common, "--candidates", "item_h", "--pairs", "pair_h", "--hard-negatives", REBOUGHT)
    assert code == 0, out + err
    with relsql.connect(str(db_path)) as db:
        model = relsql.Model.load(model_path, db)
        assert (model.task.candidates, model.task.pairs) == ("item_h", "pair_h")
    code, _, err = cli(capsys, *common, "--candidates", "nope_h")
    assert code == 1 and "nope_h" in err
    code, _, err = cli(capsys, *common, "--hard-negatives", "SELECT t.task_id, m.item_id FROM task_rec t JOIN missing_t m "
                       "ON m.customer_id = t.customer_id")
    assert code == 1 and "missing_t" in err
