"""`relsql` command line: inspect a database, write a template, train, predict, explain, demo.

Exit codes (the same for every command):

- 0: done.
- 1: a runtime error: something found while running, in the database (a missing table or
  column, a table that already exists), in a template's text or in a model file's contents.
  One line ``relsql: <message>`` on stderr. An unexpected failure prints one line
  ``relsql: internal error: ...`` and also exits 1 (RELSQL_DEBUG=1 shows its traceback).
- 2: a usage error: the command line itself is wrong, found before anything runs: an unknown
  or missing argument, a value of the wrong type or range (--epochs, --lr, --hops, ...), a
  target not written table.column, a file that does not exist or cannot be read, an output
  path whose folder does not exist or that is a folder, two arguments naming the same file.
- 130: interrupted (Ctrl-C). Output piped into a reader that quits early (`| head`) ends quietly with 1.

No traceback reaches the terminal; a user's table is never replaced without --replace, and
`--replace` only replaces a table of predictions (one with a `prediction` column).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
import warnings
import zipfile
from pathlib import Path

import sqlglot.expressions as exp
import torch

import relsql
from relsql.errors import RelsqlError

EPILOG = ("exit status: 0 done, 1 runtime error (the database, a template's text or a model's contents), "
          "2 usage error (the command line: an argument's value, a missing or unreadable file, an output "
          "folder that does not exist), 130 interrupted. RELSQL_DEBUG=1 shows the traceback of an internal error.")
DB_KINDS = "a .duckdb file, a folder of Parquet/CSV files, a .sqlite file or a postgresql:// URL"
DUCKDB_SUFFIXES = (".duckdb", ".ddb")
MEMORY = re.compile(r"\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*")
TEMP_PREFIX = "__relsql_"


# -- argument types: each raises ArgumentTypeError, so argparse names the argument and exits 2 ----------------
def _int(text: str, least: int, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be a whole number {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int(text, 1, "of at least 1")


def non_negative_int(text: str) -> int:
    return _int(text, 0, "of at least 0")


def seed(text: str) -> int:
    value = _int(text, 0, f"from 0 to {2**32 - 1}")
    if value >= 2**32:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {2**32 - 1}, got {value}")
    return value


def learning_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0 such as 0.01, got {text!r}")
    return value


def target(text: str) -> str:
    parts = text.split(".")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"must be written table.column (one dot), e.g. customer.churned; got {text!r}")
    return text


def table_name(text: str) -> str:
    if not text.strip() or text.startswith(TEMP_PREFIX):
        raise argparse.ArgumentTypeError(f"must be a table name, not empty and not starting with {TEMP_PREFIX}; "
                                         f"got {text!r}")
    return text


def memory_limit(text: str) -> str:
    if not MEMORY.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must look like 512MB or 2GB, got {text!r}")
    return text


def database(text: str) -> str:
    """An existing database: never create one by accident (a mistyped path would train on nothing)."""
    if text.lower().startswith(("postgresql://", "postgres://")):
        return text
    path = Path(text)
    if not text or not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist; pass {DB_KINDS}")
    if not (path.is_file() or path.is_dir()):
        raise argparse.ArgumentTypeError(f"{text} is neither a file nor a folder; pass {DB_KINDS}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} cannot be read (permission denied); check its permissions")
    return text


def _readable_file(text: str, what: str) -> Path:
    path = Path(text)
    if not text or not path.exists():
        raise argparse.ArgumentTypeError(f"{what} {text!r} does not exist; check the path")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; pass the {what} file inside it")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a regular file; pass a {what} file")
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot read {what} {text}: {err.strerror}; check its permissions") from None
    return path


def template_file(text: str) -> str:
    path = _readable_file(text, "template")
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise argparse.ArgumentTypeError(f"{text} is not a text file (not UTF-8 at byte {err.start}); pass a .sql "
                                         "template or a NeuraLogic Datalog file") from None
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot read template {text}: {err.strerror}") from None
    return text


def _torch_file(path: Path, what: str, fix: str) -> None:
    """Files written by torch.save (models, checkpoints) are zip archives: anything else is refused unread."""
    if not zipfile.is_zipfile(path):
        raise argparse.ArgumentTypeError(f"{path} is not a relsql {what}; {fix}")


def model_file(text: str) -> str:
    path = _readable_file(text, "model")
    _torch_file(path, "model file", "pass a model saved by `relsql train --model FILE`")
    return text


def output_file(text: str) -> str:
    """A file to write: its folder exists and is writable, and it is not itself a folder."""
    path = Path(text)
    if not text or text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"must be a file name, got {text!r}")
    folder = path.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"the folder of {text}, {folder}, does not exist; create it first or "
                                         "choose another path")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; pass a file name, e.g. {path / 'out'}")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a regular file; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied; choose a path you can write")
    return text


def model_output(text: str) -> str:
    """Where a model goes; its metrics plot is written beside it with the suffix .png."""
    output_file(text)
    path = Path(text)
    if path.suffix.lower() == ".png":
        raise argparse.ArgumentTypeError(f"{text}: the metrics plot is written beside the model as .png, so the model "
                                         "cannot be a .png file; use e.g. model.pt")
    plot = path.with_suffix(".png")
    if plot.exists() and not plot.is_file():
        raise argparse.ArgumentTypeError(f"the metrics plot {plot} of {text} would go onto a folder; choose another "
                                         "model path")
    return text


def checkpoint_file(text: str) -> str:
    output_file(text)
    if Path(text).exists():
        _torch_file(Path(text), "training checkpoint", "pass a new path or a checkpoint written by `relsql train "
                    "--checkpoint FILE`")
    return text


def demo_database(text: str) -> str:
    path = Path(text)
    if path.suffix.lower() not in DUCKDB_SUFFIXES:
        raise argparse.ArgumentTypeError(f"must be a DuckDB file ending in .duckdb, got {text!r}")
    output_file(text)
    if path.exists():
        try:
            with path.open("rb") as handle:
                head = handle.read(16)
        except OSError as err:
            raise argparse.ArgumentTypeError(f"cannot read {text}: {err.strerror}") from None
        if head and head[8:12] != b"DUCK":
            raise argparse.ArgumentTypeError(f"{text} exists and is not a DuckDB database; pass a new .duckdb file")
    return text


ROOT = Path(__file__).resolve().parent.parent


def _mutagenesis():
    """The demo's data module, `demos.mutagenesis`, from the repository beside the package."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import demos.mutagenesis

    return demos.mutagenesis


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b or a.lower().startswith(("postgresql://", "postgres://")):
        return False
    return os.path.realpath(a) == os.path.realpath(b)


def _check_together(args: argparse.Namespace) -> str | None:
    """Arguments that are each fine but clash: a message naming them, or None."""
    db = getattr(args, "db", None)
    if args.command == "template" and _same_file(args.output, db):
        return f"-o {args.output} is the database itself: writing the template there would destroy it; choose another file"
    if args.command == "train":
        for flag, value in (("--model", args.model), ("--checkpoint", args.checkpoint)):
            for other, path in (("the database", db), ("--template", args.template)):
                if _same_file(value, path):
                    return f"{flag} {value} is {other} ({path}): it would be overwritten; choose another file"
        if _same_file(args.model, args.checkpoint):
            return f"--model and --checkpoint are the same file ({args.model}); give each its own file"
    if args.command == "demo":
        tables = _mutagenesis().TABLES
        if args.predictions in tables:
            return f"--predictions {args.predictions} is one of the demo's tables ({', '.join(tables)}); choose another name"
        if _same_file(args.model, args.db):
            return f"--model {args.model} is the demo database (--db); choose another file"
    return None


# -- commands ----------------------------------------------------------------------------------------------------
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
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as err:
            raise RelsqlError(f"cannot write the template to {args.output} (-o): {err.strerror}; choose another file") from None
        print(f"wrote {args.output}: edit it, then `relsql train {args.db} --template {args.output} --target {args.target}`")
    else:
        print(text)
    return 0


def _writable_table(db: relsql.Database, name: str, replace: bool, flag: str) -> None:
    """Refuse, before any work, a predictions table that exists without --replace, or that is not a table
    of predictions (a user's data is never replaced)."""
    if not db.has_table(name):
        return
    if not replace:
        raise RelsqlError(f"table `{name}` already exists in {db.description}; choose another {flag} name, or pass "
                          "--replace to replace it")
    if "prediction" not in [column for column, _ in db.columns(name)]:
        raise RelsqlError(f"table `{name}` in {db.description} is not a table of predictions (it has no `prediction` "
                          f"column), so --replace does not replace it; choose another {flag} name")


def _train(args: argparse.Namespace) -> int:
    with relsql.connect(args.db, memory_limit=args.memory_limit) as db:
        if args.predictions:
            _writable_table(db, args.predictions, args.replace, "--predictions")
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
        if args.table:
            _writable_table(db, args.table, args.replace, "--table")
        model = relsql.Model.load(args.model, db)
        if args.table:
            rows = model.write_predictions(args.table, replace=args.replace)
            print(f"wrote {rows} predictions to table {args.table}")
        else:
            print(model.predict())
    return 0


def _holds_demo_data(db: relsql.Database, table: str, parquet: Path) -> bool:
    """Whether `table` has exactly the columns and rows (as a multiset) of the demo's Parquet file."""
    import duckdb

    try:
        columns = [c for c, _ in db.columns(table)]
        shipped = [d[0] for d in db.con.execute("SELECT * FROM read_parquet(?) LIMIT 0", [str(parquet)]).description]
        if columns != shipped:
            return False
        differ = db.con.execute(
            f'SELECT count(*) FROM ((FROM "{table}" EXCEPT ALL FROM read_parquet($1)) '
            f'UNION ALL (FROM read_parquet($1) EXCEPT ALL FROM "{table}"))', [str(parquet)]).fetchone()[0]
    except (duckdb.Error, RelsqlError):
        return False
    return differ == 0


def _demo_tables(db: relsql.Database, path: str) -> dict[str, int] | None:
    """None when the demo's tables are to be loaded; their row counts when `path` already holds them with
    exactly the demo's data (reused, never modified); a RelsqlError when it holds other tables of those names."""
    data, tables = _mutagenesis().DATA, _mutagenesis().TABLES
    present = [t for t in tables if db.has_table(t)]
    if not present:
        return None
    if len(present) == len(tables) and all(_holds_demo_data(db, t, data / f"{t}.parquet") for t in tables):
        return {t: db.arrow(exp.select(exp.Count(this=exp.Star())).from_(exp.Table(this=exp.to_identifier(t, quoted=True))))
                .column(0)[0].as_py() for t in tables}
    raise RelsqlError(f"{path} (--db) already has table(s) {', '.join(present)} that are not the Mutagenesis demo's "
                      "data; the demo never modifies your tables: pass --db with a new .duckdb file")


def _demo(args: argparse.Namespace) -> int:
    """The embedded default: Mutagenesis (molecule, atom, bond) on DuckDB, trained end to end."""
    load = _mutagenesis().load
    started = time.perf_counter()
    db = relsql.connect(args.db) if args.db else relsql.connect()
    try:
        if db.has_table(args.predictions):
            raise RelsqlError(f"table `{args.predictions}` already exists in {args.db}; the demo never replaces a "
                              "table: pass --predictions another_name, or drop that table")
        counts = _demo_tables(db, args.db) if args.db else None
        if counts is None:
            counts = load(db.con)
            print(f"Mutagenesis in {db.description}: " + ", ".join(f"{t} {n} rows" for t, n in counts.items()))
        else:
            print(f"Mutagenesis already in {db.description}, used as it is: "
                  + ", ".join(f"{t} {n} rows" for t, n in counts.items()))
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
        rows = model.write_predictions(args.predictions)
        print(f"wrote {rows} predictions to table {args.predictions}; total {time.perf_counter() - started:.1f}s")
        if args.model:
            path = model.save(args.model)
            print(f"model saved to {path} (metrics plot {path.with_suffix('.png')})")
    finally:
        db.close()
    return 0


# -- the parser --------------------------------------------------------------------------------------------------
def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="relsql", description="Deep relational learning on a relational database.",
                                     epilog=EPILOG)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help, epilog=EPILOG)

    inspect = command("inspect", "list tables, columns, keys, foreign keys and row counts")
    inspect.add_argument("db", type=database, help=DB_KINDS)
    inspect.set_defaults(run=_inspect)
    explain = command("explain", "ground a template and print its compiled plan with sizes")
    explain.add_argument("db", type=database, help=DB_KINDS)
    explain.add_argument("--template", required=True, type=template_file,
                         help="a .sql template or a NeuraLogic Datalog file")
    explain.set_defaults(run=_explain)
    template = command("template", "write an editable SQL template for a target from keys and foreign keys")
    template.add_argument("db", type=database, help=DB_KINDS)
    template.add_argument("--target", required=True, type=target, help="table.column to predict")
    template.add_argument("-o", "--output", type=output_file, help="write the template to this file (default: print it)")
    template.add_argument("--hops", type=non_negative_int, default=2, help="foreign-key hops from the target (default 2)")
    template.add_argument("--width", type=positive_int, default=16, help="hidden width (default 16)")
    template.add_argument("--aggregation", choices=["avg", "sum", "max"], default="avg")
    template.add_argument("--time-column", help="column of the target table: only earlier rows reach a target")
    template.add_argument("--no-infer", action="store_true", help="use declared keys only; do not infer missing ones")
    template.set_defaults(run=_template)
    train = command("train", "train a template to predict a target column; saves the model")
    train.add_argument("db", type=database, help=DB_KINDS)
    train.add_argument("--template", required=True, type=template_file,
                       help="a .sql template or a NeuraLogic Datalog file")
    train.add_argument("--target", required=True, type=target, help="table.column to predict")
    train.add_argument("--output", help="the template relation that predicts it (default: the last one)")
    train.add_argument("--task", choices=["binary", "multiclass", "regression"], help="override the detected task")
    train.add_argument("--time-column", help="split by this column of the target table (earliest rows train)")
    train.add_argument("--epochs", type=positive_int, default=100, help="at most this many epochs (default 100)")
    train.add_argument("--lr", type=learning_rate, default=0.01, help="learning rate (default 0.01)")
    train.add_argument("--batch-size", type=positive_int,
                       help="target rows per step, each batch grounded on demand (default: all at once)")
    train.add_argument("--memory-limit", type=memory_limit,
                       help="cap DuckDB's memory, e.g. 1GB (it spills to disk beyond it)")
    train.add_argument("--checkpoint", type=checkpoint_file,
                       help="write a training checkpoint here every epoch; an existing one is resumed")
    train.add_argument("--patience", type=positive_int, default=20,
                       help="epochs without validation improvement before stopping (default 20)")
    train.add_argument("--seed", type=seed, default=0)
    train.add_argument("--model", type=model_output, default="relsql-model.pt",
                       help="where to save the model (default relsql-model.pt); its folder must exist")
    train.add_argument("--predictions", type=table_name, help="also write predictions to this new table")
    train.add_argument("--replace", action="store_true", help="replace an existing table of predictions (never a table of data)")
    train.set_defaults(run=_train)
    predict = command("predict", "predict with a saved model; print or write a new table")
    predict.add_argument("db", type=database, help="the database to predict on: " + DB_KINDS)
    predict.add_argument("--model", required=True, type=model_file, help="a model saved by `relsql train` or Model.save")
    predict.add_argument("--table", type=table_name, help="write predictions to this new table instead of printing them")
    predict.add_argument("--replace", action="store_true", help="replace an existing table of predictions")
    predict.set_defaults(run=_predict)
    demo = command("demo", "Mutagenesis on the embedded DuckDB: train sql/mutagenesis.sql, write predictions")
    demo.add_argument("--db", type=demo_database,
                      help="build the demo database in this .duckdb file instead of memory (its folder must exist)")
    demo.add_argument("--epochs", type=positive_int, default=400)
    demo.add_argument("--lr", type=learning_rate, default=0.01)
    demo.add_argument("--patience", type=positive_int, default=100)
    demo.add_argument("--seed", type=seed, default=0)
    demo.add_argument("--model", type=model_output, help="also save the trained model here")
    demo.add_argument("--predictions", type=table_name, default="mutagenesis_predictions",
                      help="write the predictions to this new table (default mutagenesis_predictions); an existing "
                           "table is never replaced")
    demo.set_defaults(run=_demo)
    return parser, commands.choices


def _debug() -> bool:
    return os.environ.get("RELSQL_DEBUG", "").strip() not in ("", "0")


def _run(argv: list[str] | None) -> int:
    parser, subparsers = _parser()
    try:
        args = parser.parse_args(argv)
        clash = _check_together(args)
        if clash:
            subparsers[args.command].error(clash)
    except SystemExit as done:  # argparse: --help (0) or a usage error (2), already printed
        return done.code if isinstance(done.code, int) else 2
    try:
        return args.run(args)
    except RelsqlError as err:
        print(f"relsql: {err}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, 1, 2 or 130, see the module docstring), never raises."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("relsql: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `relsql ... | head`: the reader left; say nothing more
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except Exception as err:
        if _debug():
            raise
        message = " ".join(str(err).split())[:500] or "(no message)"
        print(f"relsql: internal error: {type(err).__name__}: {message} "
              "(please report it; run with RELSQL_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
