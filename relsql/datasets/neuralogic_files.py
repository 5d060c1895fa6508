"""Import NeuraLogic example/query text files into DuckDB tables.

NeuraLogic datasets are text files of ground facts (``examples``) and labelled query atoms
(``queries``). relsql grounds templates with SQL, so this module turns such files into plain
relations that the Datalog frontend reads (see DESIGN.md, "Datalog templates"):

* one table per fact predicate, named as the predicate (``bond``, ``c``, ``b_1``), with columns
  ``sample`` BIGINT, ``a0 .. a{k-1}`` VARCHAR (the constants by position) and, only when some
  fact has a value other than 1.0, ``value`` (DOUBLE, or DOUBLE[] for vector values);
* one table per query predicate, named ``query_<predicate>``, with ``sample``, ``a0 ..``,
  ``target`` (DOUBLE or DOUBLE[]; 1.0 when the query has no value) and ``ordinal`` (the
  query's position among all queries, i.e. the order of PyNeuraLogic's outputs).

A predicate name used with several arities (Nations has ``predict/2`` and ``predict/3``) gets
one table per arity, named ``name/arity`` (``query_predict/2``), as NeuraLogic itself treats
``name/arity`` as the predicate's identity.

Samples follow NeuraLogic's own rule (its examples parser counts the ``.``-terminated example
statements): exactly one example statement means one shared knowledge base that every query
refers to (Family, Trains, Nations; all rows get ``sample`` 0); several example statements
mean independent samples, example statement i (one per line in Mutagenesis) with query
statement i. ``one_sample_per_line`` overrides the detection. Examples written as
``label :- facts.`` (XOR) carry their own queries, one sample per statement.

Lexical forms accepted (NeuraLogic's grammar plus a little leniency): ``%`` and ``/* */``
comments, values in front of atoms (``1.0 predict.``, ``0 xor``, ``<1> a``, ``[0.1, 0.2]
f(a)``, ``<[0,1]> xy``, sparse ``[3 | 0:1.0]``, an ignored ``$name=`` prefix), ``:-`` or ``<=``
in labelled examples, quoted constants (stored without quotes), signed numbers as constants,
statements spanning lines, and a missing final ``.`` where a line break ends the statement.
"""

from __future__ import annotations

import importlib.util
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import sqlglot.expressions as exp

from relsql import textfile
from relsql.datasets.transaction import atomic
from relsql.errors import RelsqlError, SourceError

__all__ = [
    "BUILTIN_DATASETS",
    "Atom",
    "BuiltinDataset",
    "Statement",
    "builtin_dataset_root",
    "import_files",
    "import_text",
    "load_builtin",
    "parse_statements",
]

Value = float | tuple[float, ...] | None


@dataclass(frozen=True)
class Atom:
    """One ground atom as written: predicate, constant texts, optional value, source line."""

    predicate: str
    args: tuple[str, ...]
    value: Value
    line: int


@dataclass(frozen=True)
class Statement:
    """One ``.``-terminated statement: its atoms and, for ``label :- facts.``, the labels."""

    atoms: tuple[Atom, ...]
    labels: tuple[Atom, ...]
    line: int


# --------------------------------------------------------------------------- lexing

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\f\v]+)
  | (?P<nl>\n)
  | (?P<comment>%[^\n]*)
  | (?P<block>/\*.*?(?:\*/|\Z))
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<name>[a-z][A-Za-z0-9_\-]*)
  | (?P<var>[A-Z_][A-Za-z0-9_\-]*)
  | (?P<punct>:-|<=|[(),.<>\[\]{}$=~!@*|:/])
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPE_RE = re.compile(r"\\(.)")
_EOF = "eof"


def _tokenize(text: str, source: str) -> tuple[list[str], list[str], list[int]]:
    """Split text into (kind, text, line) columns; comments and whitespace dropped."""
    kinds: list[str] = []
    texts: list[str] = []
    lines: list[int] = []
    line = 1
    pos = 0
    n = len(text)
    match = _TOKEN_RE.match
    while pos < n:
        m = match(text, pos)
        if m is None:
            raise SourceError(f"{source}:{line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup
        tok = m.group()
        pos = m.end()
        if kind == "nl":
            line += 1
        elif kind == "block":
            line += tok.count("\n")
        elif kind == "punct":
            kinds.append(tok)
            texts.append(tok)
            lines.append(line)
        elif kind != "ws" and kind != "comment":
            kinds.append(kind)  # type: ignore[arg-type]
            texts.append(tok)
            lines.append(line)
    kinds.append(_EOF)
    texts.append("end of file")
    lines.append(line)
    return kinds, texts, lines


# --------------------------------------------------------------------------- parsing


class _Parser:
    """Recursive descent over the token columns; every error names file and line."""

    def __init__(self, text: str, source: str, what: str) -> None:
        self.kinds, self.texts, self.lines = _tokenize(text, source)
        self.source = source
        self.what = what  # "examples" or "queries": only for messages
        self.pos = 0

    # -- helpers
    def _fail(self, message: str, line: int | None = None) -> SourceError:
        if line is None:
            line = self.lines[self.pos]
        return SourceError(f"{self.source}:{line}: {message}")

    def _got(self) -> str:
        kind = self.kinds[self.pos]
        return "end of file" if kind == _EOF else repr(self.texts[self.pos])

    def _expect(self, kind: str, what: str) -> str:
        if self.kinds[self.pos] != kind:
            raise self._fail(f"expected {what}, got {self._got()}")
        text = self.texts[self.pos]
        self.pos += 1
        return text

    # -- grammar
    def statements(self) -> list[Statement]:
        out: list[Statement] = []
        while self.kinds[self.pos] != _EOF:
            if self.kinds[self.pos] == ".":  # a stray '.' (e.g. "a(x).." ) is an empty statement
                raise self._fail("empty statement: '.' without any atom before it")
            out.append(self._statement())
        return out

    def _statement(self) -> Statement:
        line = self.lines[self.pos]
        atoms = self._conjunction()
        labels: tuple[Atom, ...] = ()
        if self.kinds[self.pos] in (":-", "<="):
            self.pos += 1
            labels, atoms = atoms, self._conjunction()
        kind = self.kinds[self.pos]
        if kind == ".":
            self.pos += 1
        elif kind != _EOF and self.lines[self.pos] == self.lines[self.pos - 1]:
            raise self._fail(f"expected ',' or '.' after an atom, got {self._got()}")
        return Statement(atoms, labels, line)

    def _conjunction(self) -> tuple[Atom, ...]:
        atoms = [self._atom()]
        while True:
            kind = self.kinds[self.pos]
            if kind == ",":
                self.pos += 1
                atoms.append(self._atom())
            elif kind in (".", ":-", "<=", _EOF):
                return tuple(atoms)
            elif self.lines[self.pos] > self.lines[self.pos - 1]:
                return tuple(atoms)  # a line break ends a statement that lacks its '.'
            else:
                raise self._fail(f"expected ',' or '.' after an atom, got {self._got()}")

    def _atom(self) -> Atom:
        line = self.lines[self.pos]
        value: Value = None
        if self.kinds[self.pos] == "$":  # named weight: the name only matters for learning
            self.pos += 1
            self._expect("name", "a weight name after '$'")
            self._expect("=", "'=' after the weight name")
        kind = self.kinds[self.pos]
        if kind == "<":
            self.pos += 1
            value = self._value()
            self._expect(">", "'>' closing the fixed value")
        elif kind in ("number", "["):
            value = self._value()
        elif kind == "{":
            raise self._fail(
                "a fact given only by dimensions {..} (a learnable fact) cannot be imported; "
                "write its value, e.g. [0.1, 0.2] f(a)"
            )
        kind = self.kinds[self.pos]
        if kind in ("~", "!"):
            raise self._fail(f"negated atoms are not supported in {self.what} files")
        if kind in ("*", "@"):
            raise self._fail(f"'{kind}' predicates (hidden/special) cannot appear in {self.what}")
        if kind != "name":
            if kind == "var":
                raise self._fail(
                    f"predicate names start with a lower-case letter, got {self._got()}"
                )
            raise self._fail(f"expected a predicate name, got {self._got()}")
        predicate = self.texts[self.pos]
        self.pos += 1
        declared: int | None = None
        if self.kinds[self.pos] == "/":
            self.pos += 1
            arity_text = self._expect("number", "an arity after '/'")
            if not arity_text.isdigit():
                raise self._fail(f"arity must be a non-negative integer, got {arity_text!r}")
            declared = int(arity_text)
        args: list[str] = []
        if self.kinds[self.pos] == "(":
            self.pos += 1
            if self.kinds[self.pos] != ")":
                args.append(self._term())
                while self.kinds[self.pos] == ",":
                    self.pos += 1
                    args.append(self._term())
            self._expect(")", "',' or ')' in the argument list")
        if declared is not None and declared != len(args):
            raise self._fail(
                f"{predicate}/{declared} is written with {len(args)} arguments", line
            )
        return Atom(predicate, tuple(args), value, line)

    def _term(self) -> str:
        kind = self.kinds[self.pos]
        text = self.texts[self.pos]
        if kind in ("name", "number"):
            self.pos += 1
            return text
        if kind == "string":
            self.pos += 1
            return _ESCAPE_RE.sub(r"\1", text[1:-1])
        if kind == "var":
            raise self._fail(
                f"variable {text} in {self.what}: facts and queries must be ground "
                "(constants start with a lower-case letter, a digit or a quote)"
            )
        raise self._fail(f"expected a constant, got {self._got()}")

    def _number(self) -> float:
        text = self._expect("number", "a number")
        return float(text)

    def _value(self) -> float | tuple[float, ...]:
        kind = self.kinds[self.pos]
        if kind == "number":
            return self._number()
        if kind != "[":
            raise self._fail(f"expected a value, got {self._got()}")
        self.pos += 1
        if self.kinds[self.pos] == "[":
            raise self._fail("matrix values cannot be imported; facts take scalars or vectors")
        if self.kinds[self.pos] == "]":
            raise self._fail("empty vector value []")
        if self.kinds[self.pos] == "number" and self.kinds[self.pos + 1] == "|":
            return self._sparse_vector()
        items = [self._number()]
        while self.kinds[self.pos] == ",":
            self.pos += 1
            items.append(self._number())
        self._expect("]", "',' or ']' in the vector value")
        return tuple(items)

    def _sparse_vector(self) -> tuple[float, ...]:
        """``[size | i:v, (j:w)]`` -> dense tuple; NeuraLogic's sparse vector literal."""
        line = self.lines[self.pos]
        size_text = self._expect("number", "the vector size")
        self.pos += 1  # '|'
        if not size_text.isdigit():
            raise self._fail(f"sparse vector size must be an integer, got {size_text!r}", line)
        dense = [0.0] * int(size_text)
        if self.kinds[self.pos] != "]":
            self._sparse_element(dense, line)
            while self.kinds[self.pos] == ",":
                self.pos += 1
                self._sparse_element(dense, line)
        self._expect("]", "',' or ']' in the sparse vector")
        return tuple(dense)

    def _sparse_element(self, dense: list[float], line: int) -> None:
        paren = self.kinds[self.pos] == "("
        if paren:
            self.pos += 1
        index_text = self._expect("number", "an element index")
        self._expect(":", "':' after the element index")
        val = self._number()
        if paren:
            self._expect(")", "')' closing the sparse element")
        if not index_text.isdigit() or int(index_text) >= len(dense):
            raise self._fail(f"sparse index {index_text} outside 0..{len(dense) - 1}", line)
        dense[int(index_text)] = val


def parse_statements(text: str, source: str = "<text>", what: str = "examples") -> list[Statement]:
    """Parse an examples or queries text into its ``.``-terminated statements."""
    return _Parser(text, source, what).statements()


# --------------------------------------------------------------------------- samples


@dataclass
class _Rel:
    """Rows of one (predicate, arity) collected before they become an Arrow table."""

    predicate: str
    arity: int
    samples: list[int]
    args: list[tuple[str, ...]]
    values: list[Value]
    lines: list[int]
    ordinals: list[int]


def _new_rel(predicate: str, arity: int) -> _Rel:
    return _Rel(predicate, arity, [], [], [], [], [])


def _collect(
    ex_stmts: list[Statement],
    q_stmts: list[Statement],
    one_sample_per_line: bool | None,
    ex_src: str,
    q_src: str,
) -> tuple[dict[tuple[str, int], _Rel], dict[tuple[str, int], _Rel]]:
    """Give every fact and query its sample index, following NeuraLogic's layout rule."""
    labelled = [s for s in ex_stmts if s.labels]
    if labelled and len(labelled) != len(ex_stmts):
        plain = next(s for s in ex_stmts if not s.labels)
        raise SourceError(
            f"{ex_src}:{plain.line}: example without a label, but other examples are written "
            "'label :- facts.'; use one form for the whole file"
        )
    if labelled:
        if one_sample_per_line is False:
            raise SourceError(
                f"{ex_src}: examples written 'label :- facts.' are one sample each; "
                "one_sample_per_line=False does not apply"
            )
        if q_stmts:
            raise SourceError(
                f"{ex_src}: examples already carry their queries ('label :- facts.'), so the "
                f"queries file {q_src} would be ambiguous; pass queries=None"
            )
        per_sample = True
        q_stmts = [Statement(s.labels, (), s.line) for s in ex_stmts]
        q_src = ex_src
    elif one_sample_per_line is None:
        per_sample = len(ex_stmts) != 1
    else:
        per_sample = one_sample_per_line
    if per_sample and ex_stmts and q_stmts and len(ex_stmts) != len(q_stmts):
        raise SourceError(
            f"{q_src}: {len(q_stmts)} query statements but {ex_src} has {len(ex_stmts)} "
            "example statements; with one sample per example statement query statement i "
            "belongs to example i (pass one_sample_per_line=False if every query refers to "
            "one shared example)"
        )

    facts: dict[tuple[str, int], _Rel] = {}
    seen: dict[tuple[str, int], dict[tuple[int, tuple[str, ...]], int]] = {}
    for i, stmt in enumerate(ex_stmts):
        sample = i if per_sample else 0
        for atom in stmt.atoms:
            key = (atom.predicate, len(atom.args))
            rel = facts.get(key)
            if rel is None:
                rel = facts[key] = _new_rel(*key)
                seen[key] = {}
            row_key = (sample, atom.args)
            at = seen[key].get(row_key)
            if at is not None:
                if _norm(rel.values[at]) != _norm(atom.value):
                    raise SourceError(
                        f"{ex_src}:{atom.line}: fact {_show(atom)} repeats the fact of line "
                        f"{rel.lines[at]} with a different value"
                    )
                continue  # facts are a set
            seen[key][row_key] = len(rel.samples)
            rel.samples.append(sample)
            rel.args.append(atom.args)
            rel.values.append(atom.value)
            rel.lines.append(atom.line)

    queries: dict[tuple[str, int], _Rel] = {}
    ordinal = 0
    for i, stmt in enumerate(q_stmts):
        if stmt.labels:
            raise SourceError(
                f"{q_src}:{stmt.line}: queries written 'id :- queries.' are not supported; "
                "write one query statement per example, in example order"
            )
        sample = i if per_sample else 0
        for atom in stmt.atoms:
            key = (atom.predicate, len(atom.args))
            rel = queries.get(key)
            if rel is None:
                rel = queries[key] = _new_rel(*key)
            rel.samples.append(sample)
            rel.args.append(atom.args)
            rel.values.append(atom.value)
            rel.lines.append(atom.line)
            rel.ordinals.append(ordinal)
            ordinal += 1
    return facts, queries


def _norm(value: Value) -> Value:
    return 1.0 if value is None else value


def _show(atom: Atom) -> str:
    return f"{atom.predicate}({', '.join(atom.args)})" if atom.args else atom.predicate


# --------------------------------------------------------------------------- arrow tables


def _value_array(rel: _Rel, src: str, role: str) -> pa.Array | None:
    """The value/target column, or None for facts whose values are all the default 1.0."""
    vectors = [v for v in rel.values if isinstance(v, tuple)]
    name = f"{rel.predicate}/{rel.arity}"
    if vectors:
        width = len(vectors[0])
        for v, line in zip(rel.values, rel.lines, strict=True):
            if not isinstance(v, tuple):
                shown = "no value" if v is None else f"the scalar {v:g}"
                raise SourceError(
                    f"{src}:{line}: {name} has vector {role}s elsewhere but {shown} here; "
                    "give every atom of a predicate a vector of the same length"
                )
            if len(v) != width:
                raise SourceError(
                    f"{src}:{line}: {name} {role} has length {len(v)}, earlier ones {width}"
                )
        return pa.array([list(v) for v in vectors], type=pa.list_(pa.float64()))
    scalars = [1.0 if v is None else float(v) for v in rel.values]  # type: ignore[arg-type]
    if role == "value" and all(v == 1.0 for v in scalars):
        return None
    return pa.array(scalars, type=pa.float64())


def _arrow(rel: _Rel, src: str, query: bool) -> pa.Table:
    columns: dict[str, pa.Array] = {"sample": pa.array(rel.samples, type=pa.int64())}
    for j in range(rel.arity):
        columns[f"a{j}"] = pa.array([a[j] for a in rel.args], type=pa.string())
    values = _value_array(rel, src, "target" if query else "value")
    if values is not None:
        columns["target" if query else "value"] = values
    if query:
        columns["ordinal"] = pa.array(rel.ordinals, type=pa.int64())
    return pa.table(columns)


def _table_names(rels: dict[tuple[str, int], _Rel], prefix: str) -> dict[tuple[str, int], str]:
    """``prefix + name``, or ``prefix + name/arity`` where a name has several arities."""
    arities: dict[str, int] = {}
    for predicate, _ in rels:
        arities[predicate] = arities.get(predicate, 0) + 1
    return {
        (p, k): f"{prefix}{p}" if arities[p] == 1 else f"{prefix}{p}/{k}" for p, k in rels
    }


def _build(
    facts: dict[tuple[str, int], _Rel],
    queries: dict[tuple[str, int], _Rel],
    query_prefix: str,
    ex_src: str,
    q_src: str,
) -> dict[str, pa.Table]:
    out: dict[str, pa.Table] = {}
    owner: dict[str, str] = {}
    for rels, prefix, src, query in (
        (facts, "", ex_src, False),
        (queries, query_prefix, q_src, True),
    ):
        for key, name in _table_names(rels, prefix).items():
            what = f"{'query' if query else 'fact'} predicate {key[0]}/{key[1]}"
            clash = owner.get(name.lower())
            if clash is not None:  # DuckDB identifiers are case-insensitive
                raise SourceError(
                    f"{src}: {what} and {clash} would both become table {name!r}; "
                    "rename one or pass another query_prefix"
                )
            owner[name.lower()] = what
            out[name] = _arrow(rels[key], src, query)
    return out


# --------------------------------------------------------------------------- duckdb


def _existing_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_catalog = current_database() AND table_schema = current_schema()"
    ).fetchall()
    return {r[0].lower() for r in rows}


def _create(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table, replace: bool) -> None:
    """CREATE TABLE name AS SELECT * FROM a registered Arrow table (one statement)."""
    view = f"__relsql_import_{uuid.uuid4().hex}"
    con.register(view, table)
    try:
        stmt = exp.Create(
            kind="TABLE",
            this=exp.Table(this=exp.to_identifier(name, quoted=True)),
            expression=exp.select("*").from_(exp.Table(this=exp.to_identifier(view, quoted=True))),
            replace=replace,
        )
        con.execute(stmt.sql(dialect="duckdb"))
    finally:
        con.unregister(view)


def _write(
    con: duckdb.DuckDBPyConnection, tables: dict[str, pa.Table], replace: bool
) -> dict[str, int]:
    """Create all tables in one transaction: all of them appear, or none does."""
    existing = _existing_tables(con)
    clashes = sorted(n for n in tables if n.lower() in existing)
    if clashes and not replace:
        raise SourceError(
            f"table(s) {', '.join(clashes)} already exist; pass replace=True to overwrite them"
        )
    current = [""]
    with atomic(con, current):
        for name, table in tables.items():
            current[0] = name
            _create(con, name, table, replace)
    return {n: t.num_rows for n, t in tables.items()}


# --------------------------------------------------------------------------- public API


DATA_LIMIT = 1 << 30  # bytes: an examples file is data (Nations' is 100 kB), not a hand-written template


def _read(path: str | Path) -> str:
    return textfile.read_text(path, "NeuraLogic file", SourceError, limit=DATA_LIMIT)


def import_text(
    con: duckdb.DuckDBPyConnection,
    examples: str | None,
    queries: str | None,
    *,
    one_sample_per_line: bool | None = None,
    query_prefix: str = "query_",
    replace: bool = False,
    examples_source: str = "<examples>",
    queries_source: str = "<queries>",
) -> dict[str, int]:
    """Like :func:`import_files`, for example/query texts already in memory."""
    ex_stmts = parse_statements(examples, examples_source, "examples") if examples else []
    q_stmts = parse_statements(queries, queries_source, "queries") if queries else []
    facts, query_rels = _collect(
        ex_stmts, q_stmts, one_sample_per_line, examples_source, queries_source
    )
    tables = _build(facts, query_rels, query_prefix, examples_source, queries_source)
    return _write(con, tables, replace)


def import_files(
    con: duckdb.DuckDBPyConnection,
    examples: str | Path | None,
    queries: str | Path | None,
    *,
    one_sample_per_line: bool | None = None,
    query_prefix: str = "query_",
    replace: bool = False,
) -> dict[str, int]:
    """Import a NeuraLogic examples file and/or queries file; returns {table: row count}.

    ``one_sample_per_line``: None detects the layout as NeuraLogic does (one example
    statement = one shared sample; several = one sample each, aligned with the query
    statements); True/False force it. Everything is parsed before the database is touched,
    and the tables are created in one transaction, so a failure leaves no partial import.
    Existing tables are refused unless ``replace=True``.
    """
    if examples is None and queries is None:
        raise RelsqlError("import_files needs an examples file, a queries file, or both")
    return import_text(
        con,
        _read(examples) if examples is not None else None,
        _read(queries) if queries is not None else None,
        one_sample_per_line=one_sample_per_line,
        query_prefix=query_prefix,
        replace=replace,
        examples_source=str(examples) if examples is not None else "<examples>",
        queries_source=str(queries) if queries is not None else "<queries>",
    )


# --------------------------------------------------------------------------- builtins


@dataclass(frozen=True)
class _Spec:
    examples: str
    queries: str | None
    template: str
    extra_templates: tuple[str, ...] = ()
    template_dir: str | None = None


# Paths relative to neuralogic/utils/data/datasets, mirroring neuralogic.utils.data's loaders
# (Mutagenesis(), Nations(), XOR(), XOR_Vectorized(), Family(), Trains()). All of them are
# text files; none of the shipped datasets exists only in the Python DSL.
BUILTIN_DATASETS: dict[str, _Spec] = {
    "mutagenesis": _Spec(
        "molecules/mutagenesis/examples.txt",
        "molecules/mutagenesis/queries.txt",
        "molecules/mutagenesis/templates/template.txt",
        template_dir="molecules/mutagenesis/templates",
    ),
    "nations": _Spec(
        "nations/examples.txt", "nations/queries.txt", "nations/template.txt",
        ("nations/embeddings.txt",),
    ),
    "xor": _Spec(
        "simple/xor/naive/trainExamples.txt", None, "simple/xor/naive/template.txt"
    ),
    "xor_vectorized": _Spec(
        "simple/xor/vectorized/trainExamples.txt", None, "simple/xor/vectorized/template.txt"
    ),
    "family": _Spec(
        "simple/family/examples.txt", "simple/family/queries.txt", "simple/family/template.txt"
    ),
    "trains": _Spec(
        "simple/trains/examples.txt", "simple/trains/queries.txt", "simple/trains/template.txt"
    ),
}


@dataclass(frozen=True)
class BuiltinDataset:
    """What :func:`load_builtin` imported and where the dataset's templates are."""

    name: str
    tables: dict[str, int]
    template: Path
    """The template PyNeuraLogic's own loader uses (its ``import ./x`` lines resolve beside it)."""
    templates: tuple[Path, ...]
    """Every template file shipped with the dataset, ``template`` first."""
    examples: Path
    queries: Path | None


def builtin_dataset_root() -> Path:
    """The ``datasets`` folder inside the installed ``neuralogic`` wheel (not imported)."""
    spec = importlib.util.find_spec("neuralogic")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(
            "the built-in NeuraLogic datasets come with PyNeuraLogic; install it "
            "(pip install neuralogic)"
        )
    root = Path(next(iter(spec.submodule_search_locations))) / "utils" / "data" / "datasets"
    if not root.is_dir():
        raise SourceError(f"the installed neuralogic package has no dataset folder at {root}")
    return root


def load_builtin(
    con: duckdb.DuckDBPyConnection,
    name: str,
    *,
    query_prefix: str = "query_",
    replace: bool = False,
) -> BuiltinDataset:
    """Import one dataset shipped in the neuralogic wheel (``mutagenesis``, ``nations``,
    ``xor``, ``xor_vectorized``, ``family``, ``trains``) with its files' natural layout."""
    key = name.lower()
    spec = BUILTIN_DATASETS.get(key)
    if spec is None:
        raise SourceError(
            f"unknown built-in dataset {name!r}; choose one of {', '.join(BUILTIN_DATASETS)}"
        )
    root = builtin_dataset_root()
    examples = root / spec.examples
    queries = root / spec.queries if spec.queries else None
    template = root / spec.template
    extra = [root / p for p in spec.extra_templates]
    if spec.template_dir:
        extra += sorted(p for p in (root / spec.template_dir).glob("*.txt") if p != template)
    tables = import_files(con, examples, queries, query_prefix=query_prefix, replace=replace)
    return BuiltinDataset(key, tables, template, (template, *extra), examples, queries)
