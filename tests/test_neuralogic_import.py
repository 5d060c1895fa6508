"""Tests for relsql.datasets.neuralogic_files: NeuraLogic example/query files -> DuckDB tables.

Expected figures for the shipped datasets are counted here from the raw text with regular
expressions, independently of the importer's parser.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from relsql.datasets import neuralogic_files as nf
from relsql.errors import RelsqlError

ATOM_RE = re.compile(r"([a-z][\w-]*)\(([^()]*)\)")


def _tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, str]]:
    rows = con.execute(f'DESCRIBE "{table}"').fetchall()
    return [(r[0], r[1]) for r in rows]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def con(tmp_path: Path):
    connection = duckdb.connect(str(tmp_path / "test.duckdb"))
    yield connection
    connection.close()


def _dataset_file(*parts: str) -> Path:
    return nf.builtin_dataset_root().joinpath(*parts)


# ------------------------------------------------------------------ shipped datasets


def test_mutagenesis_counts_match_raw_text(tmp_path: Path) -> None:
    db = tmp_path / "muta.duckdb"
    con = duckdb.connect(str(db))
    ds = nf.load_builtin(con, "mutagenesis")
    con.close()

    lines = [ln for ln in _dataset_file("molecules", "mutagenesis", "examples.txt")
             .read_text().splitlines() if ln.strip()]
    queries = [ln for ln in _dataset_file("molecules", "mutagenesis", "queries.txt")
               .read_text().splitlines() if ln.strip()]
    assert len(lines) == 188 and len(queries) == 188
    per_pred: Counter[str] = Counter()
    bonds_per_line: list[int] = []
    atoms: set[tuple[int, str]] = set()
    for i, line in enumerate(lines):
        facts = set(ATOM_RE.findall(line))  # facts are a set within one molecule
        per_pred.update(p for p, _ in facts)
        bonds = [a for p, a in facts if p == "bond"]
        bonds_per_line.append(len(bonds))
        for args in bonds:
            x, y, _ = (s.strip() for s in args.split(","))
            atoms.update({(i, x), (i, y)})
    assert per_pred["bond"] == 10486  # RECIPES.md
    assert len(atoms) == 4893  # RECIPES.md

    con = duckdb.connect(str(db), read_only=True)  # the import is committed to the file
    assert ds.tables["query_predict"] == 188
    for pred, n in per_pred.items():
        assert con.execute(f'SELECT count(*) FROM "{pred}"').fetchone()[0] == n, pred
    assert set(ds.tables) == set(per_pred) | {"query_predict"}
    assert sum(n for t, n in ds.tables.items() if t != "query_predict") == sum(per_pred.values())
    # sample i holds exactly the facts of line i
    got = dict(con.execute("SELECT sample, count(*) FROM bond GROUP BY sample").fetchall())
    assert got == {i: n for i, n in enumerate(bonds_per_line) if n}
    n_atoms = con.execute(
        "SELECT count(*) FROM (SELECT sample, a0 FROM bond UNION SELECT sample, a1 FROM bond)"
    ).fetchone()[0]
    assert n_atoms == 4893
    assert _columns(con, "bond") == [
        ("sample", "BIGINT"), ("a0", "VARCHAR"), ("a1", "VARCHAR"), ("a2", "VARCHAR")
    ]
    assert _columns(con, "query_predict") == [
        ("sample", "BIGINT"), ("target", "DOUBLE"), ("ordinal", "BIGINT")
    ]
    targets = con.execute(
        "SELECT sample, target, ordinal FROM query_predict ORDER BY ordinal"
    ).fetchall()
    assert [(s, o) for s, _, o in targets] == [(i, i) for i in range(188)]
    assert [t for _, t, _ in targets] == [float(q.split()[0]) for q in queries]
    assert sum(t for _, t, _ in targets) == sum(q.startswith("1.0") for q in queries) == 125
    con.close()

    assert ds.template.name == "template.txt" and ds.template.exists()
    assert len(ds.templates) == 8 and all(p.exists() for p in ds.templates)  # RECIPES.md


def test_nations_is_one_shared_sample(con: duckdb.DuckDBPyConnection) -> None:
    ds = nf.load_builtin(con, "nations")
    ex_text = _dataset_file("nations", "examples.txt").read_text()
    q_lines = [ln for ln in _dataset_file("nations", "queries.txt").read_text().splitlines()
               if ln.strip()]
    facts = ATOM_RE.findall(ex_text)
    assert len(facts) == 1464  # RECIPES.md
    assert len(q_lines) == 5347  # RECIPES.md
    fact_tables = {t: n for t, n in ds.tables.items() if not t.startswith("query_")}
    assert sum(fact_tables.values()) == len(set(facts))
    # `r` and `predict` are used with two arities: one table per arity
    arity = Counter(f"{p}/{a.count(',') + 1}" for p, a in facts)
    assert fact_tables["r/2"] == arity["r/2"] and fact_tables["r/3"] == arity["r/3"]
    expected = []
    for line in q_lines:
        value, atom = line.split(maxsplit=1)
        args = ATOM_RE.match(atom).group(2).split(",")
        expected.append((tuple(args), float(value)))
    assert ds.tables["query_predict/2"] == sum(len(a) == 2 for a, _ in expected) == 806
    assert ds.tables["query_predict/3"] == sum(len(a) == 3 for a, _ in expected) == 4541
    rows = con.execute(
        'SELECT ordinal, [a0, a1], target FROM "query_predict/2" '
        'UNION ALL SELECT ordinal, [a0, a1, a2], target FROM "query_predict/3" ORDER BY 1'
    ).fetchall()
    assert [o for o, _, _ in rows] == list(range(5347))
    assert [(tuple(a), t) for _, a, t in rows] == expected
    for table in ds.tables:
        assert con.execute(f'SELECT DISTINCT sample FROM "{table}"').fetchall() == [(0,)]


def test_small_builtins_layout(con: duckdb.DuckDBPyConnection) -> None:
    trains = nf.load_builtin(con, "trains")
    assert trains.tables["query_direction"] == 20
    rows = con.execute("SELECT a0, target, sample FROM query_direction ORDER BY ordinal").fetchall()
    assert rows == [(str(i), 1.0 if i <= 10 else -1.0, 0) for i in range(1, 21)]
    raw = _dataset_file("simple", "trains", "examples.txt").read_text()
    assert trains.tables["shape"] == Counter(p for p, _ in ATOM_RE.findall(raw))["shape"]

    xor = nf.load_builtin(con, "xor")
    assert xor.queries is None and xor.tables == {"a": 4, "b": 4, "query_xor": 4}
    assert con.execute("SELECT sample, target FROM query_xor ORDER BY ordinal").fetchall() == [
        (0, 0.0), (1, 1.0), (2, 1.0), (3, 0.0)
    ]
    assert con.execute("SELECT sample, value FROM a ORDER BY sample").fetchall() == [
        (0, 0.0), (1, 0.0), (2, 1.0), (3, 1.0)
    ]

    family = nf.load_builtin(con, "family")
    assert family.tables == {
        "horse": 3, "parent": 2, "sibling": 1, "query_foal": 1, "query_negFoal": 1
    }
    assert "value" not in dict(_columns(con, "horse"))  # <1.0> is the default value

    vec = nf.load_builtin(con, "xor_vectorized", query_prefix="vq_")
    assert set(vec.tables) == {"xy", "vq_xor"}
    assert dict(_columns(con, "xy"))["value"] == "DOUBLE[]"
    assert con.execute("SELECT value FROM xy ORDER BY sample").fetchall() == [
        ([0.0, 0.0],), ([0.0, 1.0],), ([1.0, 0.0],), ([1.0, 1.0],)
    ]

    with pytest.raises(RelsqlError, match="unknown built-in dataset 'cora'"):
        nf.load_builtin(con, "cora")


# ------------------------------------------------------------------ lexical forms


def test_values_targets_and_lexical_forms(tmp_path: Path, con) -> None:
    ex = _write(tmp_path, "ex.txt", """\
% a line comment
/* a block comment
   over two lines */
1.0 f(a), 0.5 g(a, b), <2> g(b, "New York"),
[1, 2.5, -3] v(a), <[0,1,0]> v(b), [3 | 1:4.5] v(c),
h(-1, 2.5e1), flag, <0.25> w, $named=7 f(b), k('it\\'s') % trailing comment
""")
    q = _write(tmp_path, "q.txt", """\
-1 q(a).
q(b).   % no value: target 1.0
[0, 1] r.
0.0 s("New York").
""")
    counts = nf.import_files(con, ex, q)
    assert counts == {
        "f": 2, "g": 2, "v": 3, "h": 1, "flag": 1, "w": 1, "k": 1,
        "query_q": 2, "query_r": 1, "query_s": 1,
    }
    assert _columns(con, "f") == [("sample", "BIGINT"), ("a0", "VARCHAR"), ("value", "DOUBLE")]
    assert con.execute("SELECT a0, value FROM f ORDER BY a0").fetchall() == [
        ("a", 1.0), ("b", 7.0)
    ]
    assert con.execute("SELECT a0, a1, value FROM g ORDER BY a0").fetchall() == [
        ("a", "b", 0.5), ("b", "New York", 2.0)
    ]
    assert dict(_columns(con, "v"))["value"] == "DOUBLE[]"
    assert con.execute("SELECT a0, value FROM v ORDER BY a0").fetchall() == [
        ("a", [1.0, 2.5, -3.0]), ("b", [0.0, 1.0, 0.0]), ("c", [0.0, 4.5, 0.0])
    ]
    assert _columns(con, "h") == [("sample", "BIGINT"), ("a0", "VARCHAR"), ("a1", "VARCHAR")]
    assert con.execute("SELECT a0, a1 FROM h").fetchall() == [("-1", "2.5e1")]
    assert con.execute("SELECT a0 FROM k").fetchall() == [("it's",)]
    # 0-arity predicates: just `sample`, plus `value` where it is not 1.0
    assert _columns(con, "flag") == [("sample", "BIGINT")]
    assert _columns(con, "w") == [("sample", "BIGINT"), ("value", "DOUBLE")]
    assert con.execute("SELECT sample, value FROM w").fetchall() == [(0, 0.25)]
    # queries: file order in `ordinal`, default target 1.0, vector targets
    assert con.execute("SELECT a0, target, ordinal FROM query_q ORDER BY ordinal").fetchall() == [
        ("a", -1.0, 0), ("b", 1.0, 1)
    ]
    assert _columns(con, "query_r") == [
        ("sample", "BIGINT"), ("target", "DOUBLE[]"), ("ordinal", "BIGINT")
    ]
    assert con.execute("SELECT target, ordinal FROM query_r").fetchall() == [([0.0, 1.0], 2)]
    assert con.execute("SELECT a0, target, ordinal FROM query_s").fetchall() == [
        ("New York", 0.0, 3)
    ]


def test_duplicate_facts_are_written_once(tmp_path: Path, con) -> None:
    ex = _write(tmp_path, "ex.txt", "f(a), f(b), f(a), 1.0 f(b), g(a,b), g(a, b).\n")
    assert nf.import_files(con, ex, None) == {"f": 2, "g": 1}
    assert con.execute("SELECT a0 FROM f ORDER BY a0").fetchall() == [("a",), ("b",)]
    assert "value" not in dict(_columns(con, "f"))

    bad = _write(tmp_path, "bad.txt", "f(a),\n0.5 f(a).\n")
    with pytest.raises(RelsqlError, match=r"bad\.txt:2: .*f\(a\).*line 1"):
        nf.import_files(con, bad, None, replace=True)


def test_one_sample_per_line_layout(tmp_path: Path, con) -> None:
    ex = _write(tmp_path, "ex.txt", "e(a, b), n(a).\ne(c, d).\n\ne(x, y), n(x), n(y).\n")
    q = _write(tmp_path, "q.txt", "1 p.\n0 p.\n1 p, 0 t(x).\n")
    counts = nf.import_files(con, ex, q)
    assert counts == {"e": 3, "n": 3, "query_p": 3, "query_t": 1}
    assert con.execute("SELECT sample, a0 FROM e ORDER BY sample").fetchall() == [
        (0, "a"), (1, "c"), (2, "x")
    ]
    assert con.execute("SELECT sample, target, ordinal FROM query_p ORDER BY 3").fetchall() == [
        (0, 1.0, 0), (1, 0.0, 1), (2, 1.0, 2)
    ]
    assert con.execute("SELECT sample, a0, ordinal FROM query_t").fetchall() == [(2, "x", 3)]

    # forced into one shared sample: facts of all statements merge (and dedupe)
    ex2 = _write(tmp_path, "ex2.txt", "e(a, b), n(a).\ne(a, b), n(b).\n")
    counts = nf.import_files(
        con, ex2, q, one_sample_per_line=False, query_prefix="g_", replace=True
    )
    assert counts["e"] == 1 and counts["n"] == 2 and counts["g_p"] == 3
    assert con.execute("SELECT DISTINCT sample FROM g_p").fetchall() == [(0,)]

    with pytest.raises(RelsqlError, match=r"3 query statements but .*ex2\.txt has 2"):
        nf.import_files(con, ex2, q, one_sample_per_line=True, replace=True)


def test_labelled_examples_without_periods(tmp_path: Path, con) -> None:
    ex = _write(tmp_path, "ex.txt", "0 xor :- 0 x, 0 y\n1 xor :- 0 x, 1 y\n1 xor <= 1 x, 0 y\n")
    assert nf.import_files(con, ex, None) == {"x": 3, "y": 3, "query_xor": 3}
    assert con.execute("SELECT sample, value FROM y ORDER BY sample").fetchall() == [
        (0, 0.0), (1, 1.0), (2, 0.0)
    ]
    assert con.execute("SELECT sample, target FROM query_xor ORDER BY ordinal").fetchall() == [
        (0, 0.0), (1, 1.0), (2, 1.0)
    ]


def test_predicate_with_two_arities_and_prefix_clash(tmp_path: Path, con) -> None:
    ex = _write(tmp_path, "ex.txt", "r(a, b), r(a, b, c), query_p(z).\n")
    q = _write(tmp_path, "q.txt", "p(a).\n")
    with pytest.raises(RelsqlError, match="both become table 'query_p'"):
        nf.import_files(con, ex, q)
    assert _tables(con) == set()
    assert nf.import_files(con, ex, q, query_prefix="q_") == {
        "r/2": 1, "r/3": 1, "query_p": 1, "q_p": 1
    }
    assert [c for c, _ in _columns(con, "r/3")] == ["sample", "a0", "a1", "a2"]


# ------------------------------------------------------------------ errors, safety


def test_refuses_to_overwrite_unless_replace(tmp_path: Path, con) -> None:
    ex = _write(tmp_path, "ex.txt", "f(a), g(b).\n")
    nf.import_files(con, ex, None)
    ex2 = _write(tmp_path, "ex2.txt", "f(x), f(y), h(z).\n")
    with pytest.raises(RelsqlError, match=r"f already exist.*replace=True"):
        nf.import_files(con, ex2, None)
    assert _tables(con) == {"f", "g"}  # h was not created either
    assert con.execute("SELECT a0 FROM f").fetchall() == [("a",)]

    assert nf.import_files(con, ex2, None, replace=True) == {"f": 2, "h": 1}
    assert con.execute("SELECT a0 FROM f ORDER BY 1").fetchall() == [("x",), ("y",)]


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("f(a),\ng(b),\nh(a b).\n", 3, r"expected ',' or '\)'"),
        ("f(a).\n\n  g(X).\n", 3, "variable X"),
        ("f(a),\n g(b) h(c).\n", 2, r"expected ',' or '\.'"),
        ("f(a).\n{3} g(b).\n", 2, "dimensions"),
        ("f(a).\ng(b) # c.\n", 2, "unexpected character '#'"),
        ("f(a).\n<1 g(b).\n", 2, "'>' closing"),
        ("f(a).\n[[1, 2], [3, 4]] m(a).\n", 2, "matrix"),
        ("[1, 2] v(a),\n 3 v(b).\n", 2, "vector values elsewhere"),
        ("f(a),\n\n\n .\n", 4, "expected a predicate name"),
    ],
)
def test_malformed_input_names_file_and_line(
    tmp_path: Path, con, text: str, line: int, what: str
) -> None:
    path = _write(tmp_path, "broken.txt", text)
    with pytest.raises(RelsqlError, match=rf"broken\.txt:{line}: .*{what}"):
        nf.import_files(con, path, None)
    assert _tables(con) == set()


def test_malformed_queries_file_and_missing_file(tmp_path: Path, con) -> None:
    ex = _write(tmp_path, "ex.txt", "f(a).\n")
    q = _write(tmp_path, "q.txt", "1.0 p(a).\n1.0 p(a.\n")
    with pytest.raises(RelsqlError, match=r"q\.txt:2: "):
        nf.import_files(con, ex, q)
    assert _tables(con) == set()
    with pytest.raises(RelsqlError, match="cannot read"):
        nf.import_files(con, tmp_path / "nope.txt", None)


def test_failure_midway_leaves_no_partial_tables(tmp_path: Path, con, monkeypatch) -> None:
    con.execute("CREATE TABLE f AS SELECT 'old' AS a0")
    con.execute("CREATE VIEW query_q AS SELECT 1 AS x")  # cannot be replaced by a table
    ex = _write(tmp_path, "ex.txt", "f(new), g(b).\n")
    q = _write(tmp_path, "q.txt", "q(a).\n")
    with pytest.raises(RelsqlError, match="query_q"):
        nf.import_files(con, ex, q, replace=True)
    assert _tables(con) == {"f"}  # g was rolled back with the rest
    assert con.execute("SELECT a0 FROM f").fetchall() == [("old",)]

    # an error of any kind after some tables exist rolls them all back
    real_create = nf._create
    calls = []

    def flaky(connection, name, table, replace):
        calls.append(name)
        if len(calls) == 3:
            raise RuntimeError("disk full")
        real_create(connection, name, table, replace)

    monkeypatch.setattr(nf, "_create", flaky)
    ex2 = _write(tmp_path, "ex2.txt", "a(x), b(y), c(z).\n")
    with pytest.raises(RuntimeError, match="disk full"):
        nf.import_files(con, ex2, None)
    assert calls == ["a", "b", "c"]
    assert _tables(con) == {"f"}


_PYNEURALOGIC_TARGETS = """
import json, sys
from neuralogic.core import Settings
from neuralogic.utils import data
loaders = {"family": data.Family, "xor": data.XOR, "mutagenesis": data.Mutagenesis, "nations": data.Nations}
out = {}
for name, loader in loaders.items():
    model, dataset = loader()
    out[name] = [float(s.target) for s in model.build(Settings()).build_dataset(dataset)._samples]
json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.oracle
def test_ordinal_is_pyneuralogic_output_order(tmp_path: Path) -> None:
    """PyNeuraLogic's built samples (one per query) come in `ordinal` order with our targets.

    PyNeuraLogic runs in a subprocess: its JVM keeps state between builds that breaks the
    oracle's later builds in the same process (NullPointerException in Runner.getSources).
    """
    pytest.importorskip("neuralogic")
    result = tmp_path / "targets.json"
    subprocess.run([sys.executable, "-c", _PYNEURALOGIC_TARGETS, str(result)], cwd=tmp_path,
                   capture_output=True, text=True, timeout=600, check=True)
    expected = json.loads(result.read_text())
    for name, targets in expected.items():
        con = duckdb.connect()
        ds = nf.load_builtin(con, name)
        union = " UNION ALL ".join(
            f'SELECT ordinal, target FROM "{t}"' for t in ds.tables if t.startswith("query_")
        )
        ours = con.execute(f"SELECT target FROM ({union}) ORDER BY ordinal").fetchall()
        assert targets == [t for (t,) in ours], name
        con.close()
