"""`relsql demo`: Mutagenesis (molecule, atom, bond) on DuckDB, trained end to end, without
ever modifying or replacing a table the user already has."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import duckdb
import sqlglot.expressions as exp
import torch

import relsql
from relsql import sql_templates
from relsql.datasets import mutagenesis
from relsql.errors import RelsqlError


def demo_tables() -> tuple[str, ...]:
    return mutagenesis.TABLES


def _holds_demo_data(db: relsql.Database, table: str, parquet: Path) -> bool:
    """Whether `table` has exactly the columns and rows (as a multiset) of the demo's Parquet file."""
    try:
        columns = [c for c, _ in db.columns(table)]
        empty = exp.select("*").from_(exp.func("read_parquet", exp.Literal.string(str(parquet)))).limit(0)
        shipped = [name for name, _ in db.result_columns(empty)]
        if columns != shipped:
            return False
        stored, shipped = (exp.Table(this=exp.to_identifier(table, quoted=True)),
                           exp.func("read_parquet", exp.Literal.string(str(parquet))))
        one_way = exp.Except(this=exp.select(exp.Star()).from_(stored.copy()),
                             expression=exp.select(exp.Star()).from_(shipped.copy()), distinct=False)
        other_way = exp.Except(this=exp.select(exp.Star()).from_(shipped.copy()),
                               expression=exp.select(exp.Star()).from_(stored.copy()), distinct=False)
        both = exp.union(one_way, other_way, distinct=False)
        differ = db.arrow(exp.select(exp.Count(this=exp.Star())).from_(exp.Subquery(this=both, alias=exp.TableAlias(
            this=exp.to_identifier("d"))))).column(0)[0].as_py()
    except (duckdb.Error, RelsqlError):
        return False
    return differ == 0


def _demo_tables(db: relsql.Database, path: str) -> dict[str, int] | None:
    """None when the demo's tables are to be loaded; their row counts when `path` already holds them with
    exactly the demo's data (reused, never modified); a RelsqlError when it holds other tables of those names."""
    data, tables = mutagenesis.DATA, mutagenesis.TABLES
    present = [t for t in tables if db.has_table(t)]
    if not present:
        return None
    if len(present) == len(tables) and all(_holds_demo_data(db, t, data / f"{t}.parquet") for t in tables):
        return {t: db.arrow(exp.select(exp.Count(this=exp.Star())).from_(exp.Table(this=exp.to_identifier(t, quoted=True))))
                .column(0)[0].as_py() for t in tables}
    raise RelsqlError(f"{path} (--db) already has table(s) {', '.join(present)} that are not the Mutagenesis demo's "
                      "data; the demo never modifies your tables: pass --db with a new .duckdb file")


def run(args: argparse.Namespace) -> int:
    """The embedded default: Mutagenesis (molecule, atom, bond) on DuckDB, trained end to end."""
    started = time.perf_counter()
    db = relsql.connect(args.db) if args.db else relsql.connect()
    try:
        if db.has_table(args.predictions):
            raise RelsqlError(f"table `{args.predictions}` already exists in {args.db}; the demo never replaces a "
                              "table: pass --predictions another_name, or drop that table")
        counts = _demo_tables(db, args.db) if args.db else None
        if counts is None:
            counts = mutagenesis.load(db)
            print(f"Mutagenesis in {db.description}: " + ", ".join(f"{t} {n} rows" for t, n in counts.items()))
        else:
            print(f"Mutagenesis already in {db.description}, used as it is: "
                  + ", ".join(f"{t} {n} rows" for t, n in counts.items()))
        template = sql_templates.path("mutagenesis")
        model = relsql.Model(db, template, target="molecule.mutagenic", seed=args.seed)
        print(f"grounded {template.name} in DuckDB and compiled it in {model.timings['grounding']:.2f}s; the plan:")
        print(model.net.explain())
        model.fit(epochs=args.epochs, lr=args.lr, patience=args.patience)
        print(model.report())
        positive = float(model.y[torch.as_tensor(model.rows["test"])].mean())
        scores = model.evaluate()
        print(f"test accuracy {scores['accuracy']:.3f} (majority class {max(positive, 1 - positive):.3f}), "
              f"ROC-AUC {scores['roc_auc']:.3f}")
        rows = model.write_predictions(args.predictions)
        print(f"wrote {rows} predictions to table {args.predictions}; total {time.perf_counter() - started:.1f}s")
        if args.model:
            path = model.save(args.model)
            print(f"model saved to {path} (metrics plot {path.with_suffix('.png')})")
    finally:
        db.close()
    return 0


