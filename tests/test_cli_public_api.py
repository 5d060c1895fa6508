"""`relsql predict` and `relsql recommend` are plain users of relsql.Model (#43): what they write
(files and tables) equals what Model.load(...).predict / recommend give on the same model, the
table rows are checked against the rows SQL selects, `--where` grounds only the rows asked for (the
loaded model is never built whole), and the commands reach nothing private of the model."""

from __future__ import annotations

import ast
import inspect
import shutil
import textwrap

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

import relsql
from relsql import cli as cli_module
from relsql.cli import main
from relsql.train.learner import loaded as loaded_module
from tests.test_model import SIMPLE, build
from tests.test_ranking import shop as ranking_shop

WHERE = "spend > 2 AND tier <> 'gold' OR segment IS NULL"


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def sql_ids(db_path, condition: str, key: str = "customer_id", table: str = "customer") -> list[int]:
    """The oracle: the keys DuckDB itself selects with the condition pasted into plain SQL."""
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return [r[0] for r in con.execute(f"SELECT {key} FROM {table} WHERE {condition} ORDER BY 1").fetchall()]
    finally:
        con.close()


def table_frame(db_path, name: str, order: str) -> pl.DataFrame:
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return pl.from_arrow(con.execute(f'SELECT * FROM "{name}" ORDER BY {order}').to_arrow_table())
    finally:
        con.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_api")
    build(folder / "shop.duckdb", n=60).con.close()
    (folder / "t.sql").write_text(SIMPLE)
    assert main([str(a) for a in ["train", folder / "shop.duckdb", "--template", folder / "t.sql", "--target",
                                  "customer.churned", "--epochs", "4", "--model", folder / "m.pt"]]) == 0
    return folder


@pytest.fixture
def scored(trained, tmp_path):
    shutil.copyfile(trained / "shop.duckdb", tmp_path / "shop.duckdb")
    shutil.copyfile(trained / "m.pt", tmp_path / "m.pt")
    return tmp_path


def api(folder, **load) -> relsql.Model:
    """The saved model loaded on a copy of the database (the CLI's file stays free)."""
    copy = folder / f"api-{len(list(folder.glob('api-*')))}.duckdb"
    shutil.copyfile(folder / "shop.duckdb", copy)
    return relsql.Model.load(folder / "m.pt", relsql.connect(copy, read_only=True), **load)


def test_predict_out_and_table_are_model_predict(scored, capsys):
    db = scored / "shop.duckdb"
    assert cli(capsys, "predict", db, "--model", scored / "m.pt", "--out", scored / "all.parquet")[0] == 0
    assert cli(capsys, "predict", db, "--model", scored / "m.pt", "--out", scored / "w.parquet", "--where", WHERE)[0] == 0
    code, out, _ = cli(capsys, "predict", db, "--model", scored / "m.pt", "--table", "preds_w", "--where", WHERE)
    oracle = sql_ids(db, WHERE)
    assert code == 0 and f"wrote {len(oracle)} predictions to table preds_w" in out and 0 < len(oracle) < 60
    every = api(scored).predict()
    assert every.columns[-1] == "split" and every.height == 60
    assert pl.read_parquet(scored / "all.parquet").equals(every)
    chosen = pl.read_parquet(scored / "w.parquet")
    assert chosen["customer_id"].to_list() == oracle
    assert chosen.equals(api(scored).predict(where=WHERE))
    assert chosen.equals(every.filter(pl.col("customer_id").is_in(oracle)))  # the rows-only path, same values
    table = table_frame(db, "preds_w", "customer_id")
    assert table.columns == ["customer_id", "prediction", "probability"]  # no split column in a table
    assert table.equals(chosen.drop("split"))
    assert cli(capsys, "predict", db, "--model", scored / "m.pt", "--table", "preds")[0] == 0
    assert table_frame(db, "preds", "customer_id").equals(every.drop("split"))


def test_predict_with_split_false_and_write_predictions_where(scored):
    model = api(scored)
    every, bare = model.predict(), model.predict(with_split=False)
    assert bare.equals(every.drop("split"))
    keys = {"customer_id": [41, 3, 17]}
    assert model.predict(keys, with_split=False).equals(model.predict(keys).drop("split"))
    assert model.predict(keys)["customer_id"].to_list() == [41, 3, 17]
    oracle = sql_ids(scored / "shop.duckdb", WHERE)
    writer = relsql.Model.load(scored / "m.pt", relsql.connect(scored / "shop.duckdb"))
    assert writer.write_predictions("some", where=WHERE) == len(oracle)
    assert writer.write_predictions("every") == 60
    assert writer.write_predictions("picked", keys=keys) == 3
    written = {name: pl.from_arrow(writer.db.arrow(f'SELECT * FROM "{name}" ORDER BY customer_id'))
               for name in ("some", "every", "picked")}
    writer.db.close()
    assert written["every"].equals(bare)
    assert written["some"].equals(bare.filter(pl.col("customer_id").is_in(oracle)))
    assert written["picked"].equals(bare.filter(pl.col("customer_id").is_in([3, 17, 41])))


def test_predict_batch_size_where_is_model_predict(scored, capsys):
    db = scored / "shop.duckdb"
    code, _, _ = cli(capsys, "predict", db, "--model", scored / "m.pt", "--batch-size", "7", "--where", WHERE,
                     "--out", scored / "bw.csv")
    written = pl.read_csv(scored / "bw.csv")
    expected = api(scored, batch_size=7).predict(where=WHERE)
    assert code == 0 and written["customer_id"].to_list() == sql_ids(db, WHERE)
    assert written.drop("probability").equals(expected.drop("probability"))
    assert (written["probability"] - expected["probability"]).abs().max() < 1e-12


def test_predict_where_grounds_only_the_rows_asked_for(scored, capsys, monkeypatch):
    """The CLI's --where takes Model.predict's rows-only path: the loaded model is never built
    whole (building it would call Pending.complete); predict of every row does build it."""
    built = []
    real = loaded_module.Pending.complete
    monkeypatch.setattr(loaded_module.Pending, "complete", lambda self, learner: (built.append(1), real(self, learner)))
    db = scored / "shop.duckdb"
    assert cli(capsys, "predict", db, "--model", scored / "m.pt", "--where", WHERE, "--out", scored / "w.parquet")[0] == 0
    assert cli(capsys, "predict", db, "--model", scored / "m.pt", "--where", WHERE, "--table", "t")[0] == 0
    assert built == []
    assert cli(capsys, "predict", db, "--model", scored / "m.pt", "--out", scored / "all.parquet")[0] == 0
    assert built == [1]


def test_out_and_table_together_are_refused(scored, capsys):
    code, _, err = cli(capsys, "predict", scored / "shop.duckdb", "--model", scored / "m.pt", "--out", scored / "p.csv",
                       "--table", "preds")
    assert code == 2 and "--table" in err and "--out" in err and not (scored / "p.csv").exists()


def test_bad_where_column_is_a_public_where_error(scored, capsys):
    with pytest.raises(relsql.WhereError, match="no column `nope`"):
        api(scored).predict(where="nope > 1")
    code, _, err = cli(capsys, "predict", scored / "shop.duckdb", "--model", scored / "m.pt", "--where", "nope > 1")
    assert code == 2 and "--where" in err and "no column `nope`" in err


def test_recommend_table_and_out_are_model_recommend(tmp_path, capsys):
    db_path = tmp_path / "shop.duckdb"
    ranking_shop(db_path, customers=24, items=15).close()
    assert cli(capsys, "task", db_path, "LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT EVERY 30 DAYS",
               "--name", "task2")[0] == 0
    model_path = tmp_path / "r.relsql"
    assert cli(capsys, "train", db_path, "--target", "task2.item_id", "--time-column", "snapshot", "--model", model_path,
               "--epochs", "3")[0] == 0
    where = "customer_id < 5"
    code, out, _ = cli(capsys, "recommend", db_path, "--model", model_path, "--k", "2", "--where", where, "--table", "r_w")
    assert code == 0
    assert cli(capsys, "recommend", db_path, "--model", model_path, "--table", "r_all")[0] == 0
    assert cli(capsys, "recommend", db_path, "--model", model_path, "--k", "4", "--out", tmp_path / "r.parquet")[0] == 0
    with relsql.connect(str(db_path), read_only=True) as db:
        model = relsql.Model.load(model_path, db)
        chosen, default, four = model.recommend(2, where=where), model.recommend(), model.recommend(4)
    oracle = sql_ids(db_path, where, key="task_id", table="task2")
    assert f"wrote {chosen.height} recommendations to table r_w" in out
    assert sorted(set(chosen["task_id"].to_list())) == oracle and chosen.height == 2 * len(oracle)
    assert table_frame(db_path, "r_w", "task_id, rank").equals(chosen.sort("task_id", "rank"))
    assert table_frame(db_path, "r_all", "task_id, rank").equals(default.sort("task_id", "rank"))
    assert pl.from_arrow(pq.read_table(tmp_path / "r.parquet")).equals(four)


def test_scoring_commands_reach_only_the_public_model():
    """_predict and _recommend import nothing from relsql.train and touch no private member of the
    model (`.learner`, `_...`): what they do, a user of relsql.Model can do."""
    for command in (cli_module._predict, cli_module._recommend, cli_module._where_is_usage):
        tree = ast.parse(textwrap.dedent(inspect.getsource(command)))
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert imports == [], command.__name__
        attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert "learner" not in attributes and not any(a.startswith("_") for a in attributes), command.__name__


def test_where_is_checked_below_the_training_layer():
    """--where is checked when the arguments are parsed, by relsql.where (below relsql.train and the
    CLI both), not by reaching into relsql.train: in a fresh interpreter the check loads no module
    of relsql.train, accepts a condition and refuses a subquery with the parser's reason."""
    import subprocess
    import sys

    script = textwrap.dedent("""
        import argparse, sys
        from relsql.cli.arguments import where_condition
        assert where_condition("spend > 2 AND tier <> 'gold'") == "spend > 2 AND tier <> 'gold'"
        try:
            where_condition("spend IN (SELECT 1)")
        except argparse.ArgumentTypeError as err:
            print("refused:", err)
        print("train:", sorted(m for m in sys.modules if m.startswith("relsql.train")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: where 'spend IN (SELECT 1)' contains a query" in done.stdout, done.stdout
    assert "train: []" in done.stdout, done.stdout
