"""The command line's warehouse options: threads, label-reading templates, mini-batch
prediction, predictive-query task tables, and progress as lines when there is no terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from relsql.cli import main
from tests.test_model import SIMPLE, build

ROOT = Path(__file__).resolve().parent.parent


def _shop(tmp_path):
    build(tmp_path / "shop.duckdb", n=100).close()
    (tmp_path / "t.sql").write_text(SIMPLE)
    return str(tmp_path / "shop.duckdb"), str(tmp_path / "t.sql")


def test_train_and_predict_with_threads_and_mini_batches(tmp_path, capsys):
    db, template = _shop(tmp_path)
    model = str(tmp_path / "m.pt")
    assert main(["train", db, "--template", template, "--target", "customer.churned", "--epochs", "2",
                 "--model", model, "--threads", "1"]) == 0
    assert main(["predict", db, "--model", model, "--batch-size", "16", "--table", "p", "--threads", "1"]) == 0
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute('SELECT count(*), count(probability) FROM p').fetchone() == (100, 100)
    assert main(["train", db, "--template", template, "--target", "customer.churned", "--threads", "0"]) == 2
    capsys.readouterr()


def test_a_template_reading_the_label_needs_allow_target_inputs(tmp_path, capsys):
    db, _ = _shop(tmp_path)
    leaky = tmp_path / "leaky.sql"
    leaky.write_text("CREATE TABLE p AS SELECT c.customer_id, linear(features(c.churned, c.spend), 1) FROM customer c;")
    args = ["train", db, "--template", str(leaky), "--target", "customer.churned", "--epochs", "1",
            "--model", str(tmp_path / "m.pt")]
    assert main(args) == 1
    assert "reads the target customer.churned" in capsys.readouterr().err
    assert main([*args, "--allow-target-inputs"]) == 0


def test_task_command_writes_a_task_table(tmp_path, capsys):
    db = tmp_path / "events.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE customer(customer_id INT PRIMARY KEY)")
        con.execute("INSERT INTO customer SELECT i FROM range(20) t(i)")
        con.execute("CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT REFERENCES customer, day DATE)")
        con.execute("INSERT INTO orders SELECT i, i % 20, DATE '2024-01-01' + INTERVAL (i * 3) DAY FROM range(200) t(i)")
    assert main(["task", str(db), "COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT 2024-03-01", "--name", "churn"]) == 0
    assert "relsql template" in capsys.readouterr().out
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM churn WHERE snapshot = DATE '2024-03-01'").fetchone()[0] > 0


@pytest.mark.slow
def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path):
    db, template = _shop(tmp_path)
    run = subprocess.run([sys.executable, "-m", "relsql.cli", "train", db, "--template", template, "--target",
                          "customer.churned", "--epochs", "2", "--model", str(tmp_path / "m.pt")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert any(line.startswith("relsql: grounded ") for line in lines)
    assert [line.split(":")[1].strip() for line in lines if line.startswith("relsql: epoch")] == ["epoch 1 of 2", "epoch 2 of 2"]


def test_template_aggregation_defaults_to_all_and_refuses_unknown_terms(tmp_path, capsys):
    db, _ = _shop(tmp_path)
    assert main(["template", db, "--target", "customer.churned", "--aggregation", "median"]) == 2
    assert "--aggregation" in capsys.readouterr().err
    assert main(["template", db, "--target", "customer.churned"]) == 0
    out = capsys.readouterr().out
    assert "aggregation over child rows all: avg, sum, max, count" in out and "count(*)" in out
    assert main(["template", db, "--target", "customer.churned", "--aggregation", "avg,count", "--timeless", "include"]) == 0
    assert "avg, count" in capsys.readouterr().out
