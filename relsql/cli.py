"""`relsql` command line: explain a template's compiled plan, run the embedded demo."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

import relsql
from relsql.errors import RelsqlError


def _explain(args: argparse.Namespace) -> int:
    template = relsql.Template.from_file(args.template)
    started = time.perf_counter()
    with warnings.catch_warnings(), relsql.connect(args.db, read_only=True) as db:
        warnings.simplefilter("ignore")
        net = relsql.compile(template, db)
    print(f"-- grounded and compiled in {time.perf_counter() - started:.2f}s")
    print(net.explain())
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from relsql.catalog import format_catalog

    with relsql.connect(args.db, read_only=True) as db:
        print(format_catalog(db.catalog()))
    return 0


def _template(args: argparse.Namespace) -> int:
    from relsql.template.auto import generate

    with relsql.connect(args.db, read_only=True) as db:
        text = generate(db, args.target, hops=args.hops, width=args.width, aggregation=args.aggregation,
                        time_column=args.time_column, infer_keys=not args.no_infer)
    relsql.Template.from_sql(text)  # what we write must parse
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}: edit it, then `relsql train {args.db} --template {args.output} --target {args.target}`")
    else:
        print(text)
    return 0


def _train(args: argparse.Namespace) -> int:
    with relsql.connect(args.db, memory_limit=args.memory_limit) as db:
        model = relsql.Model(db, args.template, target=args.target, output=args.output, time_column=args.time_column,
                             seed=args.seed, task=args.task, batch_size=args.batch_size)
        model.fit(epochs=args.epochs, lr=args.lr, patience=args.patience, checkpoint=args.checkpoint,
                  resume=args.checkpoint is not None)
        path = model.save(args.model)
        print(model.report())
        print(f"model saved to {path} (metrics plot {path.with_suffix('.png')})")
        if args.predictions:
            rows = model.write_predictions(args.predictions, replace=args.replace)
            print(f"wrote {rows} predictions to table {args.predictions}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    with relsql.connect(args.db) as db:
        model = relsql.Model.load(args.model, db)
        if args.table:
            rows = model.write_predictions(args.table, replace=args.replace)
            print(f"wrote {rows} predictions to table {args.table}")
        else:
            print(model.predict())
    return 0


ROOT = Path(__file__).resolve().parent.parent


def _demo(args: argparse.Namespace) -> int:
    """The embedded default: Mutagenesis (molecule, atom, bond) on DuckDB, trained end to end."""
    sys.path.insert(0, str(ROOT))
    from demos.mutagenesis import load

    started = time.perf_counter()
    db = relsql.connect(args.db) if args.db else relsql.connect()
    counts = load(db.con)
    print(f"Mutagenesis in {db.description}: " + ", ".join(f"{t} {n} rows" for t, n in counts.items()))
    template = ROOT / "sql" / "mutagenesis.sql"
    model = relsql.Model(db, template, target="molecule.mutagenic", seed=args.seed)
    print(f"grounded {template.name} in DuckDB and compiled it in {model.timings['grounding']:.2f}s; the plan:")
    print(model.net.explain())
    model.fit(epochs=args.epochs, lr=args.lr, patience=args.patience)
    print(model.report())
    positive = float(model.y[torch.as_tensor(model.rows["test"])].mean())
    scores = model.evaluate()
    print(f"test accuracy {scores['accuracy']:.3f} (majority class {max(positive, 1 - positive):.3f}), "
          f"ROC-AUC {scores['roc_auc']:.3f}")
    rows = model.write_predictions("mutagenesis_predictions", replace=True)
    print(f"wrote {rows} predictions to table mutagenesis_predictions; total {time.perf_counter() - started:.1f}s")
    if args.model:
        path = model.save(args.model)
        print(f"model saved to {path} (metrics plot {path.with_suffix('.png')})")
    db.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relsql", description="Deep relational learning on a relational database.")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="list tables, columns, keys, foreign keys and row counts")
    inspect.add_argument("db", help="a .duckdb file, a folder of Parquet/CSV, a .sqlite file or a postgresql:// URL")
    inspect.set_defaults(run=_inspect)
    explain = commands.add_parser("explain", help="ground a template and print its compiled plan with sizes")
    explain.add_argument("db", help="a .duckdb file")
    explain.add_argument("--template", required=True, help="a .sql template or a NeuraLogic Datalog file")
    explain.set_defaults(run=_explain)
    template = commands.add_parser("template", help="write an editable SQL template for a target from keys and foreign keys")
    template.add_argument("db", help="a .duckdb file, a folder of Parquet/CSV, a .sqlite file or a postgresql:// URL")
    template.add_argument("--target", required=True, help="table.column to predict")
    template.add_argument("-o", "--output", help="write the template to this file (default: print it)")
    template.add_argument("--hops", type=int, default=2, help="foreign-key hops from the target (default 2)")
    template.add_argument("--width", type=int, default=16, help="hidden width (default 16)")
    template.add_argument("--aggregation", choices=["avg", "sum", "max"], default="avg")
    template.add_argument("--time-column", help="column of the target table: only earlier rows reach a target")
    template.add_argument("--no-infer", action="store_true", help="use declared keys only; do not infer missing ones")
    template.set_defaults(run=_template)
    train = commands.add_parser("train", help="train a template to predict a target column; saves the model")
    train.add_argument("db", help="a database: .duckdb file, folder of Parquet/CSV, .sqlite file or postgresql:// URL")
    train.add_argument("--template", required=True, help="a .sql template or a NeuraLogic Datalog file")
    train.add_argument("--target", required=True, help="table.column to predict")
    train.add_argument("--output", help="the template relation that predicts it (default: the last one)")
    train.add_argument("--task", choices=["binary", "multiclass", "regression"], help="override the detected task")
    train.add_argument("--time-column", help="split by this column of the target table (earliest rows train)")
    train.add_argument("--epochs", type=int, default=100)
    train.add_argument("--lr", type=float, default=0.01)
    train.add_argument("--batch-size", type=int, help="target rows per step, each batch grounded on demand (default: all at once)")
    train.add_argument("--memory-limit", help="cap DuckDB's memory, e.g. 1GB (it spills to disk beyond it)")
    train.add_argument("--checkpoint", help="write a training checkpoint here every epoch; an existing one is resumed")
    train.add_argument("--patience", type=int, default=20, help="epochs without validation improvement before stopping")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--model", default="relsql-model.pt", help="where to save the model (default relsql-model.pt)")
    train.add_argument("--predictions", help="also write predictions to this new table")
    train.add_argument("--replace", action="store_true", help="replace an existing predictions table")
    train.set_defaults(run=_train)
    predict = commands.add_parser("predict", help="predict with a saved model; print or write a new table")
    predict.add_argument("db", help="the database to predict on")
    predict.add_argument("--model", required=True, help="a model saved by `relsql train` or Model.save")
    predict.add_argument("--table", help="write predictions to this new table instead of printing them")
    predict.add_argument("--replace", action="store_true", help="replace an existing table")
    predict.set_defaults(run=_predict)
    demo = commands.add_parser("demo", help="Mutagenesis on the embedded DuckDB: train sql/mutagenesis.sql, write predictions")
    demo.add_argument("--db", help="build the demo database in this .duckdb file instead of memory")
    demo.add_argument("--epochs", type=int, default=400)
    demo.add_argument("--lr", type=float, default=0.01)
    demo.add_argument("--patience", type=int, default=100)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--model", help="also save the trained model here")
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except RelsqlError as err:
        print(f"relsql: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
