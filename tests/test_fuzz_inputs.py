"""Seeded fuzzing of two text surfaces a user types: predictive queries and keys files (issue 27).

Each surface starts from valid inputs and mutates them with a seeded `random.Random` (the same
cases on every run): tokens dropped, duplicated, swapped or replaced; hostile identifiers and
literals (quotes, SQL, NULs, unicode, huge numbers, time zones); for keys files also whole lines
dropped, repeated or swapped, hostile statements (DROP, COPY ... TO, ATTACH, CREATE, INSTALL)
and very long lines. Every case must end ok or in a RelsqlError, never another exception
(tests/fuzz_world.run_case classifies it under a time limit); every user table must be
byte-identical afterwards (run_case hashes each table's sorted rows) and no table but the task
table a case asks for may appear; every file in the keys folder must be unchanged and no file a
hostile statement names may appear (hostile statements never run). The counts by surface and
outcome are printed and written to out/fuzz_inputs_counts.txt.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
import re
from pathlib import Path

import pytest

import relsql
from relsql.data.keys import schema
from tests.fuzz_world import REPO, Counts, run_case
from tests.tables import insert_rows

pytestmark = pytest.mark.slow  # 600 seeded cases

CASES = 300  # per surface; each case takes a few milliseconds to a few tenths of a second
COUNTS = Counts()

QUERIES = [
    "COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 45 DAYS",
    "SUM(orders.amount) OVER 60 DAYS >= 100 FOR customer.customer_id = orders.customer_id ALL AT 2021-03-01, 2021-06-01",
    "COUNT(orders.*) OVER 14 DAYS FOR EACH customer SINCE customer.joined TIME orders.ordered_at "
    "AT EVERY 30 DAYS FROM 2021-02-01 TO 2021-10-01",
    "COUNT(visits.*) OVER 7 DAYS != 0 FOR customer ACTIVE AT '2021-05-01 12:00:00'",
    "COUNT(orders.*) OVER 30 DAYS <> 0 FOR customer TIME date_dim.d_date VIA orders.day_sk = date_dim.d_date_sk AT 2021-04-01",
]

HOSTILE_WORDS = [
    "customer", "CUSTOMER", "orders", "other", "\"customer\"", "\"cus\"\"tomer\"", "\"; DROP TABLE customer; --\"",
    "'x'", "'); DROP TABLE customer; --", "DROP", "TABLE", "SELECT", "*", "(", ")", ",", ".", "=", ">", "<=", "<>",
    "--", "/*", ";", "\x00", "\n", "\t", "ÄÖÜ", "客户", "\"客户\"", "é\u0301", "\u202e", "\U0001f600", "$x", "_",
    "9" * 40, "-1", "0", "1e308", "1e309", "-0.0", "NaN", "inf", "0x10", "99999999999999999999 DAYS",
    "2021-02-30", "0000-01-01", "9999-12-31", "'2021-01-01 12:00:00+05:00'", "'2021-01-01T00:00Z'",
    "'2021-01-01 25:00'", "2021-01-01T12:00:00.123456", "'2021-01-01''x'", "EVERY", "DAYS", "OVER", "FOR",
    "AT", "TIME", "VIA", "SINCE", "ALL", "ACTIVE", "EACH", "FROM", "TO", "COUNT", "SUM", "orders.amount",
    "customer.customer_id", "orders.ordered_at", "read_csv('/etc/passwd')", "\"" + "n" * 5000 + "\"",
]


def _world(path: Path) -> relsql.Database:
    """A small shop with timestamps, a date dimension and a sentinel table `other`."""
    db = relsql.connect(path)
    rng = random.Random(7)
    base = dt.date(2021, 1, 1)
    db.execute("CREATE TABLE customer(customer_id INTEGER PRIMARY KEY, joined DATE, segment VARCHAR, churned BOOLEAN)")
    db.execute("CREATE TABLE date_dim(d_date_sk INTEGER PRIMARY KEY, d_date DATE)")
    db.execute("CREATE TABLE orders(order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(customer_id), "
               "ordered_at DATE, day_sk INTEGER, amount DOUBLE)")
    db.execute("CREATE TABLE visits(v_id INTEGER, customer_id INTEGER, visited TIMESTAMP)")
    db.execute("CREATE TABLE other(x INTEGER, note VARCHAR)")
    insert_rows(db, "date_dim", [(i, base + dt.timedelta(days=i)) for i in range(365)])
    insert_rows(db, "customer",
                [(c, base + dt.timedelta(days=rng.randrange(100)), rng.choice("abc"), c % 3 == 0) for c in range(30)])
    orders = [(i, rng.randrange(30), d, d, round(rng.uniform(5, 200), 2))
              for i, d in enumerate(rng.randrange(365) for _ in range(400))]
    insert_rows(db, "orders",
                [(i, c, base + dt.timedelta(days=d), k, a) for i, c, d, k, a in orders])
    insert_rows(db, "visits",
                [(i, rng.randrange(30), dt.datetime(2021, 1, 1) + dt.timedelta(hours=rng.randrange(8000)))
                 for i in range(300)])
    db.execute("INSERT INTO other VALUES (1, 'keep me'), (2, NULL)")
    return db


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz_inputs")
    db = _world(folder / "shop.duckdb")
    yield db, folder
    db.close()


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    out = REPO / "out"
    out.mkdir(exist_ok=True)
    line = COUNTS.line()
    (out / "fuzz_inputs_counts.txt").write_text(line + "\n")
    print("\n" + line)


def _tokens(text: str) -> list[str]:
    return re.findall(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\d{4}-\d{2}-\d{2}(?:T[\d:.]+)?|[A-Za-z_][\w$]*|\d+(?:\.\d+)?"
                      r"|>=|<=|<>|!=|\S", text)


def _mutate_tokens(tokens: list[str], rng: random.Random) -> list[str]:
    """One to three token edits: drop, duplicate, swap two, replace with a hostile word, insert one."""
    out = list(tokens)
    for _ in range(rng.randint(1, 3)):
        if not out:
            out.append(rng.choice(HOSTILE_WORDS))
            continue
        i, j = rng.randrange(len(out)), rng.randrange(len(out))
        kind = rng.choice(("drop", "duplicate", "swap", "replace", "insert"))
        if kind == "drop":
            del out[i]
        elif kind == "duplicate":
            out.insert(i, out[i])
        elif kind == "swap":
            out[i], out[j] = out[j], out[i]
        elif kind == "replace":
            out[i] = rng.choice(HOSTILE_WORDS)
        else:
            out.insert(i, rng.choice(HOSTILE_WORDS))
    return out


def _query_case(rng: random.Random) -> str:
    base = rng.choice(QUERIES)
    if rng.random() < 0.15:
        return base  # valid ones too: the write path must hold the same rules
    tokens = _tokens(base)
    if rng.random() < 0.15:  # a date given a time zone (or a zone-like suffix), the rest intact
        dates = [i for i, t in enumerate(tokens) if re.fullmatch(r"'?\d{4}-\d{2}-\d{2}.*", t)]
        if dates:
            i = rng.choice(dates)
            day = tokens[i].strip("'")[:10]
            tokens[i] = "'" + day + rng.choice((" 12:00:00+05:00", "T00:00Z", " 23:59:59-11:30", "T12:00+14:00",
                                                " 00:00 UTC")) + "'"
            return " ".join(tokens)
    return " ".join(_mutate_tokens(tokens, rng))


def _hash_folder(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith((".wal", ".duckdb"))}


def test_fuzzed_predictive_queries(world):
    db, folder = world
    rng = random.Random(2027)
    files = _hash_folder(folder)
    others = []
    for number in range(CASES):
        text = _query_case(rng)

        def body(text=text):
            relsql.PredictiveQuery.parse(text).write(db, "fz_task")

        outcome = run_case(db, body, limit_s=20.0, allowed_new=lambda name: name == "fz_task")
        COUNTS.add("predictive queries", outcome.status)
        if outcome.status not in ("ok", "relsql"):
            others.append((number, text[:300], outcome.key or outcome.status, outcome.message))
    assert _hash_folder(folder) == files
    assert not others, "\n".join(map(repr, others[:10]))


KEYS_FILE = """-- the shop's keys, stated outside the database
ALTER TABLE customer ADD PRIMARY KEY (customer_id);
ALTER TABLE orders ADD FOREIGN KEY (customer_id) REFERENCES customer (customer_id);
PRIMARY KEY visits(v_id)
FOREIGN KEY visits(customer_id) REFERENCES customer(customer_id)
FOREIGN KEY orders(day_sk) REFERENCES date_dim
CREATE TABLE other (x INT PRIMARY KEY, note VARCHAR);
"""


def _hostile(folder: Path) -> list[str]:
    """Statements that would change the database or write files if anything ran them."""
    pwned = folder / "pwned"
    return [
        "DROP TABLE customer;", "DELETE FROM other;", "UPDATE other SET x = 0;", "ALTER TABLE customer RENAME TO c2;",
        f"COPY customer TO '{pwned}.csv';", f"ATTACH '{pwned}.db' AS p;", "CREATE TABLE pwn AS SELECT 1 AS x;",
        "INSTALL httpfs;", "LOAD httpfs;", "SET memory_limit = '1MB';", f"EXPORT DATABASE '{pwned}_dir';",
        "CREATE MACRO m(x) AS x;", "SELECT * FROM read_csv('/etc/passwd');", "PRAGMA enable_profiling;",
        "ALTER TABLE customer ADD PRIMARY KEY (customer_id); DROP TABLE orders;",
        "PRIMARY KEY customer(customer_id); DROP TABLE orders; --",
        "FOREIGN KEY orders(customer_id) REFERENCES customer(customer_id); COPY other TO '" + str(pwned) + ".parquet';",
        "CREATE TABLE orders AS SELECT 1;", "CREATE OR REPLACE TABLE other (x INT PRIMARY KEY);",
    ]


def _mutate_keys(rng: random.Random, folder: Path) -> str:
    lines = KEYS_FILE.splitlines()
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("drop", "duplicate", "swap", "tokens", "hostile", "nul", "long", "unicode", "crlf"))
        i = rng.randrange(len(lines)) if lines else 0
        if not lines:
            lines.append(rng.choice(_hostile(folder)))
        elif kind == "drop":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "tokens":
            lines[i] = " ".join(_mutate_tokens(_tokens(lines[i]), rng))
        elif kind == "hostile":
            lines.insert(i, rng.choice(_hostile(folder)))
        elif kind == "nul":
            at = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:at] + "\x00" + lines[i][at:]
        elif kind == "long":
            lines[i] = lines[i] + " " + rng.choice(("x", "(", "-- ", "customer_id, ")) * rng.choice((1000, 20_000))
        elif kind == "unicode":
            lines[i] = lines[i].replace("customer",
                                        rng.choice(("ｃustomer", "客户", "CUSTOMER", "customer\u200b", "\"customer\"")))
        else:
            lines[i] = lines[i] + "\r"
    return "\n".join(lines)


def test_fuzzed_keys_files(world):
    db, folder = world
    rng = random.Random(27)
    keys_dir = folder / "keys"
    keys_dir.mkdir(exist_ok=True)
    others = []
    for number in range(CASES):
        text = _mutate_keys(rng, folder)
        path = keys_dir / f"keys_{number % 5}.sql"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        how = rng.choice(("file", "file", "text", "text", "inferred", "auto"))
        files = _hash_folder(folder)

        def body(text=text, path=path, how=how):
            if how == "file":
                schema(db, db.catalog(), infer=False, given=path)
            elif how == "inferred":
                schema(db, db.catalog(), given=path)
            elif how == "text":
                schema(db, db.catalog(), infer=False, given=text if "\n" in text else text + "\n")
            else:
                relsql.Template.auto(db, "customer.churned", hops=1, keys=path)

        outcome = run_case(db, body, limit_s=20.0)
        COUNTS.add(f"keys files ({'schema' if how != 'auto' else 'Template.auto'})", outcome.status)
        written = sorted(p.name for p in folder.iterdir() if p.name.startswith("pwned"))
        if outcome.status not in ("ok", "relsql") or _hash_folder(folder) != files or written:
            others.append((number, how, text[:200], outcome.key or outcome.status, outcome.message, written))
    assert not others, "\n".join(map(repr, others[:10]))
