"""A user's files are never replaced (issue 42, item 1): relsql writes a model, its plot, a template or
an --out file only where nothing is, or over a file of that kind it wrote itself and nobody changed
since (relsql/ownfiles.py); a user's file is refused, even with --replace, with an error naming the
file and the fix, and its bytes stay as they were. Also: a tracker's bad log folder, an MLflow
server that never answers or a file store that fails, and a callback that raises are RelsqlErrors.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket

import polars as pl
import pytest

import relsql
from relsql import ownfiles
from relsql.cli import main
from relsql.cli import output as outputs
from relsql.train.loop.tracking import MLflow, TensorBoard
from tests.test_model import SIMPLE, build
from tests.test_trainer import customers, model

TARGET = "customer.churned"
USER = b"a user's own bytes\nprediction,customer_id\n1,2\n"  # looks like predictions: it is still the user's


def cli(capsys, *argv) -> tuple[int, str]:
    """Run the command line in this process: its exit status and its one error line (after argparse's
    usage lines for a usage error, exit 2)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err, err
    if code == 2:
        assert len([line for line in err.splitlines() if "error:" in line]) == 1, err
    elif code:
        assert len(err.strip().splitlines()) == 1, err
    return code, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small shop database and a model saved for it (two epochs)."""
    folder = tmp_path_factory.mktemp("owned")
    build(folder / "shop.duckdb", n=60).con.close()
    (folder / "t.sql").write_text(SIMPLE)
    with relsql.connect(folder / "shop.duckdb") as db:
        m = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target=TARGET, progress=False)
        m.fit(epochs=2, hybrid=False, time_budget=None)
        m.save(folder / "m.pt")
    return folder


@pytest.fixture
def shop(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("shop.duckdb", "t.sql", "m.pt", "m.png"):
        shutil.copyfile(trained / name, tmp_path / name)
    return tmp_path


# -- the command line ---------------------------------------------------------------------------------------------
def test_train_never_replaces_a_users_model_file_or_plot(shop, capsys):
    db = shop / "shop.duckdb"
    mine = shop / "mine.pt"
    mine.write_bytes(USER)
    code, err = cli(capsys, "train", db, "--template", shop / "t.sql", "--target", TARGET, "--epochs", "1", "--model", mine)
    assert code == 2 and "mine.pt" in err and "--model" in err and "did not write" in err
    assert mine.read_bytes() == USER and not (shop / "mine.png").exists()
    (shop / "new.png").write_bytes(USER)  # the plot would go beside new.pt: refused before training
    code, err = cli(capsys, "train", db, "--template", shop / "t.sql", "--target", TARGET, "--epochs", "1", "--model",
                    shop / "new.pt")
    assert code == 1 and "new.png" in err and "--model" in err
    assert (shop / "new.png").read_bytes() == USER and not (shop / "new.pt").exists()
    # relsql's own model and plot (Model.save's, as `relsql train` saves) would be replaced
    assert ownfiles.refusal(shop / "m.pt", "model") is None and ownfiles.refusal(shop / "m.png", "metrics plot") is None


def test_template_output_replaces_only_an_unedited_template_it_wrote(shop, capsys):
    db, notes = shop / "shop.duckdb", shop / "notes.txt"
    notes.write_bytes(USER)
    code, err = cli(capsys, "template", db, "--target", TARGET, "-o", notes)
    assert code == 2 and "notes.txt" in err and "-o" in err and notes.read_bytes() == USER
    ours = shop / "auto.sql"
    assert cli(capsys, "template", db, "--target", TARGET, "--hops", "1", "-o", ours)[0] == 0
    first = ours.read_text()
    assert cli(capsys, "template", db, "--target", TARGET, "--hops", "2", "--width", "8", "-o", ours)[0] == 0
    assert ours.read_text() != first  # relsql's own, unchanged since: replaced
    edited = ours.read_text() + "-- my edit\n"
    ours.write_text(edited)
    code, err = cli(capsys, "template", db, "--target", TARGET, "-o", ours)
    assert code == 2 and "auto.sql" in err and "changed since" in err and ours.read_text() == edited


@pytest.mark.parametrize("name", ["theirs.csv", "theirs.parquet"])
def test_predict_out_replace_never_replaces_a_file_relsql_did_not_write(shop, capsys, name):
    db, out = shop / "shop.duckdb", shop / name
    if name.endswith(".csv"):
        out.write_bytes(USER)  # a header with a prediction column, as relsql's CSVs have
    else:
        pl.DataFrame({"customer_id": [1], "prediction": [True]}).write_parquet(out)
    data = out.read_bytes()
    code, err = cli(capsys, "predict", db, "--model", shop / "m.pt", "--out", out, "--replace")
    assert code == 2 and name in err and "relsql" in err and out.read_bytes() == data
    ours = shop / ("ours" + out.suffix)
    assert cli(capsys, "predict", db, "--model", shop / "m.pt", "--out", ours)[0] == 0
    code, _ = cli(capsys, "predict", db, "--model", shop / "m.pt", "--out", ours, "--replace", "--where", "spend > 3")
    written = pl.read_csv(ours) if name.endswith(".csv") else pl.read_parquet(ours)
    assert code == 0 and 0 < written.height < 60  # its own file: replaced by the fewer rows --where chose
    if name.endswith(".csv"):  # a CSV of relsql's, then changed by the user: the user's now
        ours.write_text(ours.read_text() + "999,true,0.5,test\n")
        changed = ours.read_bytes()
        code, err = cli(capsys, "predict", db, "--model", shop / "m.pt", "--out", ours, "--replace")
        assert code == 2 and "changed since" in err and ours.read_bytes() == changed


def test_recommendations_never_replace_a_users_csv(tmp_path):
    """recommend --out writes through the same function, with the kind `recommendations`."""
    theirs = tmp_path / "theirs.csv"
    theirs.write_bytes(b"task_id,item_id,rank,score\n1,2,1,0.5\n")
    frame = pl.DataFrame({"task_id": [1], "item_id": [3], "rank": [1], "score": [0.9]})
    with pytest.raises(relsql.RelsqlError, match="theirs.csv.*not a file of recommendations relsql wrote"):
        outputs.write_predictions(frame, theirs, True, kind="recommendations")
    assert theirs.read_bytes() == b"task_id,item_id,rank,score\n1,2,1,0.5\n"
    ours = tmp_path / "ours.csv"
    outputs.write_predictions(frame, ours, False, kind="recommendations")
    with pytest.raises(relsql.RelsqlError, match="not a file of predictions"):  # a kind is not another kind
        outputs.write_predictions(frame, ours, True, kind="predictions")
    outputs.write_predictions(frame.with_columns(pl.lit(0.1).alias("score")), ours, True, kind="recommendations")
    assert pl.read_csv(ours)["score"].to_list() == [0.1]


# -- the library ---------------------------------------------------------------------------------------------------
def test_model_save_refuses_a_users_file_a_link_and_a_fifo_without_opening_it(shop):
    m_path = shop / "m.pt"
    with relsql.connect(shop / "shop.duckdb", read_only=True) as db:
        m = relsql.Model.load(m_path, db)
        mine = shop / "mine.pt"
        mine.write_bytes(USER)
        (shop / "link.pt").symlink_to(m_path)  # even to relsql's own model: the link is the user's
        os.mkfifo(shop / "fifo.pt")
        for name in ("mine.pt", "link.pt", "fifo.pt"):
            with pytest.raises(relsql.RelsqlError, match=f"{name}.*never replaces a file it did not write"):
                m.save(shop / name)
        assert mine.read_bytes() == USER and os.readlink(shop / "link.pt") == str(m_path)
        assert m.save(shop / "copy.pt") == shop / "copy.pt" and m.save(shop / "copy.pt")  # its own: replaced
    assert sorted(p.name for p in shop.iterdir() if p.name.startswith(".")) == []  # no temporary file stays


def test_fit_never_writes_its_checkpoint_over_a_users_file(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_bytes(USER)
    m = model(customers())
    with pytest.raises(relsql.RelsqlError, match="notes.txt.*never replaces a file it did not write"):
        m.fit(epochs=2, checkpoint=mine, hybrid=False)
    assert mine.read_bytes() == USER and not m.history  # refused before training
    m.fit(epochs=2, checkpoint=tmp_path / "run.ckpt", hybrid=False)
    m.fit(epochs=3, checkpoint=tmp_path / "run.ckpt", hybrid=False)  # its own checkpoint: written again
    assert ownfiles.refusal(tmp_path / "run.ckpt", "checkpoint") is None


def test_tensorboard_keeps_a_users_template_and_refuses_bad_log_folders(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.chdir(tmp_path)
    m = model(customers(40))
    run = tmp_path / "run"
    run.mkdir()
    (run / "template.sql").write_bytes(USER)
    with pytest.raises(relsql.RelsqlError, match="template.sql.*not a template relsql wrote"):
        TensorBoard(m, run)
    assert (run / "template.sql").read_bytes() == USER
    afile = tmp_path / "afile"
    afile.write_bytes(USER)
    os.mkfifo(tmp_path / "fifo")
    for bad, words in [("", "logdir must name a folder"), (3, "logdir must be a folder path"),
                       (afile, "afile exists and is not a folder"), (tmp_path / "fifo", "fifo exists and is not a folder"),
                       ("/dev/null", "/dev/null exists and is not a folder"), (afile / "sub", "afile/sub")]:
        with pytest.raises(relsql.RelsqlError, match=words):
            TensorBoard(m, bad)
    assert afile.read_bytes() == USER and not (tmp_path / "template.sql").exists() and not (tmp_path / "runs").exists()
    mine = tmp_path / "mine"
    for _ in range(2):  # a second run into the same folder replaces the template relsql wrote there
        with TensorBoard(m, mine):
            pass
    assert (mine / "template.sql").read_text() == m.template.source


def test_a_raising_callback_is_a_relsql_error_naming_it(tmp_path):
    m = model(customers(60), batch_size=20)

    def my_callback(info: dict) -> None:
        if info["epoch"] == 1 and info["batch"] == 1:
            raise ValueError("the user's bug")

    with pytest.raises(relsql.RelsqlError, match="callback .*my_callback raised ValueError: the user's bug") as caught:
        m.fit(epochs=3, batch_size=20, hybrid=False, time_budget=None, callback=my_callback)
    assert isinstance(caught.value.__cause__, ValueError)
    assert len(m.history) == 1 and m.predict().height == 60  # the finished epoch is kept, the model usable


# -- MLflow ------------------------------------------------------------------------------------------------------
def test_mlflow_file_store_errors_are_relsql_errors(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    afile = tmp_path / "afile"
    afile.write_bytes(USER)
    m = model(customers(40))
    try:
        mlflow.set_tracking_uri(afile.as_uri())
        with pytest.raises(relsql.RelsqlError, match="MLflow could not start a run at tracking URI .*afile"):
            MLflow(m, experiment="x")
    finally:
        mlflow.set_tracking_uri(None)
    assert afile.read_bytes() == USER and mlflow.active_run() is None


def _alarm(signum, frame):
    raise TimeoutError("MLflow hung: no answer within 120 s")


def test_an_mlflow_server_that_never_answers_fails_with_a_clear_error(monkeypatch):
    """A server that accepts connections and never answers (the kernel accepts into the listen
    backlog), and an unroutable address: each a RelsqlError naming the URI, in seconds; the bound
    of 120 s only keeps a regression from hanging the test run."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    m = model(customers(40))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for uri in (f"http://127.0.0.1:{silent.getsockname()[1]}", "http://10.255.255.1:9"):
            mlflow.set_tracking_uri(uri)
            signal.alarm(120)
            with pytest.raises(relsql.RelsqlError) as caught:
                with MLflow(m, experiment="x") as run:
                    m.fit(epochs=1, hybrid=False, time_budget=None, callback=run)
            signal.alarm(0)
            message = str(caught.value)
            assert uri in message and "MLFLOW_TRACKING_URI" in message, message
            if uri.startswith("http://127"):  # (a sandbox's network may answer for the unroutable one: MLflow's error then)
                assert "did not answer within 5 s" in message and "MLFLOW_HTTP_REQUEST_TIMEOUT" in message, message
            assert mlflow.active_run() is None and not m.history  # nothing trained, no run left open
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        silent.close()
        mlflow.set_tracking_uri(None)


def test_an_mlflow_uri_with_a_password_is_not_shown():
    from relsql.train.loop.tracking import _shown

    assert _shown("https://me:secret@mlflow.example:5000/x") == "https://mlflow.example:5000/x"
    assert _shown("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
