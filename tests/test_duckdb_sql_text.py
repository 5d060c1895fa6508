"""relsql writes each statement's DuckDB text without copying its tree first (DuckDBDatabase.sql and
.run, copy=False). That is only right while writing leaves the tree as it was: every statement a
Model construction and a prediction send, written with sqlglot's copying writer before and after
relsql wrote it, must read the same. A sqlglot release whose DuckDB writer rewrote trees in place
fails here."""

from __future__ import annotations

import relsql
from bench import relgen
from relsql.data.duckdb import DuckDBDatabase


def test_writing_a_statement_leaves_its_tree_as_it_was(tmp_path, monkeypatch):
    seen = []  # (text of the tree before relsql wrote it, after), by sqlglot's copying writer

    def watching(real):
        def wrapped(self, query):
            before = None if isinstance(query, str) else query.sql("duckdb")
            result = real(self, query)
            if before is not None:
                seen.append((before, query.sql("duckdb")))
            return result
        return wrapped

    for name in ("sql", "run"):  # `run` writes the statements grounding creates, `sql` every other one
        monkeypatch.setattr(DuckDBDatabase, name, watching(getattr(DuckDBDatabase, name)))
    path = relgen.write(relgen.shop(0, scale=0.1), tmp_path / "shop.duckdb", "customer.churned")
    db = relsql.connect(str(path), read_only=True)
    template = relsql.Template.auto(db, target="customer.churned")
    model = relsql.Model(db, template, target="customer.churned", progress=False)
    model.predict()
    db.close()
    assert len(seen) > 50  # catalog reads, statistics, groundings, index reads
    changed = [after for before, after in seen if before != after]
    assert changed == []
