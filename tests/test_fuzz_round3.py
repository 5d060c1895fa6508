"""Seeded fuzzing of three surfaces hardening round 3 found open (issue 42): `predict(where=...)`
conditions, RelBench dataset folders' manifests, and the files the command line writes.

Each surface starts from valid inputs and mutates them with a seeded `random.Random` (the same
cases on every run):

* where=: valid conditions on the target table with tokens dropped, repeated or replaced from a
  vocabulary of SQL, hostile literals and identifiers, and nesting bombs (thousands of NOTs or
  parentheses), mixed;
* manifests: one field of a valid RelBench 3 `manifest.yaml` (a table's `pkey`, `time_col` or a
  foreign key, or a task's fields) replaced by a value of the wrong shape (a number, a list, a
  mapping, null, a boolean, a long string), a YAML alias bomb or deep nesting;
* files: `relsql template -o`, `relsql predict --out` (with and without `--replace`) and `relsql
  train --model` aimed at a file that is already there and is the user's (text, CSV that looks
  like predictions, a PNG signature, a zip like a saved model).

Every case must end ok or in a RelsqlError (tests/fuzz_world.run_case, under a time limit), leave
every user table byte-identical, leave a dataset folder's files as they were, and never change a
file of the user's. The counts by surface and outcome are printed and written to
out/fuzz_round3_counts.txt.
"""

from __future__ import annotations

import hashlib
import random
import shutil
from pathlib import Path

import pytest

import relsql
from relsql.cli import main
from tests.fuzz_world import REPO, Counts, run_case
from tests.test_harden_input_folders import BOMB, TABLES, TASK, dataset
from tests.test_model import SIMPLE, build

pytestmark = pytest.mark.slow  # ~200 seeded cases, a trained model and a few CLI runs

TARGET = "customer.churned"
COUNTS = Counts()

CONDITIONS = ["customer_id < 30", "spend > 40 AND customer_id % 2 = 0", "NOT (customer_id BETWEEN 10 AND 20)",
              "customer_id IN (1, 2, 3) OR segment IS NULL", "coalesce(spend, 0) >= 18", "tier = 'gold' OR signup IS NOT NULL"]
WORDS = ["customer_id", "spend", "segment", "churned", "(", ")", "AND", "OR", "NOT", "=", "<", ">=", "<>", "IS", "NULL", "IN",
         "BETWEEN", ",", "'x'", "'); DROP TABLE customer; --", ";", "DROP TABLE customer", "--", "/*", "\x00",
         "1e308", "-0.0", "NaN", "9" * 60, "\"customer\"", "\"cus\"\"tomer\"", "orders.amount", "nextval('s')",
         "read_csv('/etc/passwd')", "(SELECT count(*) FROM orders)", "客户", "\u202e", "* 0", "/ 0"]


def _where(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.15:  # a nesting bomb
        depth = rng.choice([500, 3000, 20000])
        return rng.choice(["NOT " * depth + "customer_id < 3", "(" * depth + "customer_id < 3" + ")" * depth,
                           "(" * depth + "customer_id < 3"])
    if kind < 0.2:
        return "customer_id < 3 AND " * rng.choice([1000, 50000]) + "TRUE"
    tokens = rng.choice(CONDITIONS).split()
    for _ in range(rng.randint(0, 3)):  # none: the valid condition itself
        action, at = rng.random(), rng.randrange(len(tokens) + 1)
        if action < 0.3 and tokens:
            del tokens[min(at, len(tokens) - 1)]
        elif action < 0.5 and tokens:
            tokens.insert(at, tokens[min(at, len(tokens) - 1)])
        elif action < 0.8:
            tokens.insert(at, rng.choice(WORDS))
        elif tokens:
            tokens[min(at, len(tokens) - 1)] = rng.choice(WORDS)
    return " ".join(tokens)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("round3")
    db = build(folder / "shop.duckdb", n=60)
    db.execute("CREATE TABLE other(x INTEGER)")  # a sentinel: no case may touch it
    db.execute("INSERT INTO other VALUES (1), (2)")
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target=TARGET, progress=False)
    model.fit(epochs=2, hybrid=False, time_budget=None)
    model.save(folder / "m.pt")
    (folder / "t.sql").write_text(SIMPLE)
    yield folder, db, model
    db.close()


def _record(surface: str, status: str, what: str) -> None:
    COUNTS.add(surface, status)
    assert status in ("ok", "relsql"), f"{surface}: {status} on {what[:300]!r}"


def test_fuzzed_where_conditions(trained):
    _, db, model = trained
    rng = random.Random(42)
    for _ in range(80):
        text = _where(rng)
        outcome = run_case(db, lambda t=text: model.predict(where=t), limit_s=30)
        _record("where", outcome.status, f"{text} -> {outcome.key} {outcome.message}")


VALUES = ["3", "[a, b]", "{a: 1}", "null", "true", "''", "'" + "x" * 5000 + "'", "-1e999", "'; DROP TABLE x; --'",
          "[" * 200 + "]" * 200, "{a: " * 200 + "1" + "}" * 200, "!!python/object/apply:os.system ['touch /tmp/pwned']",
          "*undefined", "&anchor value"]
FIELDS = [("tables", "pkey: order_id"), ("tables", "time_col: date"), ("tables", "customer_id: customers"),
          ("tables", "pkey: customer_id"), ("task", "task_type: binary_classification"), ("task", "target_col: again"),
          ("task", "entity_table: customers"), ("task", "entity_col: customer_id"), ("task", "time_col: date")]


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fuzzed_manifests(tmp_path):
    rng = random.Random(7)
    tables = TABLES.replace("PKEY", "order_id").replace("PARENT", "customers")
    task = TASK.replace("TYPE", "binary_classification").replace("TARGET", "again")
    scratch = relsql.connect()
    for i in range(70):
        which, line = rng.choice(FIELDS)
        key = line.split(":")[0]
        value = BOMB + "x: *h" if rng.random() < 0.1 else rng.choice(VALUES)
        texts = {"tables": tables, "task": task}
        if value.startswith("a: &a"):  # the bomb goes in front, its last alias as the field's value
            texts[which] = BOMB + texts[which].replace(line, f"{key}: *h")
        else:
            texts[which] = texts[which].replace(line, f"{key}: {value}")
        root = dataset(tmp_path / f"d{i}", manifest=texts["tables"], task=texts["task"])
        before = _digest(root)

        def body(path=root):
            with relsql.connect(path, read_only=True) as db:
                for name in db.tables():
                    db.catalog()[name]
                    db.arrow(f'SELECT count(*) FROM "{name}"')

        outcome = run_case(scratch, body, limit_s=20)
        _record("manifest", outcome.status, f"{which}.{key} = {value[:80]} -> {outcome.key} {outcome.message}")
        assert _digest(root) == before, f"the dataset folder changed: {which}.{key} = {value[:80]}"
        assert not Path("/tmp/pwned").exists()


USER_FILES = {"notes.txt": b"my notes\n", "theirs.csv": b"prediction,customer_id\n1,2\n",
              "plot.png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "model.pt": b"PK\x03\x04" + b"\x00" * 60}


def test_fuzzed_cli_files_never_replace_a_users_file(trained, tmp_path, capsys, monkeypatch):
    folder, _, _ = trained
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(folder / "m.pt", tmp_path / "m.pt")
    shutil.copyfile(folder / "t.sql", tmp_path / "t.sql")
    database = str(tmp_path / "shop.duckdb")  # the same shop in a file of its own: the command line opens it
    build(database, n=60).close()
    rng = random.Random(11)
    for _ in range(24):
        name, content = rng.choice(sorted(USER_FILES.items()))
        path = tmp_path / rng.choice([name, name.replace(".", "_x."), f"sub/{name}"])
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(content)
        command = rng.choice(["template", "predict", "predict_replace", "train"])
        argv = {"template": ["template", database, "--target", TARGET, "-o", path],
                "predict": ["predict", database, "--model", "m.pt", "--out", path],
                "predict_replace": ["predict", database, "--model", "m.pt", "--out", path, "--replace"],
                "train": ["train", database, "--template", "t.sql", "--target", TARGET, "--epochs", "1",
                          "--model", path]}[command]
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        status = "ok" if code == 0 else "relsql" if "Traceback" not in out + err else "other"
        COUNTS.add("files", status if path.read_bytes() == content else "tables")
        assert path.read_bytes() == content, f"{command} replaced the user's {path.name}"
        assert "Traceback" not in out + err and code != 0, (command, path.name, err[-500:])
        assert path.name in err, err


def teardown_module(module) -> None:
    line = COUNTS.line().replace("changed user tables", "changed user tables or files")
    print("\n" + line)
    out = REPO / "out"
    out.mkdir(exist_ok=True)
    (out / "fuzz_round3_counts.txt").write_text(line + "\n")
