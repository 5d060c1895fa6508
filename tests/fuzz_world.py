"""The world of tests/test_fuzz.py: one small database, the valid templates the fuzzer mutates, and
the harness that runs one case (time limit, exception classification, user-table digests).

A reproducer printed by the fuzzer reads

    from tests.fuzz_world import make_db
    import relsql, torch
    db = make_db()
    ...

and runs from the repository root.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import relsql
from tests.test_datalog_generated import EXAMPLES as DATALOG_EXAMPLES
from tests.test_datalog_generated import QUERIES as DATALOG_QUERIES

REPO = Path(__file__).resolve().parent.parent
LIBRARY_DIRS = (str(REPO / "relsql") + os.sep,)

# --------------------------------------------------------------------------- the database



def make_db(path: str | Path | None = None, customers: int = 60) -> relsql.Database:
    """customer/orders (tests/test_model.py's shop), graph/node/edge (TU-style), molecule/atom/bond
    (the README example), the Datalog facts f/e/s/g/k/query_out, and the sentinel table `other`."""
    from relsql.datasets.neuralogic_files import import_text
    from tests.test_model import build

    rng = np.random.default_rng(0)
    db = build(path, n=customers)  # the shop of tests/test_model.py

    db.execute("CREATE TABLE graph(graph_id BIGINT PRIMARY KEY, y BIGINT)")
    db.execute("CREATE TABLE node(node_id BIGINT PRIMARY KEY, graph_id BIGINT, label BIGINT, x DOUBLE[])")
    db.execute("CREATE TABLE edge(src BIGINT, dst BIGINT)")
    nodes, edges, nid = [], [], 0
    for g in range(6):
        db.con.execute("INSERT INTO graph VALUES (?, ?)", [g, g % 2])
        first = nid
        for i in range(4 + g % 3):
            label = int(rng.integers(0, 3))
            nodes.append((nid, g, label, [float(label == j) for j in range(3)]))
            if i:
                edges += [(nid - 1, nid), (nid, nid - 1)]
            nid += 1
        edges += [(first, nid - 1), (nid - 1, first)]
    db.con.executemany("INSERT INTO node VALUES (?, ?, ?, ?)", nodes)
    db.con.executemany("INSERT INTO edge VALUES (?, ?)", edges)

    db.execute("CREATE TABLE molecule(molecule_id INT PRIMARY KEY, mutagenic BOOLEAN)")
    db.execute("CREATE TABLE atom(atom_id INT PRIMARY KEY, molecule_id INT, element VARCHAR, charge DOUBLE)")
    db.execute("CREATE TABLE bond(atom1_id INT, atom2_id INT)")
    atoms, bonds, aid = [], [], 0
    for m in range(8):
        db.con.execute("INSERT INTO molecule VALUES (?, ?)", [m, m % 3 == 0])
        for i in range(3 + m % 2):
            atoms.append((aid, m, "CNOH"[int(rng.integers(0, 4))], float(rng.normal())))
            if i:
                bonds += [(aid - 1, aid), (aid, aid - 1)]
            aid += 1
    db.con.executemany("INSERT INTO atom VALUES (?, ?, ?, ?)", atoms)
    db.con.executemany("INSERT INTO bond VALUES (?, ?)", bonds)

    import_text(db.con, DATALOG_EXAMPLES, DATALOG_QUERIES)

    # the sentinel: values a careless quoting would trip over
    db.execute("CREATE TABLE other(id INT, v VARCHAR, xs DOUBLE[], f DOUBLE)")
    db.con.executemany("INSERT INTO other VALUES (?, ?, ?, ?)", [
        (1, "it's", [1.0, 2.0], 0.5), (2, 'a "quoted"; DROP TABLE other; --', None, float("nan")),
        (3, None, [], None), (4, "ü\u2603", [float("inf")], -0.0)])
    db.execute('CREATE VIEW other_view AS SELECT id, v FROM other WHERE id > 1')
    return db


# --------------------------------------------------------------------------- the valid templates

SQL_SIMPLE = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount, o.express), 8, 'w_order')) FROM orders o;
CREATE TABLE predict AS
SELECT c.customer_id, linear(avg(oh.h), 4, 'w_out')
FROM customer c JOIN orders o ON o.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o.order_id
GROUP BY c.customer_id;
"""

SQL_TWO_HOP = """
CREATE TABLE order_h AS SELECT o.order_id, tanh(linear(features(o.amount, o.express), 8, 'w_order')) FROM orders o;
CREATE TABLE customer_h AS
SELECT c.customer_id, tanh(linear(avg(oh.h), 8, 'w_agg') + linear(avg(features(o2.amount)), 8, 'w_self'))
FROM customer c JOIN orders o2 ON o2.customer_id = c.customer_id JOIN order_h oh ON oh.order_id = o2.order_id
GROUP BY c.customer_id;
CREATE TABLE predict AS SELECT h.customer_id, linear(h.h, 4, 'w_out') + embed(c.tier, 4) FROM customer_h h
JOIN customer c ON c.customer_id = h.customer_id;
"""

SQL_README = """
CREATE TABLE atom_h AS
SELECT a.atom_id, tanh(embed(a.element, 16) + linear(features(a.charge), 16)) AS h
FROM atom a;

CREATE TABLE layer1 AS
SELECT b.atom1_id AS atom_id, relu(avg(linear(x.h, 16) + linear(y.h, 16, 'w_nb')))
FROM bond b
JOIN atom_h x ON x.atom_id = b.atom1_id
JOIN atom_h y ON y.atom_id = b.atom2_id
GROUP BY b.atom1_id;

CREATE TABLE predict AS
SELECT m.molecule_id, linear(avg(l.h), 1) AS h
FROM molecule m JOIN atom a ON a.molecule_id = m.molecule_id
JOIN layer1 l ON l.atom_id = a.atom_id
GROUP BY m.molecule_id;
"""

SQL_SAGE = """
CREATE TABLE node_x AS SELECT n.node_id, n.x AS h FROM node n;
CREATE TABLE sage1 AS SELECT e.dst AS node_id, avg(linear(n.h, 8, 'wl')) AS h
FROM edge e JOIN node_x n ON n.node_id = e.src GROUP BY e.dst;
CREATE TABLE sage1 AS SELECT n.node_id, linear(n.x, 8, 'wr') + bias(8, 'bl') AS h FROM node n;
CREATE TABLE pool AS SELECT n.graph_id, max(relu(l.h)) AS h FROM node n JOIN sage1 l ON l.node_id = n.node_id
GROUP BY n.graph_id;
CREATE TABLE out AS SELECT p.graph_id, sigmoid(linear(p.h, 2, 'w_out') + bias(2)) AS h FROM pool p;
"""

SQL_GCN = """
CREATE TABLE node_x AS SELECT n.node_id, n.x AS h FROM node n;
CREATE TABLE gcn1 AS
SELECT e.dst AS node_id, relu(sum(e.norm * linear(n.h, 8, 'gcn1_w')) + bias(8, 'gcn1_b')) AS h
FROM (
    WITH arcs AS (SELECT src, dst FROM edge WHERE src <> dst UNION ALL SELECT node_id AS src, node_id AS dst FROM node),
    deg AS (SELECT dst AS node_id, count(*) AS d FROM arcs GROUP BY dst)
    SELECT a.src, a.dst, 1.0 / sqrt(ds.d * dd.d) AS norm
    FROM arcs a JOIN deg ds ON ds.node_id = a.src JOIN deg dd ON dd.node_id = a.dst
) e
JOIN node_x n ON n.node_id = e.src
GROUP BY e.dst;
CREATE TABLE gcn_out AS SELECT n.graph_id, linear(avg(l.h), 2, 'out_w') AS h
FROM node n JOIN gcn1 l ON l.node_id = n.node_id GROUP BY n.graph_id;
"""

SQL_TEMPLATES = [SQL_SIMPLE, SQL_TWO_HOP, SQL_README, SQL_SAGE, SQL_GCN]

DATALOG_TEMPLATES = [
    """
{2,2} emb(Y) :- f(Y). [transformation=tanh]
h(X) :- e(X, Y), emb(Y). [aggregation=avg]
{1,2} out(X) :- h(X).
""",
    """
h(X) :- e(X, Y). [aggregation=count]
hs(X) :- s(Y), e(X, Y). [aggregation=count]
out(X) :- 1.5 h(X), 0.3 s(X), -0.2 hs(X).
""",
    """
{2,2} emb(Y) :- f(Y).
emb/1 [transformation=sigmoid]
h(X) :- e(X, Y), {2,2} emb(Y).
h/1 [activation=tanh]
{1,2} out(X) :- h(X).
""",
    """
$w={2,2} emb(Y) :- f(Y). [transformation=tanh]
h(X) :- $w={2,2} emb(Y), e(X, Y).
h(X) :- $v={2,2} f(Y), e(Y, X).
$r={1,2} out(X) :- h(X).
""",
    """
h(X) :- <-2> s(X), {2,2} f(Y), e(X, Y), <-2>. [transformation=tanh]
h2(X) :- <0.5> h(X), <[1.0, -1.0]> g(X).
{1,2} out(X) :- h2(X).
""",
    """
p(Y) :- {1,2} f(Y). [transformation=sigmoid]
h(X) :- e(X, Y), ~p(Y), ~s(X), ~g(X).
out(X) :- 2.0 h(X), ~h(X).
""",
    """
{2,2} h(X) :- {2,2} f(Y), e(X, Y), *g(Z). [aggregation=sum, combination=elproduct]
h/1 {2}
h/1 [transformation=tanh]
kk(X, tag) :- {2,2} f(Y), e(X, Y). [transformation=tanh]
{1,2} out(X) :- h(X), kk(X, tag).
out/1 {1}
""",
]

# --------------------------------------------------------------------------- digests


def user_tables(db: relsql.Database) -> list[tuple[str, str, str]]:
    """(schema, name, kind) of every table and view in the database's own catalog (not temp)."""
    return sorted(db.con.execute(
        "SELECT schema_name, table_name, 'table' FROM duckdb_tables() WHERE database_name = current_database() "
        "UNION ALL SELECT schema_name, view_name, 'view' FROM duckdb_views() "
        "WHERE database_name = current_database() AND NOT internal").fetchall())


def table_digest(db: relsql.Database, schema: str, name: str) -> str:
    """sha256 of the table's Arrow schema and its rows, sorted, as Python values (repr keeps every
    bit of a float, NaN and -0.0 included; Arrow IPC bytes would not do: the data under a NULL is
    undefined)."""
    quoted = '"' + schema.replace('"', '""') + '"."' + name.replace('"', '""') + '"'
    data = db.con.execute(f"SELECT * FROM {quoted} ORDER BY ALL").to_arrow_table()
    text = f"{data.schema}\n{data.schema.metadata}\n{data.to_pylist()!r}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def snapshot(db: relsql.Database) -> dict[tuple[str, str, str], str]:
    return {t: table_digest(db, t[0], t[1]) for t in user_tables(db)}


# --------------------------------------------------------------------------- running one case


class CaseTimeout(BaseException):
    """Raised in the main thread when a case runs past its time limit (BaseException, so that a
    library's `except Exception` cannot swallow it)."""


@dataclass
class Outcome:
    status: str  # "ok" | "relsql" | "other" | "hang" | "tables"
    error: BaseException | None = None
    key: str = ""  # exception type + the innermost library frame, for grouping
    where: str = ""  # library file:line
    message: str = ""
    detail: str = ""


def library_frame(err: BaseException) -> str:
    """file:line of the innermost traceback frame inside relsql/ (else the innermost)."""
    frames = traceback.extract_tb(err.__traceback__)
    inside = [f for f in frames if f.filename.startswith(LIBRARY_DIRS)]
    frame = (inside or frames or [None])[-1]
    if frame is None:
        return "?"
    return f"{os.path.relpath(frame.filename, REPO)}:{frame.lineno} ({frame.name})"


@dataclass
class Counts:
    cases: int = 0
    ok: int = 0
    relsql: int = 0
    other: int = 0
    hang: int = 0
    tables: int = 0
    by_test: dict = field(default_factory=dict)

    def add(self, test: str, status: str) -> None:
        self.cases += 1
        setattr(self, status, getattr(self, status) + 1)
        per = self.by_test.setdefault(test, {})
        per[status] = per.get(status, 0) + 1

    def line(self) -> str:
        per = "; ".join(f"{test}: {sum(c.values())} ({', '.join(f'{k} {v}' for k, v in sorted(c.items()))})"
                        for test, c in self.by_test.items())
        return (f"fuzz: {self.cases} cases tried, {self.ok} succeeded, {self.relsql} RelsqlError, "
                f"{self.other} other exceptions, {self.hang} hangs, {self.tables} changed user tables [{per}]")


def run_case(db: relsql.Database, body, *, limit_s: float, allowed_new=None) -> Outcome:
    """Run `body()`; classify what happened; check the user's tables; restore the database.

    A case that outlives `limit_s` is interrupted (SIGALRM in Python code, DuckDB's interrupt for a
    running query) and counts as a hang whatever it raised afterwards. New tables are dropped after
    the check; they are allowed only where `allowed_new(name)` says so.
    """
    allowed_new = allowed_new or (lambda name: False)
    before = snapshot(db)
    fired = threading.Event()

    def on_alarm(signum, frame):
        fired.set()
        raise CaseTimeout(f"case ran past {limit_s} s")

    def watchdog():
        fired.set()
        try:
            db.con.interrupt()
        except Exception:
            pass

    old = signal.signal(signal.SIGALRM, on_alarm)
    timer = threading.Timer(limit_s + 0.5, watchdog)
    timer.daemon = True
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    timer.start()
    error: BaseException | None = None
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            body()
    except CaseTimeout as err:
        error = err
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: BLE001 - classified below
        error = err
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        timer.cancel()
        signal.signal(signal.SIGALRM, old)
    elapsed = time.perf_counter() - started

    if fired.is_set():
        outcome = Outcome("hang", error, key=f"hang (> {limit_s} s)", where=library_frame(error) if error else "?",
                          message=f"ran {elapsed:.1f} s", detail=_format(error) if error else "")
    elif error is None:
        outcome = Outcome("ok")
    elif isinstance(error, relsql.RelsqlError):
        outcome = Outcome("relsql", error, message=_first_line(error))
    else:
        where = library_frame(error)
        outcome = Outcome("other", error, key=f"{type(error).__module__}.{type(error).__qualname__} at {where}",
                          where=where, message=_first_line(error), detail=_format(error))

    # the connection must still be usable (not inside an aborted transaction)
    try:
        db.con.execute("SELECT 1").fetchall()
    except Exception as err:  # noqa: BLE001
        try:
            db.con.execute("ROLLBACK")
        except Exception:  # noqa: BLE001
            pass
        if outcome.status in ("ok", "relsql"):
            outcome = Outcome("other", err, key="connection left unusable (aborted transaction)",
                              message=_first_line(err), detail=_format(err))
    try:
        after = snapshot(db)
    except Exception as err:  # noqa: BLE001
        after = {"snapshot failed": _first_line(err)}
    changed = sorted(str(t) for t in before if after.get(t) != before[t])
    new = sorted(t for t in after if t not in before)
    unexpected_new = [t for t in new if not (isinstance(t, tuple) and t[0] == "main" and allowed_new(t[1]))]
    for t in new:  # restore: the next case starts from the same database
        if isinstance(t, tuple):
            kind = "VIEW" if t[2] == "view" else "TABLE"
            db.con.execute(f'DROP {kind} IF EXISTS "{t[0]}"."' + t[1].replace('"', '""') + '"')
    if changed or unexpected_new:
        outcome = Outcome("tables", outcome.error,
                          key=f"user tables changed ({'; '.join(changed) or 'none changed'}; new: {unexpected_new})",
                          where=library_frame(outcome.error) if outcome.error else "?",
                          message=f"changed {changed}, unexpected new {unexpected_new}; the case ended {outcome.status}"
                                  + (f": {outcome.message}" if outcome.message else ""),
                          detail=outcome.detail)
    return outcome


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else "")[:300]


def _format(err: BaseException) -> str:
    return "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=-8))


# --------------------------------------------------------------------------- collecting findings


class Findings:
    """Distinct failures (by `Outcome.key`), each with its shortest reproducer seen."""

    def __init__(self):
        self.items: dict[str, dict] = {}

    def add(self, outcome: Outcome, reproducer: str, case=None) -> None:
        item = self.items.get(outcome.key)
        if item is None:
            self.items[outcome.key] = {"outcome": outcome, "reproducer": reproducer, "count": 1, "case": case}
            return
        item["count"] += 1
        if len(reproducer) < len(item["reproducer"]):
            item.update(outcome=outcome, reproducer=reproducer, case=case)

    def minimize(self, db, budget_s: float = 30.0) -> None:
        """Shrink every finding's case while it fails the same way (see `minimize`)."""
        for key, item in self.items.items():
            if item["case"] is None:
                continue
            build, params, limit_s = item["case"]
            params, outcome, reproducer = minimize(db, build, params, key, limit_s, budget_s)
            if outcome is not None:
                item.update(outcome=outcome, reproducer=reproducer, case=(build, params, limit_s))

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        order = {"tables": 0, "hang": 1, "other": 2}
        with open(path, "w") as out:
            for key, item in sorted(self.items.items(), key=lambda kv: (order.get(kv[1]["outcome"].status, 3), kv[0])):
                o = item["outcome"]
                out.write(f"=== [{o.status}] {key}   ({item['count']} cases)\n{o.message}\n--- reproducer\n"
                          f"{item['reproducer']}\n--- traceback\n{o.detail}\n\n")


def minimize(db, build, params: dict, key: str, limit_s: float, budget_s: float):
    """Greedy shrinking of a failing case that keeps its failure key: parameters back to their
    defaults (`build.defaults`, and `build.sub_defaults` for dict-valued ones), then chunks of the
    template text's tokens deleted, largest chunks first. Returns (params, outcome, reproducer)."""
    deadline = time.perf_counter() + budget_s
    best: list = [dict(params), None, None]

    def attempt(candidate: dict) -> bool:
        if time.perf_counter() > deadline:
            return False
        try:
            body, reproducer, allowed = build(db, **candidate)
        except Exception:  # noqa: BLE001 - a candidate the builder cannot make
            return False
        outcome = run_case(db, body, limit_s=limit_s, allowed_new=allowed)
        if outcome.key != key:
            return False
        best[:] = [dict(candidate), outcome, reproducer]
        return True

    attempt(best[0])
    defaults = getattr(build, "defaults", {})
    for name, default in defaults.items():
        if name in best[0] and repr(best[0][name]) != repr(default):
            attempt({**best[0], name: default})
    for name, sub_defaults in getattr(build, "sub_defaults", {}).items():
        for sub, default in sub_defaults.items():
            value = best[0].get(name)
            if isinstance(value, dict) and sub in value and repr(value[sub]) != repr(default):
                attempt({**best[0], name: {**value, sub: default}})
    if isinstance(best[0].get("text"), str):
        import re

        tokens = re.findall(r"\s+|\w+|.", best[0]["text"], re.S)
        chunk = max(1, len(tokens) // 2)
        while chunk >= 1 and time.perf_counter() < deadline:
            i = 0
            while i < len(tokens) and time.perf_counter() < deadline:
                candidate = tokens[:i] + tokens[i + chunk:]
                if candidate and attempt({**best[0], "text": "".join(candidate)}):
                    tokens = candidate
                else:
                    i += chunk
            chunk //= 2
    return best


def nan_safe_repr(value) -> str:
    """repr that round-trips floats like nan/inf and dtypes in a reproducer."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return f"float({str(value)!r})"
    if isinstance(value, tuple):
        inner = ", ".join(nan_safe_repr(v) for v in value)
        return f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, list):
        return "[" + ", ".join(nan_safe_repr(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{nan_safe_repr(k)}: {nan_safe_repr(v)}" for k, v in value.items()) + "}"
    text = repr(value)
    return text
