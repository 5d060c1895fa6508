"""`relsql task <db> "<query>" --name task_churn`: write a labelled task table from a predictive
query (relsql/predictive/), then say how to train on it.

The query is parsed while the command line is read, so a malformed one is a usage error (exit
2) naming the position and the fix, before the database is opened. `--replace` replaces only a
task table that relsql wrote (it bears relsql's mark): a table of data is never replaced.
"""

from __future__ import annotations

import argparse
import shlex

import relsql
from relsql.cli.arguments import DB_KINDS, database, table_name
from relsql.predictive import GRAMMAR, QueryError, parse

__all__ = ["add_parser", "run"]

HELP = "write a labelled task table (entity key, snapshot, label) from a predictive query"
EXAMPLE = 'relsql task shop.duckdb "COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 30 DAYS" --name task_churn'


def query(text: str):
    """The predictive query, parsed: a syntax error is an argparse usage error (exit 2)."""
    try:
        return parse(text)
    except QueryError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_parser(commands, epilog: str) -> argparse.ArgumentParser:
    """Register `relsql task` on the `relsql` subcommands (`commands`, from add_subparsers)."""
    parser = commands.add_parser("task", help=HELP, description=f"{HELP}. Example:\n  {EXAMPLE}\n\ngrammar:\n{GRAMMAR}",
                                 epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("db", type=database, help=DB_KINDS)
    parser.add_argument("query", type=query, help='e.g. "COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 30 DAYS"')
    parser.add_argument("--name", type=table_name, default="task", help="the new table (default task)")
    parser.add_argument("--replace", action="store_true", help="replace an existing task table (never a table of data)")
    parser.add_argument("--foreign-key", action="store_true",
                        help="also declare the entity key a foreign key (DuckDB; the entity table then cannot be "
                             "dropped while the task table exists)")
    parser.set_defaults(run=run)
    return parser


def _replaceable(db: relsql.Database, name: str, replace: bool) -> None:
    """Refuse, before any work, an existing table without --replace, or one that is not a task
    table relsql wrote (its mark, see Database.replaceable)."""
    db.replaceable(name, replace, "task", how="--replace", other="another --name")


def run(args: argparse.Namespace) -> int:
    with relsql.connect(args.db) as db:
        _replaceable(db, args.name, args.replace)
        written = args.query.write(db, args.name, replace=args.replace, foreign_key=args.foreign_key)
    print(written)
    if written.labelled == 0:
        print("note: no row has a label yet (every window runs past the data's last event); these rows can be "
              "predicted, not trained on")
    target, quoted_db = f"{written.name}.{written.target}", shlex.quote(args.db)
    sql = shlex.quote(f"{written.name}.sql")
    if not written.time_columns:
        print("note: the events' time is read through a dimension table; an automatic template filters only a "
              "table's own date columns, so edit the template to join the events only when earlier than the snapshot")
    print(f"next: relsql template {quoted_db} --target {shlex.quote(target)} --time-column snapshot -o {sql}")
    ranking = written.references is not None
    print(f"      relsql train {quoted_db} --template {sql} --target {shlex.quote(target)} --time-column snapshot"
          + ("" if written.label_type == "BOOLEAN" or ranking else " --task regression")
          + (" --model model.relsql" if ranking else ""))
    if ranking:
        print(f"      relsql recommend {quoted_db} --model model.relsql --k {written.k or 10} --out recommendations.parquet")
    return 0
