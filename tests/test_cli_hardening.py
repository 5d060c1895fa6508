"""The command line under misuse: no traceback ever reaches a user, exit 2 for a wrong command line
(found before anything runs), 1 for an error found while running, 130 when interrupted; a user's
tables and files are never replaced or created by mistake."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import torch

import relsql
from relsql.cli import main
from tests.test_model import SIMPLE, build

TARGET = "customer.churned"


def cli(capsys, *argv) -> tuple[int, str, str]:
    """Run `relsql argv` in-process: main returns the exit status (it never raises SystemExit)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert isinstance(code, int)
    assert "Traceback" not in out + err
    return code, out, err


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = tmp_path_factory.mktemp("built") / "shop.duckdb"
    build(path, n=60).con.close()
    return path


@pytest.fixture
def shop(tmp_path, monkeypatch, built):
    """A small shop database, a template for it, and a few bad files; the working folder is tmp_path."""
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(built, tmp_path / "shop.duckdb")
    (tmp_path / "t.sql").write_text(SIMPLE)
    (tmp_path / "binary.sql").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "text.pt").write_text("not a model")
    (tmp_path / "frob.sql").write_text("CREATE TABLE h AS SELECT c.customer_id, frob(c.spend) FROM customer c;")
    torch.save({"weights": [1, 2, 3]}, tmp_path / "other.pt")
    return tmp_path


def train_args(shop: Path, *extra) -> list[str]:
    return ["train", shop / "shop.duckdb", "--template", shop / "t.sql", "--target", TARGET, *extra]


def tables(path: Path) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    finally:
        con.close()


# -- usage errors: exit 2, the argument named, nothing run ------------------------------------------------
def test_template_output_into_a_missing_folder_or_onto_a_folder(shop, capsys):
    db = shop / "shop.duckdb"
    code, _, err = cli(capsys, "template", db, "--target", TARGET, "-o", shop / "missing" / "x.sql")
    assert code == 2 and "-o/--output" in err and "does not exist" in err and not (shop / "missing").exists()
    code, _, err = cli(capsys, "template", db, "--target", TARGET, "-o", shop)
    assert code == 2 and "-o/--output" in err and "is a folder" in err


def test_template_output_never_overwrites_the_database(shop, capsys):
    db = shop / "shop.duckdb"
    code, _, err = cli(capsys, "template", db, "--target", TARGET, "-o", db)
    assert code == 2 and "-o" in err and "database" in err
    assert tables(db) == {"customer", "orders"}


def test_negative_hops(shop, capsys):
    code, _, err = cli(capsys, "template", shop / "shop.duckdb", "--target", TARGET, "--hops", "-1")
    assert code == 2 and "--hops" in err and "-1" in err


def test_binary_template_file(shop, capsys):
    for command in (["explain", shop / "shop.duckdb"], ["train", shop / "shop.duckdb", "--target", TARGET]):
        code, _, err = cli(capsys, *command, "--template", shop / "binary.sql")
        assert code == 2 and "--template" in err and "not a text file" in err


@pytest.mark.parametrize("lr", ["nan", "-1", "0", "inf"])
def test_learning_rate_must_be_finite_and_positive(shop, capsys, lr):
    code, out, err = cli(capsys, *train_args(shop, "--epochs", "1", "--model", shop / "m.pt", f"--lr={lr}"))
    assert code == 2 and "--lr" in err and "finite number above 0" in err
    assert not (shop / "m.pt").exists() and "task binary" not in out


def test_negative_epochs_never_exit_0(shop, capsys):
    code, _, err = cli(capsys, *train_args(shop, "--epochs", "-1", "--model", shop / "m.pt"))
    assert code == 2 and "--epochs" in err and not (shop / "m.pt").exists()
    code, _, err = cli(capsys, "demo", "--epochs", "-1")
    assert code == 2 and "--epochs" in err


def test_model_onto_a_folder_is_refused_before_training(shop, capsys):
    code, out, err = cli(capsys, *train_args(shop, "--epochs", "1", "--model", shop))
    assert code == 2 and "--model" in err and "is a folder" in err and "task binary" not in out


def test_model_in_a_missing_folder_creates_no_folder(shop, capsys):
    folder = shop / "nonexistent"
    code, out, err = cli(capsys, *train_args(shop, "--epochs", "1", "--model", folder / "m.pt"))
    assert code == 2 and "--model" in err and "does not exist" in err and "create it" in err
    assert not folder.exists() and "task binary" not in out
    code, _, err = cli(capsys, "demo", "--epochs", "1", "--model", folder / "m.pt")
    assert code == 2 and "--model" in err and not folder.exists()


def test_model_clashing_with_the_database_the_template_or_its_plot(shop, capsys):
    for model in (shop / "shop.duckdb", shop / "t.sql", shop / "m.png"):
        code, _, err = cli(capsys, *train_args(shop, "--epochs", "1", "--model", model))
        assert code == 2 and "--model" in err, model
    assert tables(shop / "shop.duckdb") == {"customer", "orders"} and (shop / "t.sql").read_text() == SIMPLE


def test_predict_with_a_file_that_is_not_a_model(shop, capsys):
    db = shop / "shop.duckdb"
    for path in (shop / "text.pt", shop, shop / "missing.pt"):
        code, _, err = cli(capsys, "predict", db, "--model", path)
        assert code == 2 and "--model" in err, path
    # a torch file but not a relsql model: found while reading it, a runtime error
    code, _, err = cli(capsys, "predict", db, "--model", shop / "other.pt")
    assert code == 1 and err.startswith("relsql: ") and "not a relsql model" in err


def test_checkpoint_that_is_not_a_checkpoint(shop, capsys):
    code, out, err = cli(capsys, *train_args(shop, "--epochs", "1", "--model", shop / "m.pt",
                                             "--checkpoint", shop / "text.pt"))
    assert code == 2 and "--checkpoint" in err and "task binary" not in out
    assert (shop / "text.pt").read_text() == "not a model"
    code, _, err = cli(capsys, *train_args(shop, "--epochs", "1", "--model", shop / "m.pt", "--checkpoint",
                                           shop / "m.pt"))
    assert code == 2 and "--checkpoint" in err


def test_help_documents_the_exit_codes(capsys):
    code, out, _ = cli(capsys, "--help")
    assert code == 0 and "exit status" in out and "2 usage error" in out
    code, out, _ = cli(capsys, "train", "--help")
    assert code == 0 and "exit status" in out


def test_python_dash_m_relsql_is_the_command_line(tmp_path):
    """`python -m relsql` runs the CLI (where the `relsql` script is not on PATH), exit codes included."""
    run = [sys.executable, "-m", "relsql"]
    shown = subprocess.run([*run, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert shown.returncode == 0 and "exit status" in shown.stdout and "explain-prediction" in shown.stdout
    missing = subprocess.run([*run, "inspect", str(tmp_path / "nope.duckdb")], capture_output=True, text=True,
                             cwd=tmp_path, timeout=120)
    assert missing.returncode == 2 and "nope.duckdb" in missing.stderr and "Traceback" not in missing.stderr


# -- runtime errors: exit 1, one line `relsql: ...` ------------------------------------------------------
def test_relsql_error_exits_1(shop, capsys):
    code, _, err = cli(capsys, "template", shop / "shop.duckdb", "--target", "nope.x")
    assert code == 1 and err.startswith("relsql: ") and "nope" in err
    code, _, err = cli(capsys, "explain", shop / "shop.duckdb", "--template", shop / "frob.sql")
    assert code == 1 and "frob" in err


def test_unexpected_error_is_one_line_unless_debugging(shop, capsys, monkeypatch):
    def broken(args):
        raise ZeroDivisionError("boom\nsecond line")

    monkeypatch.setattr("relsql.cli._inspect", broken)
    monkeypatch.delenv("RELSQL_DEBUG", raising=False)
    code, out, err = cli(capsys, "inspect", shop / "shop.duckdb")
    assert code == 1 and out == ""
    assert err == ("relsql: internal error: ZeroDivisionError: boom second line "
                   "(please report it; run with RELSQL_DEBUG=1 for the traceback)\n")
    monkeypatch.setenv("RELSQL_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["inspect", str(shop / "shop.duckdb")])


def test_interrupt_exits_130(shop, capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("relsql.cli._inspect", interrupted)
    try:
        code, _, err = cli(capsys, "inspect", shop / "shop.duckdb")
    except KeyboardInterrupt:  # would end the whole test session
        pytest.fail("KeyboardInterrupt escaped main")
    assert code == 130 and err == "relsql: interrupted\n"


# -- a user's tables are never replaced ------------------------------------------------------------------
def test_train_refuses_an_existing_predictions_table_before_training(shop, capsys):
    db = shop / "shop.duckdb"
    code, out, err = cli(capsys, *train_args(shop, "--epochs", "1", "--model", shop / "m.pt", "--predictions", "orders"))
    assert code == 1 and "`orders` already exists" in err and "--predictions" in err and "--replace" in err
    assert not (shop / "m.pt").exists() and "task binary" not in out
    # --replace replaces a table of predictions only, never a user's data
    code, out, err = cli(capsys, *train_args(shop, "--epochs", "1", "--model", shop / "m.pt", "--predictions",
                                             "customer", "--replace"))
    assert code == 1 and "not a table of predictions" in err and not (shop / "m.pt").exists()
    with relsql.connect(db, read_only=True) as con:
        assert [c for c, _ in con.columns("customer")][:3] == ["customer_id", "segment", "churned"]
        assert con.arrow('SELECT count(*) AS n FROM "customer"').column("n")[0].as_py() == 60


def test_predict_replace_only_replaces_predictions(shop, capsys):
    db, model = shop / "shop.duckdb", shop / "m.pt"
    assert cli(capsys, *train_args(shop, "--epochs", "1", "--model", model, "--predictions", "preds"))[0] == 0
    code, _, err = cli(capsys, "predict", db, "--model", model, "--table", "orders", "--replace")
    assert code == 1 and "not a table of predictions" in err and "--table" in err
    code, _, err = cli(capsys, "predict", db, "--model", model, "--table", "preds")
    assert code == 1 and "already exists" in err and "--replace" in err
    assert cli(capsys, "predict", db, "--model", model, "--table", "preds", "--replace")[0] == 0
    assert tables(db) == {"customer", "orders", "preds"}


def test_demo_never_replaces_a_users_predictions_table(tmp_path, capsys):
    path = tmp_path / "mine.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE mutagenesis_predictions AS SELECT 42 AS mine")
    con.close()
    code, out, err = cli(capsys, "demo", "--db", path, "--epochs", "1")
    assert code == 1 and "--predictions" in err and "mutagenesis_predictions" in err
    assert tables(path) == {"mutagenesis_predictions"}  # refused before loading anything
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("FROM mutagenesis_predictions").fetchall() == [(42,)]
    con.close()


def test_demo_never_modifies_a_users_tables_of_the_demos_names(tmp_path, capsys):
    path = tmp_path / "mine.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE molecule AS SELECT 'm1' AS name")
    con.close()
    code, _, err = cli(capsys, "demo", "--db", path, "--epochs", "1")
    assert code == 1 and "--db" in err and "molecule" in err and "not the Mutagenesis" in err
    assert tables(path) == {"molecule"}


def test_demo_reuses_its_own_tables_and_writes_a_new_predictions_table(tmp_path, capsys):
    path = tmp_path / "demo.duckdb"
    assert cli(capsys, "demo", "--db", path, "--epochs", "1")[0] == 0
    code, out, _ = cli(capsys, "demo", "--db", path, "--epochs", "1", "--predictions", "second")
    assert code == 0 and "used as it is" in out and "wrote 188 predictions to table second" in out
    assert tables(path) == {"molecule", "atom", "bond", "mutagenesis_predictions", "second"}


def test_demo_db_must_be_a_duckdb_file_in_an_existing_folder(tmp_path, capsys):
    for db in (tmp_path / "demo.sqlite", tmp_path / "missing" / "demo.duckdb", tmp_path):
        code, _, err = cli(capsys, "demo", "--db", db, "--epochs", "1")
        assert code == 2 and "--db" in err, db
    assert not (tmp_path / "missing").exists()


# -- a sweep of misuse -----------------------------------------------------------------------------------
def misuse(shop: Path) -> list[tuple[list, int]]:
    db, tpl, text = shop / "shop.duckdb", shop / "t.sql", shop / "text.pt"
    template = ["template", db, "--target", TARGET]
    train = [*train_args(shop), "--model", shop / "m.pt"]
    usage = [
        [], ["frobnicate"], ["inspect"], ["inspect", db, "--bogus"], ["inspect", shop / "missing.duckdb"],
        ["inspect", ""], ["explain", db], ["explain", db, "--template"], ["explain", db, "--template", shop / "no.sql"],
        ["explain", db, "--template", shop / "binary.sql"], ["explain", db, "--template", shop],
        ["template", db], ["template", db, "--target", "nodot"], ["template", db, "--target", "a.b.c"],
        ["template", db, "--target", ".churned"], ["template", db, "--target", "customer."],
        [*template, "--hops", "-1"], [*template, "--hops", "two"], [*template, "--width", "0"],
        [*template, "--width", "1.5"], [*template, "--aggregation", "median"],
        [*template, "-o", shop / "missing" / "x.sql"], [*template, "-o", shop],
        ["train", db, "--template", tpl], [*train, "--epochs", "-1"], [*train, "--epochs", "0"],
        [*train, "--epochs", "ten"], [*train, "--lr", "nan"], [*train, "--lr=-1"], [*train, "--lr", "inf"],
        [*train, "--lr", "fast"], [*train, "--batch-size", "0"], [*train, "--patience=-3"], [*train, "--seed=-1"],
        [*train, "--memory-limit", "lots"], [*train, "--task", "clustering"], [*train, "--model", shop],
        [*train, "--model", shop / "missing" / "m.pt"], [*train, "--checkpoint", text], [*train, "--predictions", ""],
        ["predict", db], ["predict", db, "--model", shop / "missing.pt"], ["predict", db, "--model", text],
        ["predict", shop / "missing.duckdb", "--model", text], ["demo", "--epochs", "-1"], ["demo", "--lr", "nan"],
        ["demo", "--db", shop / "demo.sqlite"], ["demo", "--db", shop / "missing" / "demo.duckdb"],
        ["demo", "--model", shop], ["demo", "--predictions", "molecule"], ["demo", "--seed", "x"],
    ]
    runtime = [
        ["template", db, "--target", "nope.x"], ["template", db, "--target", "customer.nope"],
        [*train[:-4], "--target", "nope.churned", "--model", shop / "m.pt"], ["explain", db, "--template", shop / "frob.sql"],
        [*train, "--output", "nothere", "--epochs", "1"], ["predict", db, "--model", shop / "other.pt"],
        ["inspect", text],
    ]
    return [(argv, 2) for argv in usage] + [(argv, 1) for argv in runtime]


def test_misuse_sweep(shop, capsys):
    wrong = []
    for argv, expected in misuse(shop):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit:  # main must return, not exit
            code = f"SystemExit({exit.code})"
        except BaseException as err:  # noqa: BLE001 - the sweep reports every failure at once
            code = f"raised {type(err).__name__}"
        out, err = capsys.readouterr()
        if code != expected or "Traceback" in out + err or (code and not err.strip()):
            wrong.append(f"{[str(a).replace(str(shop), '~') for a in argv]}: {code} (expected {expected}) {err[-200:]!r}")
    assert not (shop / "missing").exists() and not (shop / "m.pt").exists()
    assert not wrong, "\n".join(wrong)


# -- a real terminal user --------------------------------------------------------------------------------
def relsql_command() -> list[str]:
    script = Path(sys.executable).parent / "relsql"
    return [str(script)] if script.exists() else [sys.executable, "-m", "relsql.cli"]


@pytest.mark.parametrize("case, expected", [("output", 2), ("binary", 2), ("target", 1)])
def test_no_traceback_reaches_a_terminal(shop, case, expected):
    db = str(shop / "shop.duckdb")
    argv = {"output": ["template", db, "--target", TARGET, "-o", str(shop / "missing" / "x.sql")],
            "binary": ["explain", db, "--template", str(shop / "binary.sql")],
            "target": ["template", db, "--target", "nope.x"]}[case]
    env = {k: v for k, v in os.environ.items() if k != "RELSQL_DEBUG"}
    run = subprocess.run([*relsql_command(), *argv], capture_output=True, text=True, env=env, cwd=shop, timeout=300)
    assert run.returncode == expected, run.stderr
    lines = run.stderr.strip().splitlines()
    assert "Traceback" not in run.stdout + run.stderr and not any(line.startswith("  File ") for line in lines)
    assert lines[-1].startswith("relsql") and (expected == 2 or len(lines) == 1)  # argparse prints its usage first
