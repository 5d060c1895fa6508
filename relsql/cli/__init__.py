"""`relsql` command line: inspect a database, write a template, train, predict, recommend, explain, demo.

Exit codes (the same for every command):

- 0: done.
- 1: a runtime error: something found while running, in the database (a missing table or
  column, a table that already exists), in a template's text or in a model file's contents.
  One line ``relsql: <message>`` on stderr. An unexpected failure prints one line
  ``relsql: internal error: ...`` and also exits 1 (RELSQL_DEBUG=1 shows its traceback).
- 2: a usage error: the command line itself is wrong, found before anything runs (or, for a
  --where naming a column the target table lacks, once the database is open): an unknown
  or missing argument, a value of the wrong type or range (--epochs, --lr, --hops, ...), a
  target not written table.column, a file that does not exist or cannot be read, an output
  path whose folder does not exist or that is a folder, two arguments naming the same file.
- 130: interrupted (Ctrl-C). Output piped into a reader that quits early (`| head`) ends quietly with 1.

No traceback reaches the terminal; a user's table is never replaced without --replace, and
`--replace` only replaces a table of predictions that relsql wrote (it bears relsql's mark).
Files likewise: a model, its plot, a template or an --out file replaces only a file of that kind
relsql wrote and nobody changed since (relsql/ownfiles.py), never a user's, even with --replace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import relsql
from relsql import ownfiles
from relsql.cli import demo as demo_command
from relsql.cli import explaining as explain_command
from relsql.cli import output as outputs
from relsql.cli import task as task_command
from relsql.cli.arguments import (
    DB_KINDS,
    EPILOG,
    KEYS_HELP,
    UsageError,
    aggregation,
    check_together,
    checkpoint_file,
    database,
    demo_database,
    device,
    keys_file,
    learning_rate,
    memory_limit,
    model_file,
    model_output,
    non_negative_int,
    output_file,
    positive_int,
    predictions_file,
    search_budget,
    seed,
    split_fractions,
    table_name,
    target,
    template_beside,
    template_file,
    time_budget,
    where_condition,
)
from relsql.errors import RelsqlError
from relsql.progress import lines as progress_lines


# -- commands ----------------------------------------------------------------------------------------------------
def _explain(args: argparse.Namespace) -> int:
    template = relsql.Template.from_file(args.template)
    if args.output is not None and args.output not in template.relations:
        raise RelsqlError(f"--output `{args.output}` is not a relation of the template; it declares {list(template.relations)}")
    started = time.perf_counter()
    with warnings.catch_warnings(), relsql.connect(args.db, read_only=True) as db:
        warnings.simplefilter("ignore")
        if args.batch_size is None:
            net = relsql.compile(template, db, max_groundings=args.max_groundings)
            print(f"-- grounded and compiled in {time.perf_counter() - started:.2f}s")
            print(net.explain())
            return 0
        from relsql.compile import make_plan
        from relsql.compile.explain import explain
        from relsql.ground.demand import BatchGrounder
        from relsql.ground.store import GroundingStore
        from relsql.train.feed.batched import PASSES

        output = args.output or template.output
        grounder = BatchGrounder(template, db, output, max_groundings=args.max_groundings)
        store = GroundingStore.open(grounder)
        print(f"-- key tables and grounding store of `{output}` built in {time.perf_counter() - started:.2f}s")
        print(store.describe(args.batch_size))
        rows = grounder.sizes[output]
        batch = store.ground(np.random.default_rng(0).choice(rows, min(args.batch_size, rows), replace=False))
        print(f"-- the plan of one batch of {min(args.batch_size, rows):,} rows")
        print(explain(make_plan(template, batch, torch.float32, PASSES, outputs=[output])))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from relsql.cli.output import format_catalog
    from relsql.data.keys import schema

    with relsql.connect(args.db, read_only=True, keys=args.keys) as db:
        catalog = db.catalog()
        print(format_catalog(catalog, schema(db, catalog, infer=not args.no_infer)))
    return 0


def _generate(db: relsql.Database, args: argparse.Namespace) -> str:
    """The automatic template's text from `relsql template`'s options (given ones only; generate's
    defaults otherwise), checked to parse."""
    from relsql.template.auto import generate

    given = {"hops": args.hops, "width": args.width, "aggregation": args.aggregation, "layer": args.layer,
             "members": args.members, "timeless": args.timeless, "time_column": args.time_column}
    options = {k: v for k, v in given.items() if v is not None}
    text = generate(db, args.target, infer_keys=not args.no_infer, **options)
    relsql.Template.from_sql(text)  # what we write must parse
    return text


def _command(*words: object) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


def _template(args: argparse.Namespace) -> int:
    with relsql.connect(args.db, read_only=True, keys=args.keys) as db:
        text = _generate(db, args)
    if args.output:
        outputs.write_text_atomically(Path(args.output), text, "choose another -o file, or move that one away")
        print(f"wrote {args.output}: edit it, then `{_next_train(args)}`")
    else:
        print(text)
    return 0


def _next_train(args: argparse.Namespace) -> str:
    """`relsql train` on the template `relsql template -o` wrote, with the options training needs
    to see the same data: --time-column (the split, and only earlier rows) and --keys."""
    carried = []
    for flag, value in (("--time-column", args.time_column), ("--keys", args.keys)):
        if value is not None:
            carried += [flag, value]
    return _command("relsql", "train", args.db, "--template", args.output, "--target", args.target, *carried)


def _writable_table(db: relsql.Database, name: str, replace: bool, flag: str) -> None:
    """Refuse, before any work, a table that exists without --replace, or that is not a table of
    predictions relsql wrote (its mark, see Database.replaceable): a user's data is never replaced."""
    db.replaceable(name, replace, "predictions", how="--replace", other=f"another {flag} name")


def _fit_options(args: argparse.Namespace) -> dict:
    """fit()'s keyword arguments the user gave (fit's own defaults for the rest, see Model.fit)."""
    given = {"epochs": args.epochs, "lr": args.lr, "patience": args.patience, "steps_per_epoch": args.steps_per_epoch,
             "loss": args.loss,
             "class_weight": args.class_weight, "negatives": args.negatives, "hard_negatives": args.hard_negatives}
    options = {k: v for k, v in given.items() if v is not None}
    if args.time_budget is not None:
        options["time_budget"] = None if args.time_budget == "none" else args.time_budget
    if args.schedule is not None:
        options["schedule"] = None if args.schedule == "none" else args.schedule
    if args.refit is not None:
        options["refit"] = args.refit
    if args.overfit is not None:
        options["overfit"] = args.overfit
    if args.no_hybrid:
        options["hybrid"] = False
    return options


def _automatic(db: relsql.Database, args: argparse.Namespace) -> tuple[relsql.Template, Path]:
    """`relsql train` without --template: the automatic template and the file beside the model it
    goes to. An existing different file there (perhaps an edited template) is refused before training."""
    text = _generate(db, args)
    beside = template_beside(args.model)
    try:
        differs = beside.exists() and beside.read_bytes() != text.encode("utf-8")
    except OSError as err:
        raise RelsqlError(f"cannot read {beside} (where the automatic template beside --model {args.model} goes): "
                          f"{err.strerror or err}; choose another --model") from None
    if differs:
        raise RelsqlError(f"{beside} (where the automatic template beside --model {args.model} goes) already exists and "
                          f"differs from the template generated now: train on it with --template {beside}, or move it "
                          "away, or choose another --model")
    return relsql.Template.from_sql(text), beside


SCORED = {"predict": "predictions", "recommend": "recommendations"}  # a scoring command (Model.answers): what it writes


def _train(args: argparse.Namespace) -> int:
    with relsql.connect(args.db, memory_limit=args.memory_limit, keys=args.keys, threads=args.threads) as db:
        if args.predictions:
            _writable_table(db, args.predictions, args.replace, "--predictions")
        template, beside = (args.template, None) if args.template is not None else _automatic(db, args)
        model = relsql.Model(db, template, target=args.target, output=args.output, time_column=args.time_column,
                             seed=args.seed, task=args.task, batch_size=args.batch_size, threads=args.threads,
                             allow_target_inputs=args.allow_target_inputs, max_groundings=args.max_groundings,
                             candidates=args.candidates, pairs=args.pairs,
                             **({"split": args.split} if args.split is not None else {}), device=args.device)
        _plot_beside(args.model, model)
        options = _fit_options(args)
        if args.search is not None:
            from relsql.train.model import search

            model.search(args.search, args.trials, **options)
        else:
            model.fit(**options, checkpoint=args.checkpoint, resume=args.checkpoint is not None, workers=args.workers)
        path = model.save(args.model)
        print(model.report())
        if args.search is not None:
            print(search.summary(model.trials))
        plotted = f" (metrics plot {path.with_suffix('.png')})" if model.task.plots_history else ""  # a ranking's has none
        print(f"model saved to {path}{plotted}")
        if beside is not None:
            kept = model.spec.template  # the own-columns part where the network alone kept it (model.report says so)
            outputs.write_text_atomically(beside, kept.source)
            which = "automatic template" if kept.source == template.source else \
                "the automatic template's own-columns part, the one the network kept,"
            print(f"{which} saved to {beside}: edit it, then `"
                  + _command("relsql", "train", args.db, "--template", beside, "--target", args.target,
                             *_carried(args), "--model", args.model) + "`")
        verb = model.answers  # the command scoring this model: predict or recommend
        named = SCORED[verb]
        if args.predictions:
            write = model.write_predictions if verb == "predict" else model.write_recommendations
            rows = write(args.predictions, replace=args.replace)
            print(f"wrote {rows} {named} to table {args.predictions}")
        print(f"{verb}: `" + _command("relsql", verb, args.db, "--model", path, "--out", f"{named}.parquet") + "`")
    return 0


def _plot_beside(path: str, model: relsql.Model) -> None:
    """Refuse, before training, a file relsql did not write where the metrics plot goes (Model.save
    plots beside it the model of a task that plots its history, task.plots_history): it would be refused after training."""
    plot = Path(path).with_suffix(".png")
    if model.task.plots_history:
        ownfiles.check(plot, "metrics plot", f"choose another --model (its plot goes beside it as {plot.name}), or "
                       "move that file away")


def _carried(args: argparse.Namespace) -> list[str]:
    """What a printed `relsql train --template` next step repeats: the options that shaped the
    data the template sees (--time-column, --keys) and the split (--split, --seed, --task)."""
    carried = [w for flag in ("--time-column", "--keys") for w in _flag(args, flag)]
    for flag in ("--split", "--seed", "--task"):
        carried += _flag(args, flag)
    return carried


def _flag(args: argparse.Namespace, flag: str) -> list[str]:
    value = getattr(args, flag[2:].replace("-", "_"), None)
    if value is None or (flag == "--seed" and value == 0):
        return []
    if flag == "--split":
        value = ",".join(f"{v:g}" for v in value)
    return [flag, str(value)]


def _predict(args: argparse.Namespace) -> int:
    """`relsql predict`: Model.load, then Model.predict / write_predictions as a user of the API
    would (--where: only the rows asked for are grounded, relsql/train/learner/loaded.py)."""
    with relsql.connect(args.db, threads=args.threads) as db:
        if args.table:
            _writable_table(db, args.table, args.replace, "--table")
        model = relsql.Model.load(args.model, db, batch_size=args.batch_size, device=args.device)
        if model.answers != "predict":
            raise RelsqlError(f"{args.model} ranks candidates for {model.target} (a {model.task.kind} model): "
                              f"use `relsql {model.answers}`")
        model.threads = args.threads
        with _where_is_usage():
            if args.table:
                rows = model.write_predictions(args.table, where=args.where, replace=args.replace)
                print(f"wrote {rows} predictions to table {args.table}")
                return 0
            frame = model.predict(where=args.where)
        if args.out:
            outputs.write_predictions(frame, Path(args.out), args.replace)
            print(outputs.summary(frame, model.task, args.out, args.where))
        else:
            print(frame)
    return 0


def _recommend(args: argparse.Namespace) -> int:
    """`relsql recommend`: Model.load, then Model.recommend / write_recommendations."""
    with relsql.connect(args.db, threads=args.threads) as db:
        if args.table:
            db.replaceable(args.table, args.replace, "recommendations", how="--replace", other="another --table name")
        model = relsql.Model.load(args.model, db, device=args.device)
        if model.answers != "recommend":
            raise RelsqlError(f"{args.model} predicts {model.target} ({model.task.kind}), a value per row: "
                              f"use `relsql {model.answers}`")
        model.threads = args.threads
        with _where_is_usage():
            if args.table:
                rows = model.write_recommendations(args.table, args.k, where=args.where, replace=args.replace)
                print(f"wrote {rows} recommendations to table {args.table}")
                return 0
            frame = model.recommend(args.k, where=args.where)
        if args.out:
            outputs.write_predictions(frame, Path(args.out), args.replace, kind="recommendations")
            print(f"wrote {frame.height:,} recommendations (top {args.k} per row) to {args.out}; "
                  f"columns: {', '.join(frame.columns)}")
            if not frame.height:
                print("note: no row matched: by default the rows whose target is NULL are ranked; choose others with --where")
        else:
            print(frame)
    return 0


@contextlib.contextmanager
def _where_is_usage():
    """A --where condition the target table refuses (a column it lacks) is the command line's fault: exit 2."""
    try:
        yield
    except relsql.WhereError as err:
        raise UsageError(f"--where: {err}") from None


# -- the parser --------------------------------------------------------------------------------------------------
def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="relsql", description="Deep relational learning on a relational database.",
                                     epilog=EPILOG)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help, epilog=EPILOG)

    inspect = command("inspect", "list tables, columns, keys, foreign keys and row counts")
    inspect.add_argument("db", type=database, help=DB_KINDS)
    inspect.add_argument("--keys", type=keys_file, help=KEYS_HELP)
    inspect.add_argument("--no-infer", action="store_true", help="show declared and given keys only; infer none")
    inspect.set_defaults(run=_inspect)
    explain = command("explain", "ground a template and print its compiled plan with sizes")
    explain.add_argument("db", type=database, help=DB_KINDS)
    explain.add_argument("--template", required=True, type=template_file,
                         help="a .sql template or a NeuraLogic Datalog file")
    explain.add_argument("--batch-size", type=positive_int,
                         help="show the grounding store mini-batches of this many output rows read from, and one batch's plan")
    explain.add_argument("--output", help="the output relation the batches are of (default: the template's last relation)")
    explain.add_argument("--max-groundings", type=positive_int, help=MAX_GROUNDINGS_HELP)
    explain.set_defaults(run=_explain)
    template = command("template", "write an editable SQL template for a target from keys and foreign keys")
    template.add_argument("db", type=database, help=DB_KINDS)
    template.add_argument("--target", required=True, type=target, help="table.column to predict")
    template.add_argument("-o", "--output", type=output_file, help="write the template to this file (default: print it)")
    _template_options(template)
    template.add_argument("--time-column", help="column of the target table: only earlier rows reach a target")
    template.add_argument("--keys", type=keys_file, help=KEYS_HELP)
    template.set_defaults(run=_template)
    train = command("train", "train a template to predict a target column; saves the model")
    train.add_argument("db", type=database, help=DB_KINDS)
    train.add_argument("--template", type=template_file,
                       help="a .sql template or a NeuraLogic Datalog file (default: the automatic template, shaped by "
                            "the options of `relsql template` below and saved beside --model as .sql)")
    train.add_argument("--target", required=True, type=target, help="table.column to predict")
    train.add_argument("--keys", type=keys_file, help=KEYS_HELP)
    train.add_argument("--output", help="the template relation that predicts it (default: the last one)")
    train.add_argument("--task", choices=["binary", "multiclass", "regression", "ranking"],
                       help="override the detected task (ranking: a target that references a table, see `relsql recommend`)")
    train.add_argument("--time-column",
                       help="split by this column of the target table (earliest rows train); the automatic template "
                            "then lets only earlier rows reach a target")
    train.add_argument("--split", type=split_fractions, metavar="TRAIN,VAL,TEST",
                       help="fractions of the labelled rows (default 0.7,0.15,0.15); 0.85,0.15,0 keeps no test part")
    train.add_argument("--epochs", type=positive_int, help="at most this many epochs (default: fit's, 400)")
    train.add_argument("--lr", type=learning_rate, help="learning rate (default: fit's, 0.01)")
    train.add_argument("--patience", type=positive_int,
                       help="epochs without validation improvement before stopping (default: fit's, 100)")
    train.add_argument("--steps-per-epoch", type=positive_int,
                       help="optimizer steps an epoch, each the whole net with the loss on a seeded share of the training "
                            "rows (default: fit's, 4 for an automatic template's network with --no-hybrid, else 1)")
    train.add_argument("--overfit", action=argparse.BooleanOptionalAction, default=None,
                       help="also stop 20 epochs after the best where the net overfits or has learnt its training rows by "
                            "heart (default: fit's, on for a label target; --no-overfit stops on patience alone)")
    train.add_argument("--time-budget", type=time_budget, metavar="SECONDS",
                       help="stop training after this many seconds, or none for no limit (default: none; the same seed then "
                            "gives the same model under any load)")
    train.add_argument("--schedule", choices=["plateau", "cosine", "none"],
                       help="learning-rate schedule: plateau (halve on plateaus, fit's default), cosine (warm-up then "
                            "cosine decay) or none (constant)")
    train.add_argument("--refit", action=argparse.BooleanOptionalAction, default=None,
                       help="after the held-out scores are measured, train the selected model on every labelled row "
                            "for half the epochs validation chose, the model predictions come from (default: wherever "
                            "the model can be; --no-refit keeps the model trained on the training rows)")
    train.add_argument("--no-hybrid", action="store_true",
                       help="keep the network alone: do not blend it with a GBM on two-hop features (fit blends an "
                            "automatic template's network by default)")
    train.add_argument("--loss", choices=["huber", "mse", "mae", "softmax", "bce", "bpr"],
                       help="regression loss (default huber); for a ranking target softmax (default), bce or bpr")
    train.add_argument("--negatives", choices=["uniform", "popularity", "in-batch"],
                       help="ranking target: how each step draws its non-matching candidates (default uniform)")
    train.add_argument("--hard-negatives", metavar="SELECT",
                       help="ranking target: a SQL SELECT of (target key columns, candidate key) pairs that should rank "
                            "below the row's positives, each adding a BPR term (docs/recommendation.md)")
    train.add_argument("--candidates", metavar="RELATION",
                       help="ranking target: the template's relation that is the candidate tower (default: the last one "
                            "keyed by the referenced table's key)")
    train.add_argument("--pairs", metavar="RELATION",
                       help="ranking target: a template relation keyed by both keys whose 1-wide value adds to a pair's score")
    train.add_argument("--class-weight", choices=["balanced"],
                       help="classification: weigh each row's loss by the inverse of its class's frequency")
    train.add_argument("--device", type=device, default="cpu", help=DEVICE_HELP)
    train.add_argument("--batch-size", type=positive_int,
                       help="target rows per step, each batch grounded on demand (default: all at once)")
    train.add_argument("--memory-limit", type=memory_limit,
                       help="cap DuckDB's memory, e.g. 1GB (it spills to disk beyond it)")
    train.add_argument("--checkpoint", type=checkpoint_file,
                       help="write a training checkpoint here every epoch; an existing one is resumed")
    train.add_argument("--seed", type=seed, default=0)
    train.add_argument("--model", type=model_output, default="relsql-model.pt",
                       help="where to save the model (default relsql-model.pt); its folder must exist")
    train.add_argument("--predictions", type=table_name, help="also write predictions to this new table")
    train.add_argument("--replace", action="store_true", help="replace an existing table of predictions (never a table of data)")
    train.add_argument("--threads", type=positive_int, help=THREADS_HELP)
    train.add_argument("--max-groundings", type=positive_int, help=MAX_GROUNDINGS_HELP)
    train.add_argument("--workers", type=positive_int, default=1,
                       help="train data-parallel on this many processes, each a share of every batch (default 1)")
    train.add_argument("--search", type=search_budget, metavar="BUDGET",
                       help="tune within this time (90s, 10m, 1h): learning rate and weight decay, and for a template "
                            "`relsql template` wrote unedited also its width, hops, aggregation and layer; every trial on "
                            "the same split, the best trained again and saved (--epochs: the longest trial's)")
    train.add_argument("--trials", type=positive_int, help="with --search: at most this many configurations")
    train.add_argument("--allow-target-inputs", action="store_true",
                       help="train even though the template reads the target column (or a copy of it)")
    _template_options(train.add_argument_group("the automatic template (without --template; see `relsql template`)"))
    train.set_defaults(run=_train)
    predict = command("predict", "predict with a saved model; print or write a new table")
    _scoring_options(predict, "predictions", "a model saved by `relsql train` or Model.save",
                     "write the predictions (with each row's split) to this new .parquet or .csv file, atomically, "
                     "and print a summary", "score only the target table's rows satisfying this SQL condition on its "
                     "columns, e.g. \"signup >= DATE '2024-01-01' AND tier = 'gold'\"")
    predict.add_argument("--batch-size", type=positive_int,
                         help="predict in mini-batches of this many rows, each grounded on demand (bounded memory)")
    predict.set_defaults(run=_predict)
    recommend = command("recommend", "rank the referenced rows with a saved ranking model; print or write a new table")
    _scoring_options(recommend, "recommendations", "a ranking model saved by `relsql train`",
                     "write the recommendations to this new .parquet or .csv file, atomically",
                     "rank for the target table's rows satisfying this SQL condition (default: the rows whose target "
                     "is NULL)")
    recommend.add_argument("--k", type=positive_int, default=10, help="candidates per row (default 10)")
    recommend.set_defaults(run=_recommend)
    demo = command("demo", "Mutagenesis on the embedded DuckDB: train relsql/sql_templates/mutagenesis.sql, write predictions")
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
    demo.set_defaults(run=demo_command.run)
    task_command.add_parser(commands, EPILOG)
    explain_command.add_parser(commands, EPILOG)
    return parser, commands.choices


DEVICE_HELP = "cpu (default), cuda or cuda:N: a CUDA GPU this machine has"


def _scoring_options(parser, what: str, model_help: str, out_help: str, where_help: str) -> None:
    """What `predict` and `recommend` both take: the database, the saved model, where the
    `what` (predictions or recommendations) go, which rows, device and threads."""
    parser.add_argument("db", type=database, help=f"the database to score on: {DB_KINDS}")
    parser.add_argument("--model", required=True, type=model_file, help=model_help)
    written = parser.add_mutually_exclusive_group()
    written.add_argument("--out", type=predictions_file, metavar="FILE", help=out_help)
    written.add_argument("--table", type=table_name, help=f"write the {what} to this new table instead of printing them")
    parser.add_argument("--replace", action="store_true",
                        help=f"replace an existing table or --out file of {what} relsql wrote (never data)")
    parser.add_argument("--where", type=where_condition, metavar="CONDITION", help=where_help)
    parser.add_argument("--device", type=device, default="cpu", help=DEVICE_HELP)
    parser.add_argument("--threads", type=positive_int, help=THREADS_HELP)


def _template_options(group) -> None:
    """The options that shape an automatic template: `relsql template`'s, and `relsql train`'s
    without --template. Their defaults are generate()'s: only what the user gives is passed on."""
    group.add_argument("--hops", type=non_negative_int, help="foreign-key hops from the target (default 2)")
    group.add_argument("--width", type=positive_int, help="hidden width (default 16)")
    group.add_argument("--aggregation", type=aggregation,
                       help="over child rows: all (mean, sum, max and count, the default; a ranking target's default "
                            "is avg,sum,count), avg, sum, max, or a comma list such as avg,count")
    group.add_argument("--layer", choices=["sage", "rgcn", "gat", "hgt"],
                       help="per foreign key and direction: sage (the aggregation terms, the default), rgcn (a "
                            "mean), gat (attention over child rows), hgt (typed attention: HGT)")
    group.add_argument("--members", type=positive_int,
                       help="independent networks side by side, their outputs averaged (default 1; 1 with gat and hgt)")
    group.add_argument("--timeless", choices=["exclude", "include"],
                       help="with --time-column: leave out (default) or keep child tables whose time is unknown")
    group.add_argument("--no-infer", action="store_true", help="use declared keys only; do not infer missing ones")


THREADS_HELP = ("threads for DuckDB and for torch (default: DuckDB one per core, torch half the cores: on a busy "
                "machine more torch threads were 20x slower)")
MAX_GROUNDINGS_HELP = ("refuse a rule the database estimates at more groundings than this before it runs (default 10^8: "
                       "more is usually a missing join condition)")


def _log_lines():
    """Without a terminal (a log file, a CI job), progress bars are off: say what happens in lines
    on stderr instead, for the length of the command."""
    return progress_lines(None)


def _debug() -> bool:
    return os.environ.get("RELSQL_DEBUG", "").strip() not in ("", "0")


def _run(argv: list[str] | None) -> int:
    parser, subparsers = _parser()
    try:
        args = parser.parse_args(argv)
        clash = check_together(args)
        if clash:
            subparsers[args.command].error(clash)
    except SystemExit as done:  # argparse: --help (0) or a usage error (2), already printed
        return done.code if isinstance(done.code, int) else 2
    try:
        with _log_lines():
            return args.run(args)
    except UsageError as err:  # the command line's fault, found once the database was open
        print(f"relsql {args.command}: error: {err}", file=sys.stderr)
        return 2
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
