"""The README's code runs as written, so it cannot rot: every ```python block, the ```sql template
and every `relsql` command line, each against a small real DuckDB database in a tmp folder.

A block's text is executed unchanged. Where a block uses names it does not make (`db`, `dataset`,
`task`, the folder `rel-shop/`, `rec.pt`), the test makes them
first, with data of the shape the block expects. Two things are the test's own, and say so:
- `relsql.connect()` with no source (the first block's empty in-memory database) opens a small
  Mutagenesis (60 molecules, with the `tier` and `atom.charge` columns the README's examples name);
- a search budget ("10m", `--search 10m`) becomes one second: a search's first trial always runs,
  then the best is trained again, so the code path is the README's, ten minutes shorter.
In the command lines `<db>` is the database file; they run in order in one folder, except that
each `relsql train` without --template (alternatives) starts without the automatic template an
earlier one saved (relsql refuses to overwrite a template that differs); `relsql demo` is left to
tests/test_api.py::test_demo_trains_mutagenesis_well_above_majority (the full 188-molecule job).
A new block or command line in the README is run here, or fails here until it is."""

from __future__ import annotations

import datetime as dt
import re
import shlex
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

import relsql
from relsql.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MUTAGENESIS = ROOT / "relsql" / "datasets" / "mutagenesis" / "data"
NOT_RUN = {"relsql demo": "the full Mutagenesis job, run by tests/test_api.py::test_demo_trains_mutagenesis_well_above_majority"}


def blocks(language: str) -> list[tuple[str, str]]:
    """(section heading, text) of each ```language block, in README order; a second block of a
    section is named '<heading> #2'."""
    found, counts, heading = [], {}, ""
    for match in re.finditer(r"^## ([^\n]+)$|^```(\w*)\n(.*?)^```", README, re.S | re.M):
        if match.group(1):
            heading = match.group(1).strip()
        elif match.group(2) == language:
            counts[heading] = counts.get(heading, 0) + 1
            found.append((heading if counts[heading] == 1 else f"{heading} #{counts[heading]}", match.group(3)))
    return found


def command_lines() -> list[str]:
    """The README's indented `relsql ...` lines (comments included; shlex drops them)."""
    return [line.strip() for line in README.splitlines() if re.match(r"^ {4}relsql \w", line)]


# -- the databases -------------------------------------------------------------------------------------------------------
def small_mutagenesis(path: Path, molecules: int = 60) -> Path:
    """The demo's keyed tables (relsql/datasets/mutagenesis/data/schema.sql), the first `molecules` molecules,
    plus molecule.tier and atom.charge, which the README's examples read."""
    con = duckdb.connect(str(path))
    con.execute((MUTAGENESIS / "schema.sql").read_text())
    con.execute("ALTER TABLE molecule ADD COLUMN tier VARCHAR")
    con.execute("ALTER TABLE atom ADD COLUMN charge DOUBLE")
    keep = (f"SELECT molecule_id FROM read_parquet('{MUTAGENESIS / 'molecule.parquet'}') "
            f"ORDER BY molecule_id LIMIT {molecules}")
    con.execute(f"""INSERT INTO molecule SELECT molecule_id, mutagenic,
                    ['bronze', 'silver', 'gold'][1 + row_number() OVER (ORDER BY molecule_id) % 3]
                    FROM read_parquet('{MUTAGENESIS / 'molecule.parquet'}') WHERE molecule_id IN ({keep})""")
    con.execute(f"""INSERT INTO atom SELECT atom_id, molecule_id, element, (hash(atom_id) % 1000) / 1000.0 - 0.5
                    FROM read_parquet('{MUTAGENESIS / 'atom.parquet'}') WHERE molecule_id IN ({keep})""")
    con.execute(f"INSERT INTO bond SELECT * FROM read_parquet('{MUTAGENESIS / 'bond.parquet'}') WHERE molecule_id IN ({keep})")
    con.close()
    return path


def orders_shop(con, customers: int = 40, seed: int = 0) -> None:
    """customer (churned, signup) and orders (amount, ordered_at) with declared keys: busy customers
    order often and stay, the others churn."""
    rng = np.random.default_rng(seed)
    con.execute("CREATE TABLE customer(customer_id BIGINT PRIMARY KEY, segment VARCHAR, churned BOOLEAN, signup DATE)")
    con.execute("CREATE TABLE orders(order_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer(customer_id), "
                "amount DOUBLE, ordered_at DATE)")
    start, people, orders = dt.date(2024, 1, 1), [], []
    for c in range(customers):
        busy = bool(rng.random() < 0.5)
        people.append((c, str(rng.choice(["a", "b"])), not busy, start + dt.timedelta(days=int(rng.integers(0, 200)))))
        for day in np.flatnonzero(rng.random(365) < (0.05 if busy else 0.01)):
            orders.append((len(orders), c, float(rng.gamma(2, 20)), start + dt.timedelta(days=int(day))))
    con.executemany("INSERT INTO customer VALUES (?, ?, ?, ?)", people)
    con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", orders)


@pytest.fixture(scope="module")
def mutagenesis_file(tmp_path_factory):
    return small_mutagenesis(tmp_path_factory.mktemp("readme") / "mutagenesis.duckdb")


@pytest.fixture
def folder(tmp_path, monkeypatch, mutagenesis_file):
    """A tmp working folder for the README's relative paths, and its two substitutions."""
    from relsql.train.model import search

    monkeypatch.chdir(tmp_path)
    shutil.copyfile(mutagenesis_file, tmp_path / "mutagenesis.duckdb")
    connect, budget_seconds = relsql.connect, search.budget_seconds

    def connect_small(source=None, **options):
        return connect(tmp_path / "mutagenesis.duckdb" if source in (None, ":memory:") else source, **options)

    monkeypatch.setattr(relsql, "connect", connect_small)
    monkeypatch.setattr(search, "budget_seconds", lambda budget: min(budget_seconds(budget), 1.0))
    return tmp_path


def setup_templates(folder):
    return {}


def setup_training(folder):
    return {"relsql": relsql, "db": relsql.connect()}


def setup_auto(folder):
    db = relsql.connect(folder / "shop.duckdb")
    orders_shop(db.con)
    return {"relsql": relsql, "db": db}


def setup_recommendation(folder):
    from tests.test_ranking import shop

    return {"relsql": relsql, "db": shop(folder / "rec.duckdb", customers=30, items=20)}


def setup_relbench(folder):
    import torch

    from tests.test_relbench import OrdersAgain, ShopDataset, write_manifest_folder

    dataset = ShopDataset()
    task = OrdersAgain(dataset)
    (folder / "rel-shop").mkdir()
    write_manifest_folder(folder / "rel-shop", task)
    return {"relsql": relsql, "torch": torch, "dataset": dataset, "task": task}


def check_templates(folder, names):
    assert isinstance(names["net"], relsql.CompiledNet) and "predict" in names["net"]()
    assert names["db"].tables() == ["atom", "bond", "molecule"]  # the small Mutagenesis, unchanged


def check_training(folder, names):
    db = names["db"]
    assert {"model.pt", "model.png"} <= {p.name for p in folder.iterdir()}
    assert db.arrow('SELECT count(*) AS n FROM "predictions"').column("n")[0].as_py() == 60
    assert names["model"].trials.height >= 1  # the search ran and its best trial is the model


def check_auto(folder, names):
    assert "CREATE TABLE" in names["tpl"].source
    written = names["db"].arrow('SELECT * FROM "task_churn"')
    assert written.column_names == ["task_id", "customer_id", "snapshot", "label"] and written.num_rows > 0


def check_recommendation(folder, names):
    top = names["model"].recommend(k=10)
    assert top.columns[:4] == ["task_id", "item_id", "rank", "score"] and top.height > 0


def check_relbench(folder, names):
    assert set(names["data"].node_types) and set(names["graph"].node_types) == {"customers", "orders", "churn"}
    assert any((folder / "runs" / "churn").iterdir())  # TensorBoard's event file


SETUPS = {  # section -> (names the block uses, a check of what it did)
    "Templates on one page": (setup_templates, check_templates),
    "Training and saving": (setup_training, check_training),
    "Automatic templates and predictive queries": (setup_auto, check_auto),
    "Recommendation": (setup_recommendation, check_recommendation),
    "RelBench, PyG and your own loop": (setup_relbench, check_relbench),
}
SLOW = {"Training and saving", "Recommendation", "RelBench, PyG and your own loop"}  # a few fits each: 4-16 CPU-s
SMOKE = {"Templates on one page"}  # parse, ground in a DuckDB file, compile, explain: about a CPU-second


def marks(section: str) -> list:
    return [pytest.mark.slow] * (section in SLOW) + [pytest.mark.smoke] * (section in SMOKE)


@pytest.mark.parametrize("section", [pytest.param(s, marks=marks(s)) for s, _ in blocks("python")])
def test_python_block_runs_as_written(section, folder):
    assert section in SETUPS, f"README section {section!r} has a Python block that tests/test_readme.py does not set up"
    setup, check = SETUPS[section]
    names = setup(folder)
    text = dict(blocks("python"))[section]
    exec(compile(text, f"README.md: {section}", "exec"), names)  # noqa: S102 - the README's own text
    check(folder, names)


@pytest.mark.smoke
def test_the_sql_template_compiles_on_mutagenesis(folder):
    """The one-page template ('relsql/sql_templates/mutagenesis.sql in small') grounds and runs on Mutagenesis."""
    [(section, text)] = blocks("sql")
    assert section == "Templates on one page"
    net = relsql.compile(relsql.Template.from_sql(text), relsql.connect())
    out = net()
    assert out["predict"].shape == (60, 1) and out["layer1"].shape[1] == 16


def cli_database(folder: Path) -> Path:
    """One file for every command line: the ranking shop (item, customer, purchase, task_rec),
    orders beside it, and t (col, d: the lines' target and time column); rec.pt, a ranking model."""
    from tests.test_ranking import TEMPLATE, shop

    path = folder / "shop.duckdb"
    db = shop(path, customers=20, items=12)
    con = db.con
    con.execute("CREATE TABLE orders(order_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer(customer_id), "
                "ordered_at DATE)")
    con.execute("CREATE TABLE t(t_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer(customer_id), "
                "col BOOLEAN, d DATE)")
    rng = np.random.default_rng(1)
    days = [dt.date(2023, 6, 1) + dt.timedelta(days=int(d)) for d in rng.integers(0, 400, 80)]
    con.executemany("INSERT INTO orders VALUES (?, ?, ?)", [(i, i % 20, day) for i, day in enumerate(days)])
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)",
                    [(i, i % 20, bool(i % 20 < 10), dt.date(2023, 9, 1) + dt.timedelta(days=7 * i)) for i in range(60)])
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="task_rec.item_id", time_column="snapshot", seed=0)
    model.fit(epochs=2, time_budget=None)
    model.save(folder / "rec.pt")
    db.close()
    return path


@pytest.mark.slow  # eight command lines, five of them train
def test_command_lines_run_as_written(folder, capsys):
    lines = command_lines()
    assert set(NOT_RUN) <= {line.split("#")[0].strip() for line in lines}, "NOT_RUN names a line the README lost"
    cli_database(folder)
    ran = 0
    for line in lines:
        argv = shlex.split(line, comments=True)
        if " ".join(argv) in NOT_RUN:
            continue
        assert argv[0] == "relsql"
        if argv[1] == "train" and "--template" not in argv:  # alternatives: relsql keeps a template that differs
            (folder / "relsql-model.sql").unlink(missing_ok=True)
        code = main(["shop.duckdb" if arg == "<db>" else arg for arg in argv[1:]])
        out, err = capsys.readouterr()
        assert code == 0 and "Traceback" not in out + err, (line, out, err)
        ran += 1
    assert ran == len(lines) - len(NOT_RUN)
    assert {"t.sql", "relsql-model.pt", "relsql-model.sql", "preds.parquet", "recs.parquet"} <= {p.name for p in folder.iterdir()}
    assert pq.read_table(folder / "recs.parquet").num_rows > 0
    with relsql.connect(folder / "shop.duckdb", read_only=True) as db:
        assert {"predictions", "churn"} <= set(db.tables())
