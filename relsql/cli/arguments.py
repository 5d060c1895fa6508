"""Argument types and checks of the `relsql` command line: each refuses a bad value before
anything runs, with a message naming the argument (argparse then exits 2)."""

from __future__ import annotations

import argparse
import math
import os
import re
import zipfile
from pathlib import Path

from relsql import arguments as relsql_arguments
from relsql import ownfiles, textfile
from relsql.cli.demo import demo_tables
from relsql.data.engine import check_table_name
from relsql.errors import RelsqlError

EPILOG = ("exit status: 0 done, 1 runtime error (the database, a template's text or a model's contents), "
          "2 usage error (the command line: an argument's value, a missing or unreadable file, an output "
          "folder that does not exist), 130 interrupted. RELSQL_DEBUG=1 shows the traceback of an internal error.")
DB_KINDS = ("a .duckdb file, a folder of Parquet/CSV files, a .sqlite file, a postgresql:// URL, "
            "or a spark:// (master) or sc:// (Spark Connect) URL")
DUCKDB_SUFFIXES = (".duckdb", ".ddb")
MEMORY = re.compile(r"\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*")


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
    """table.column, checked as relsql.Model checks it."""
    try:
        relsql_arguments.target(text)
    except RelsqlError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def table_name(text: str) -> str:
    """A name relsql may give a new table (as relsql.data.duckdb.check_table_name decides)."""
    try:
        return check_table_name(text)
    except RelsqlError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def memory_limit(text: str) -> str:
    if not MEMORY.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must look like 512MB or 2GB, got {text!r}")
    return text


def database(text: str) -> str:
    """An existing database: never create one by accident (a mistyped path would train on nothing)."""
    if text.lower().startswith(("postgresql://", "postgres://", "spark://", "sc://")):
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


def _text_file(text: str, what: str, fix: str) -> Path:
    """An existing, readable file that is UTF-8 text (a binary file is refused before anything runs)."""
    path = _readable_file(text, what)
    try:
        textfile.read_text(path, what)
    except RelsqlError as err:
        raise argparse.ArgumentTypeError(f"{err}; {fix}") from None
    return path


def template_file(text: str) -> str:
    _text_file(text, "template", "pass a .sql template or a NeuraLogic Datalog file")
    return text


KEYS_HELP = ("a SQL file of keys, used instead of declared or inferred ones for the tables it names (read, never run): "
             "ALTER TABLE t ADD PRIMARY KEY (c); ALTER TABLE t ADD FOREIGN KEY (c) REFERENCES p (k); "
             "or lines PRIMARY KEY t(c) / FOREIGN KEY t(c) REFERENCES p(k)")


def keys_file(text: str) -> str:
    """--keys: an existing UTF-8 file of PRIMARY KEY / FOREIGN KEY statements (parsed later, when
    the database's tables are known to check it against)."""
    return str(_text_file(text, "keys file", "pass a .sql file of ALTER TABLE ... ADD PRIMARY KEY / FOREIGN KEY statements"))


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


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b or a.lower().startswith(("postgresql://", "postgres://")):
        return False
    return os.path.realpath(a) == os.path.realpath(b)


TEMPLATE_SHAPERS = ("hops", "width", "aggregation", "layer", "members", "timeless", "no_infer")  # `relsql template`'s own options


def template_beside(model: str) -> Path:
    """Where `relsql train` without --template writes the automatic template: beside the model."""
    return Path(model).with_suffix(".sql")


def _check_train(args: argparse.Namespace, db: str | None) -> str | None:
    for flag, value in (("--model", args.model), ("--checkpoint", args.checkpoint)):
        for other, path in (("the database", db), ("--template", args.template)):
            if _same_file(value, path):
                return f"{flag} {value} is {other} ({path}): it would be overwritten; choose another file"
    if _same_file(args.model, args.checkpoint):
        return f"--model and --checkpoint are the same file ({args.model}); give each its own file"
    refused = _not_owned("--model", args.model, "model", "choose another --model, or move that file away")
    if refused:
        return refused
    if args.search is not None and (args.checkpoint is not None or args.workers > 1):
        return ("--search trains many models in this process, without checkpoints: drop --checkpoint and --workers, "
                "or drop --search")
    if args.search is not None and args.lr is not None:
        return "--search tunes the learning rate itself: drop --lr, or drop --search"
    if args.search is None and args.trials is not None:
        return "--trials bounds a search: give --search BUDGET too (e.g. --search 10m --trials 30)"
    if args.loss is not None and args.task in ("binary", "multiclass"):
        return f"--loss chooses a regression loss; --task {args.task} trains with cross-entropy: drop --loss"
    if args.class_weight is not None and args.task == "regression":
        return "--class-weight weighs classes; --task regression has none: drop --class-weight"
    given = [f"--{n.replace('_', '-')}" for n in TEMPLATE_SHAPERS if getattr(args, n) not in (None, False)]
    if args.template is not None and given:
        return (f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} the automatic template; with --template the "
                f"template file decides: drop {', '.join(given)}, or drop --template to train the automatic one")
    if args.template is None:
        beside = template_beside(args.model)
        if Path(args.model).suffix.lower() == ".sql":
            return (f"--model {args.model}: the automatic template is written beside the model as {beside}, so the "
                    "model cannot be a .sql file; use e.g. model.pt")
        for flag, path in (("the database", db), ("--checkpoint", args.checkpoint)):
            if _same_file(str(beside), path):
                return f"the automatic template {beside} (beside --model) would overwrite {flag}; choose another --model"
        if beside.exists() and not beside.is_file():
            return f"the automatic template {beside} (beside --model) would go onto a folder; choose another --model"
    return None


def _replaceable_file(path: Path, kind: str = "predictions") -> str | None:
    """Why an existing --out file may not be replaced (None: it holds predictions, or
    recommendations, relsql wrote and nobody changed since: its mark, see relsql/ownfiles.py)."""
    refused = ownfiles.refusal(path, kind)
    return None if refused is None else f"--out {refused}"


def _not_owned(flag: str, path: str | Path, kind: str, fix: str) -> str | None:
    """Why `flag`'s file may not be written (an existing file relsql did not write), or None."""
    refused = ownfiles.refusal(path, kind)
    return None if refused is None else f"{flag} {refused}; relsql never replaces a file it did not write: {fix}"


def _check_predict(args: argparse.Namespace, db: str | None, kind: str = "predictions") -> str | None:
    if args.out is None:
        return None
    if args.table is not None:
        return "--out writes a file and --table a table: give one of them"
    for other, path in (("the database", db), ("--model", args.model)):
        if _same_file(args.out, path):
            return f"--out {args.out} is {other} ({path}): it would be overwritten; choose another file"
    if db and Path(db).is_dir() and Path(os.path.realpath(args.out)).is_relative_to(os.path.realpath(db)):
        return (f"--out {args.out} is inside the database folder {db}, where a file is a table: write a table with "
                "--table NAME, or choose a path outside the folder")
    out = Path(args.out)
    if out.exists() and not args.replace:
        return f"--out {args.out} already exists; choose another file, or pass --replace to replace {kind} relsql wrote"
    if out.exists():
        refused = _replaceable_file(out, kind)
        if refused:
            return f"{refused}; relsql replaces only its own {kind}: choose another file"
    return None


def check_together(args: argparse.Namespace) -> str | None:
    """Arguments that are each fine but clash: a message naming them, or None."""
    db = getattr(args, "db", None)
    if args.command == "template" and _same_file(args.output, db):
        return f"-o {args.output} is the database itself: writing the template there would destroy it; choose another file"
    if args.command == "template" and args.output:
        return _not_owned("-o", args.output, "template", "choose another -o file, or move that one away")
    if args.command == "train":
        return _check_train(args, db)
    if args.command in ("predict", "recommend"):
        return _check_predict(args, db, "predictions" if args.command == "predict" else "recommendations")
    if args.command == "demo":
        tables = demo_tables()
        if args.predictions in tables:
            return f"--predictions {args.predictions} is one of the demo's tables ({', '.join(tables)}); choose another name"
        if _same_file(args.model, args.db):
            return f"--model {args.model} is the demo database (--db); choose another file"
        if args.model:
            return _not_owned("--model", args.model, "model", "choose another --model, or move that file away")
    return None


def search_budget(text: str) -> float:
    """--search: a time budget such as 90s, 10m or 1h (or seconds), checked as Model.search checks it."""
    from relsql.train.model.search import budget_seconds

    try:
        return budget_seconds(text)
    except RelsqlError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def aggregation(text: str) -> str:
    """An auto-template's aggregation over child rows: all, avg, sum, max, or a comma list."""
    from relsql.template.auto import aggregation_terms

    try:
        aggregation_terms(text)
    except RelsqlError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


class UsageError(RelsqlError):
    """A command-line value found wrong only once the database is open (a --where naming a column
    the target table lacks): still the command line's fault, so exit 2 like argparse's errors."""


def time_budget(text: str) -> float | str:
    """--time-budget: seconds above 0, or `none` for no limit (kept as the string "none")."""
    if text.strip().lower() == "none":
        return "none"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be seconds above 0 (e.g. 60) or none for no limit, got {text!r}")
    return value


def split_fractions(text: str) -> tuple[float, float, float]:
    """--split: three comma-separated fractions (train, validation, test) summing to 1, e.g. 0.85,0.15,0."""
    parts = [p.strip() for p in text.split(",")]
    try:
        numbers = tuple(float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be three numbers separated by commas (train,validation,test) such as "
                                         f"0.7,0.15,0.15 or 0.85,0.15,0, got {text!r}") from None
    if not all(math.isfinite(n) for n in numbers):
        raise argparse.ArgumentTypeError(f"must be three finite fractions such as 0.85,0.15,0, got {text!r}")
    try:
        return relsql_arguments.split(numbers)
    except RelsqlError as err:
        raise argparse.ArgumentTypeError(f"{err} (e.g. 0.85,0.15,0)") from None


def device(text: str) -> str:
    """--device: cpu, cuda or cuda:N, and only a GPU this machine has (found before anything runs)."""
    import torch

    try:
        found = relsql_arguments.device(text)
    except RelsqlError as err:
        raise argparse.ArgumentTypeError(f"{err}".replace("pass device='cpu'", "use --device cpu")) from None
    if found.type == "cuda" and found.index is not None and found.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text}: this machine has {torch.cuda.device_count()} CUDA GPU(s), numbered from 0; "
                                         "pass --device cuda:0 or --device cpu")
    return text


PREDICTION_SUFFIXES = (".parquet", ".csv")


def predictions_file(text: str) -> str:
    """--out: a new .parquet or .csv file in a folder that exists (an existing one needs --replace)."""
    if Path(text).suffix.lower() not in PREDICTION_SUFFIXES:
        raise argparse.ArgumentTypeError(f"must end in .parquet or .csv (the format is read from it), got {text!r}")
    return output_file(text)


def where_condition(text: str) -> str:
    """--where: one SQL condition; what parsing alone can refuse (statements, subqueries, other
    tables) is refused here, the columns once the target table is known."""
    from relsql.where import parse_condition

    try:
        parse_condition(text)
    except RelsqlError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text
