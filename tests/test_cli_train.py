"""`relsql train` and `relsql predict` options end to end on a small DuckDB file: each option changes
something observable (the saved model, its history, the report, the files written); bad values
exit 2 with a one-line message and no traceback; the user's tables are left as they were."""

from __future__ import annotations

import itertools
import shlex
import shutil
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch
from sklearn.utils.class_weight import compute_class_weight

import relsql
from relsql.cli import main
from relsql.template.auto import HEADER
from tests.test_model import SIMPLE, build

TARGET = "customer.churned"
COPIES = itertools.count()


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def usage_error(code: int, err: str, *words: str) -> None:
    """Exit 2 and one error line naming what is wrong."""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1, err
    for word in words:
        assert word in errors[0], (word, errors[0])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = tmp_path_factory.mktemp("built") / "shop.duckdb"
    build(path, n=60).con.close()
    return path


@pytest.fixture
def shop(tmp_path, monkeypatch, built):
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(built, tmp_path / "shop.duckdb")
    (tmp_path / "t.sql").write_text(SIMPLE)
    return tmp_path


def tables(path: Path) -> dict[str, list]:
    """Every user table's rows in order: what must be unchanged after any command."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        names = [r[0] for r in con.execute("SHOW TABLES").fetchall()]
        return {n: con.execute(f'SELECT * FROM "{n}" ORDER BY ALL').fetchall() for n in names}
    finally:
        con.close()


def loaded(db_path: Path, model: Path, **kw) -> relsql.Model:
    """A saved model loaded on a copy of the database (the original stays free for the next command)."""
    copy = db_path.with_name(f"copy-{next(COPIES)}.duckdb")
    shutil.copyfile(db_path, copy)
    return relsql.Model.load(model, relsql.connect(copy, read_only=True), **kw)


def train(shop: Path, *extra) -> list:
    return ["train", shop / "shop.duckdb", "--template", shop / "t.sql", "--target", TARGET, "--model", shop / "m.pt", *extra]


# -- fit options: given ones only, fit's defaults otherwise ---------------------------------------------------
def test_fit_defaults_and_time_budget(shop, capsys):
    code, out, _ = cli(capsys, *train(shop, "--time-budget", "3", "--patience", "5"))
    assert code == 0
    assert "(limits: 400 epochs, 3s)" in out  # fit's 400 epochs, not the CLI's former 100
    model = loaded(shop / "shop.duckdb", shop / "m.pt")
    assert model.history[0]["lr"] == pytest.approx(0.01)
    code, out, _ = cli(capsys, *train(shop, "--time-budget", "none", "--epochs", "4"))
    assert code == 0 and "(limits: 4 epochs)" in out


def test_schedule(shop, capsys):
    assert cli(capsys, *train(shop, "--schedule", "none", "--epochs", "6", "--lr", "0.05"))[0] == 0
    rates = [h["lr"] for h in loaded(shop / "shop.duckdb", shop / "m.pt").history]
    assert rates == [pytest.approx(0.05)] * 6
    assert cli(capsys, *train(shop, "--schedule", "cosine", "--epochs", "6", "--lr", "0.05"))[0] == 0
    rates = [h["lr"] for h in loaded(shop / "shop.duckdb", shop / "m.pt").history]
    assert len(set(np.round(rates, 12))) > 1 and max(rates) <= 0.05 + 1e-12 and rates[-1] < rates[1]


def test_split_without_a_test_part(shop, capsys):
    assert cli(capsys, *train(shop, "--split", "0.85,0.15,0", "--epochs", "2"))[0] == 0
    model = loaded(shop / "shop.duckdb", shop / "m.pt")
    assert tuple(model.fractions) == (0.85, 0.15, 0.0)
    assert len(model.rows["test"]) == 0 and len(model.rows["train"]) > 4 * len(model.rows["val"]) > 0


def test_refit_is_reported(shop, capsys):
    code, out, _ = cli(capsys, *train(shop, "--epochs", "5"))  # by default: refit on every labelled row
    assert code == 0 and "refit: the network went on from the selected weights" in out and "measured before the refit" in out
    code, out, _ = cli(capsys, *train(shop, "--no-refit", "--epochs", "5"))
    assert code == 0 and "refit: none (refit=False)" in out and "went on from" not in out


def test_regression_loss(shop, capsys):
    """--loss mae: the validation loss is the MAE of the standardized target; --loss mse its squared error."""
    for loss in ("mae", "mse"):
        args = train(shop, "--loss", loss, "--epochs", "3", "--task", "regression")
        args[args.index(TARGET)] = "customer.spend"
        assert cli(capsys, *args)[0] == 0
        model = loaded(shop / "shop.duckdb", shop / "m.pt")
        std = model.task.std
        for h in model.history:
            if loss == "mae":
                assert h["val_loss"] * std == pytest.approx(h["val_mae"], rel=1e-5)
            else:
                assert h["val_loss"] * std**2 == pytest.approx(h["val_rmse"] ** 2, rel=1e-5)


def test_class_weight_balanced(shop, capsys):
    """The validation loss is the cross-entropy weighted as scikit-learn's "balanced" weighs classes."""
    assert cli(capsys, *train(shop, "--class-weight", "balanced", "--epochs", "4", "--seed", "3", "--no-refit"))[0] == 0
    model = loaded(shop / "shop.duckdb", shop / "m.pt")
    y_train = model.y[model.rows["train"]].numpy().astype(int)
    weights = compute_class_weight("balanced", classes=np.array([0, 1]), y=y_train)
    out, y = model.learner.split_outputs("val")
    z, y = out[:, 0].double().numpy(), y.double().numpy()
    each = np.logaddexp(0, z) - y * z  # binary cross-entropy with logits
    expected = float(np.mean(each * weights[y.astype(int)]))
    kept = next(h for h in model.history if h["epoch"] == model.best_epoch)
    assert kept["val_loss"] == pytest.approx(expected, rel=1e-4)
    assert abs(float(np.mean(each)) - expected) > 1e-6  # the weights changed the loss


def test_device_cpu_and_a_missing_gpu(shop, capsys):
    assert cli(capsys, *train(shop, "--epochs", "2", "--device", "cpu"))[0] == 0
    code, _, err = cli(capsys, *train(shop, "--epochs", "2", "--device", "cuda:7"))
    usage_error(code, err, "--device", "cuda:7")
    code, _, err = cli(capsys, "predict", shop / "shop.duckdb", "--model", shop / "m.pt", "--device", "cuda:7")
    usage_error(code, err, "--device")
    if not torch.cuda.is_available():
        code, _, err = cli(capsys, "predict", shop / "shop.duckdb", "--model", shop / "m.pt", "--device", "cuda")
        usage_error(code, err, "--device", "no CUDA GPU", "--device cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_cuda_trains_and_predicts_like_cpu(shop, capsys):
    assert cli(capsys, *train(shop, "--epochs", "3", "--device", "cuda"))[0] == 0
    on_gpu = loaded(shop / "shop.duckdb", shop / "m.pt", device="cuda").predict()
    on_cpu = loaded(shop / "shop.duckdb", shop / "m.pt").predict()
    assert np.allclose(on_gpu["probability"].to_numpy(), on_cpu["probability"].to_numpy(), atol=1e-5)


# -- the automatic template --------------------------------------------------------------------------------
def test_train_without_template_trains_and_saves_the_automatic_one(shop, capsys):
    db = shop / "shop.duckdb"
    before = tables(db)
    code, out, _ = cli(capsys, "train", db, "--target", TARGET, "--time-column", "signup", "--hops", "1",
                       "--epochs", "3", "--model", shop / "auto.pt")
    assert code == 0
    saved = (shop / "auto.sql").read_text()
    assert saved.startswith(HEADER) and str(shop / "auto.sql") in out
    code, printed, _ = cli(capsys, "template", db, "--target", TARGET, "--time-column", "signup", "--hops", "1")
    assert code == 0 and printed.strip() == saved.strip()  # relsql template's text, with the same options
    model = loaded(db, shop / "auto.pt")
    assert model.template.source == saved and model.time_column == "signup"
    assert model.learner.hybrid is not None  # an automatic template is blended with a GBM by default
    # the printed next step carries --time-column: copied, it trains on the same template and split
    line = next(x for x in out.splitlines() if x.startswith("automatic template saved to"))
    step = shlex.split(line.split("`")[1])
    assert (step[:2] == ["relsql", "train"] and "--time-column" in step
            and step[step.index("--template") + 1] == str(shop / "auto.sql"))
    step[step.index("--model") + 1] = str(shop / "again.pt")
    assert cli(capsys, *step[1:], "--epochs", "2", "--no-hybrid")[0] == 0
    again = loaded(db, shop / "again.pt")
    assert again.time_column == "signup" and again.rows["test"].tolist() == model.rows["test"].tolist()
    assert again.learner.hybrid is None  # --no-hybrid
    assert tables(db) == before


def test_template_next_step_carries_the_time_column_and_keys(shop, capsys):
    (shop / "keys.sql").write_text("ALTER TABLE orders ADD FOREIGN KEY (customer_id) REFERENCES customer (customer_id);\n")
    code, out, _ = cli(capsys, "template", shop / "shop.duckdb", "--target", TARGET, "--time-column", "signup",
                       "--keys", shop / "keys.sql", "--hops", "1", "-o", shop / "x.sql")
    assert code == 0
    step = shlex.split(out.split("`")[1])
    assert step[step.index("--time-column") + 1] == "signup" and step[step.index("--keys") + 1] == str(shop / "keys.sql")
    assert cli(capsys, *step[1:], "--epochs", "2", "--model", shop / "x.pt")[0] == 0
    assert loaded(shop / "shop.duckdb", shop / "x.pt").time_column == "signup"


def test_an_existing_different_template_beside_the_model_is_kept(shop, capsys):
    (shop / "auto.sql").write_text("-- my edits\n")
    code, _, err = cli(capsys, "train", shop / "shop.duckdb", "--target", TARGET, "--epochs", "1", "--model", shop / "auto.pt")
    assert code == 1 and "auto.sql" in err and "--template" in err
    assert (shop / "auto.sql").read_text() == "-- my edits\n" and not (shop / "auto.pt").exists()


# -- predict: --out, --where, --replace ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory, built):
    folder = tmp_path_factory.mktemp("trained")
    shutil.copyfile(built, folder / "shop.duckdb")
    (folder / "t.sql").write_text(SIMPLE)
    assert main([str(a) for a in ["train", folder / "shop.duckdb", "--template", folder / "t.sql", "--target", TARGET,
                                  "--epochs", "5", "--model", folder / "m.pt"]]) == 0
    return folder


@pytest.fixture
def scored(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(trained / "shop.duckdb", tmp_path / "shop.duckdb")
    shutil.copyfile(trained / "m.pt", tmp_path / "m.pt")
    return tmp_path


def expected(folder: Path) -> pl.DataFrame:
    """Every row's prediction as the Python API gives it (Model.predict of every row: the model built whole)."""
    with relsql.connect(folder / "shop.duckdb", read_only=True) as db:
        return relsql.Model.load(folder / "m.pt", db).predict()


def test_predict_out_parquet_and_csv(scored, capsys):
    db = scored / "shop.duckdb"
    before = tables(db)
    code, out, _ = cli(capsys, "predict", db, "--model", scored / "m.pt", "--out", scored / "p.parquet")
    assert code == 0 and "wrote 60 predictions" in out and "rows by split" in out
    assert len(out.splitlines()) < 10  # a summary, not the table
    written = pl.read_parquet(scored / "p.parquet")
    assert written.equals(expected(scored))
    code, _, _ = cli(capsys, "predict", db, "--model", scored / "m.pt", "--out", scored / "p.csv")
    from_csv = pl.read_csv(scored / "p.csv")
    assert code == 0 and from_csv["customer_id"].to_list() == written["customer_id"].to_list()
    assert np.allclose(from_csv["probability"].to_numpy(), written["probability"].to_numpy())
    # no temp files; the CSV's mark is its sidecar (relsql/ownfiles.py)
    assert sorted(p.name for p in scored.iterdir()) == [".p.csv.relsql", "m.pt", "p.csv", "p.parquet", "shop.duckdb"]
    assert tables(db) == before


def test_predict_where_scores_the_rows_the_database_selects(scored, capsys):
    db = scored / "shop.duckdb"
    condition = "spend > 3 AND tier = 'gold' OR segment IS NULL"
    code, out, _ = cli(capsys, "predict", db, "--model", scored / "m.pt", "--where", condition, "--out", scored / "w.parquet")
    con = duckdb.connect(str(db), read_only=True)
    oracle = [r[0] for r in con.execute(f"SELECT customer_id FROM customer WHERE {condition} ORDER BY 1").fetchall()]
    con.close()
    written = pl.read_parquet(scored / "w.parquet")
    assert code == 0 and 0 < len(oracle) < 60 and written["customer_id"].to_list() == oracle
    every = expected(scored).filter(pl.col("customer_id").is_in(oracle))
    # a float32 model on 19 rows and on 60: matrix products of other shapes may round differently (MKL picks
    # its kernel by shape and CPU), so the probabilities agree to float32's precision, the rest exactly
    assert written.drop("probability").equals(every.drop("probability"))
    assert written["probability"].to_numpy() == pytest.approx(every["probability"].to_numpy(), rel=1e-6, abs=1e-7)


def test_predict_out_never_replaces_what_it_did_not_write(scored, capsys):
    db, model = scored / "shop.duckdb", scored / "m.pt"
    pl.DataFrame({"x": [1, 2]}).write_parquet(scored / "mine.parquet")
    (scored / "mine.csv").write_text("a,b\n1,2\n")
    for name in ("mine.parquet", "mine.csv"):
        data = (scored / name).read_bytes()
        code, _, err = cli(capsys, "predict", db, "--model", model, "--out", scored / name)
        usage_error(code, err, "--out", "exists", "--replace")
        code, _, err = cli(capsys, "predict", db, "--model", model, "--out", scored / name, "--replace")
        usage_error(code, err, "--out", "relsql")
        assert (scored / name).read_bytes() == data
    assert cli(capsys, "predict", db, "--model", model, "--out", scored / "p.parquet")[0] == 0
    assert cli(capsys, "predict", db, "--model", model, "--out", scored / "p.parquet", "--where", "spend > 0",
               "--replace")[0] == 0
    assert pl.read_parquet(scored / "p.parquet").height < 60
    assert pq.read_schema(scored / "p.parquet").metadata[b"relsql"].decode().endswith("predictions")


def test_predict_out_into_a_parquet_folder_database_is_refused(scored, capsys):
    folder = scored / "lake"
    folder.mkdir()
    con = duckdb.connect(str(scored / "shop.duckdb"), read_only=True)
    for table in ("customer", "orders"):
        con.execute(f"COPY {table} TO '{folder / table}.parquet' (FORMAT parquet)")
    con.close()
    code, _, err = cli(capsys, "predict", folder, "--model", scored / "m.pt", "--out", folder / "customer.parquet", "--replace")
    usage_error(code, err, "--out", "database folder", "--table")


# -- bad input: exit 2, one line, nothing changed -------------------------------------------------------------
@pytest.mark.parametrize("condition, words", [
    ("1=1; DROP TABLE customer", ["2 statements"]),
    ("customer_id IN (SELECT customer_id FROM orders)", ["a query"]),
    ("EXISTS (SELECT 1 FROM orders)", ["subquery"]),
    ("orders.amount > 1", ["orders.amount", "not a column"]),
    ("nope > 1", ["no column `nope`"]),
    ("getenv('HOME') = 'x'", ["function"]),
    ("spend + 1", ["not a condition"]),
    ("spend >", ["not valid SQL"]),
])
def test_bad_where(scored, capsys, condition, words):
    db = scored / "shop.duckdb"
    before = tables(db)
    code, out, err = cli(capsys, "predict", db, "--model", scored / "m.pt", "--where", condition, "--out", scored / "p.csv")
    usage_error(code, err, "--where", *words)
    assert tables(db) == before and not (scored / "p.csv").exists() and "wrote" not in out


@pytest.mark.parametrize("extra, words", [
    (["--split", "0.5,0.6,0"], ["--split", "sum to 1"]),
    (["--split", "0.5,0.5"], ["--split", "three"]),
    (["--split", "a,b,c"], ["--split", "three numbers"]),
    (["--split", "0.9,0.2,-0.1"], ["--split", "split[2]"]),
    (["--time-budget", "0"], ["--time-budget", "seconds above 0"]),
    (["--time-budget", "soon"], ["--time-budget", "none for no limit"]),
    (["--schedule", "linear"], ["--schedule", "invalid choice"]),
    (["--loss", "hinge"], ["--loss", "invalid choice"]),
    (["--search", "1m", "--lr", "0.1"], ["--lr", "--search"]),
    (["--hops", "1"], ["--hops", "--template"]),
    (["--task", "binary", "--loss", "mae"], ["--loss", "regression loss"]),
    (["--task", "regression", "--class-weight", "balanced"], ["--class-weight", "weighs classes"]),
])
def test_bad_train_options(shop, capsys, extra, words):
    db = shop / "shop.duckdb"
    before = tables(db)
    code, _, err = cli(capsys, *train(shop, *extra))
    usage_error(code, err, *words)
    assert tables(db) == before and not (shop / "m.pt").exists()


def test_a_model_named_sql_cannot_hold_the_automatic_template(shop, capsys):
    code, _, err = cli(capsys, "train", shop / "shop.duckdb", "--target", TARGET, "--model", shop / "m.sql")
    usage_error(code, err, "--model", ".sql")
