"""`relsql explain-prediction`: why a saved model predicts what it does for some rows, printed or
written as new tables (the per-row attributions, and their summary by column and relation)."""

from __future__ import annotations

import argparse
from pathlib import Path

import relsql
from relsql.cli.arguments import (
    DB_KINDS,
    UsageError,
    database,
    device,
    model_file,
    positive_int,
    table_name,
    where_condition,
)
from relsql.errors import RelsqlError

HELP = "explain a saved model's predictions: which rows and columns of which tables moved each one"


def add_parser(commands, epilog: str) -> argparse.ArgumentParser:
    """Register `relsql explain-prediction` on the `relsql` subcommands (`commands`, from add_subparsers)."""
    parser = commands.add_parser("explain-prediction", help=HELP, description=HELP, epilog=epilog)
    parser.add_argument("db", type=database, help=f"the database the rows are in: {DB_KINDS}")
    parser.add_argument("--model", required=True, type=model_file, help="a model saved by `relsql train` or Model.save")
    parser.add_argument("--where", type=where_condition, metavar="CONDITION",
                        help="explain only the target table's rows satisfying this SQL condition on its columns "
                             "(default: every row)")
    parser.add_argument("--table", type=table_name,
                        help="write the attributions to this new table instead of printing them")
    parser.add_argument("--summary-table", type=table_name,
                        help="also write the summary (mean |attribution| by table.column and by relation) to this new table")
    parser.add_argument("--replace", action="store_true",
                        help="replace existing tables of explanations relsql wrote (never data)")
    parser.add_argument("--per", choices=["column", "row"], default="column",
                        help="one attribution per input column (default) or per input row")
    parser.add_argument("--steps", type=positive_int,
                        help="integration points (Gauss-Legendre; default: as many as completeness to 1e-6 needs)")
    parser.add_argument("--unit", type=int, metavar="K",
                        help="a multi-class target: explain class K's score (K counts the classes from 0, in the order of "
                             "predict's probabilities; default: each row's predicted class)")
    parser.add_argument("--batch-size", type=positive_int,
                        help="load the model in mini-batches of this many target rows, grounded on demand "
                             "(a model trained with batch_size= or database-stored embeddings)")
    parser.add_argument("--plot", type=plot_file, metavar="FILE.png",
                        help="also draw the summary as bars to this new .png (needs matplotlib)")
    parser.add_argument("--device", type=device, default="cpu", help="where the model is loaded (explained on the CPU)")
    parser.add_argument("--threads", type=positive_int, help="threads for DuckDB and torch")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Model.load, then Model.explain and relsql.explain_summary, as a user of the API would."""
    with relsql.connect(args.db, threads=args.threads) as db:
        for flag, name in (("--table", args.table), ("--summary-table", args.summary_table)):
            if name:  # refused before any work: a read-only source, a user's table, a table without --replace
                db.replaceable(name, args.replace, "explanations", how="--replace", other=f"another {flag} name")
        if args.table and args.summary_table and args.table.casefold() == args.summary_table.casefold():
            raise RelsqlError("--table and --summary-table name the same table; choose two names")
        model = relsql.Model.load(args.model, db, device=args.device, batch_size=args.batch_size)
        model.threads = args.threads
        try:
            explanation = model.explain(where=args.where, steps=args.steps, per=args.per, unit=args.unit)
        except relsql.WhereError as err:
            raise UsageError(f"--where: {err}") from None
        summary = relsql.explain_summary(explanation, model)
        if args.table:
            relsql.write_explanation(db, args.table, explanation, replace=args.replace)
            print(f"wrote {explanation.height} attributions to table {args.table}")
        else:
            print(explanation)
        if args.summary_table:
            relsql.write_explanation(db, args.summary_table, summary, replace=args.replace)
            print(f"wrote the summary ({summary.height} rows) to table {args.summary_table}")
        else:
            print(summary)
        if args.plot:
            from relsql.explain import plot_summary

            print(f"wrote {plot_summary(summary, args.plot, title=f'why {model.target}')}")
    return 0


def plot_file(text: str) -> str:
    """A new .png path in an existing folder (a file there is never replaced)."""
    path = Path(text)
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"must end in .png, got {text!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(path.parent)!r} does not exist")
    if path.exists():
        raise argparse.ArgumentTypeError(f"{text} already exists; choose a new file")
    return text
