"""A trained model's state as plain data: what `Model.save` writes, what `Model.load` accepts
back, and what the parent process hands its training ranks (with the labels, which a file does
not hold: a loaded model reads them from its database again).

The file is plain data (relsql/train/persist/checkpoint.py, which also bounds what reading it can cost).
Reading checks every value the way the API checks a user's arguments, since a file may be damaged
or crafted: the settings it holds reach SQL (fan-out, feature statistics, the blend's table and
columns) and torch and numpy (shapes, dtypes, row positions used as indices). What needs the
database (row positions against its labelled rows, the blend's tables and columns) is checked
by `check_loaded` once the model is built on it. An error names the file and stays short,
whatever the file holds (MESSAGE_LIMIT).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from relsql import arguments, ownfiles
from relsql.errors import RelsqlError, TemplateError
from relsql.ground.execute import Presets
from relsql.template import Template, ir
from relsql.template import plain as plain_ir
from relsql.train.persist import checkpoint as files
from relsql.train.task.ranking import LOSSES as RANKING_LOSSES
from relsql.train.task.ranking import NEGATIVES, RankingTask
from relsql.train.task.task import Task

FORMAT = "relsql-model-3"
NoneType = type(None)
MESSAGE_LIMIT = 600  # characters of an error about a file: a value from it is cut, not pasted whole


@dataclass
class ModelState:
    """A model's settings, encodings, task, split and weights (a file's contents, checked)."""

    template: ir.Template
    target: str
    output: str
    time_column: str | None
    fractions: tuple[float, float, float]
    seed: int
    dtype: torch.dtype
    history: list
    best_epoch: int | None
    batch_size: int | None
    fanout: int | dict | None
    embedding_optimizer: str | None
    embedding_lr: float
    task: Task
    split: dict[str, np.ndarray]
    presets: Presets
    weights: dict[str, torch.Tensor]
    head: dict[str, torch.Tensor]
    labelled: np.ndarray | None = None  # a rank's: the output row of each labelled target row
    y: torch.Tensor | None = None  # a rank's: the encoded labels
    device: str = "cpu"
    hybrid: dict | None = None  # the blend with a GBM (relsql/train/gbm/hybrid.py), as checked plain data
    refit: dict | None = None  # what the refit on every labelled row did, its held-out scores (relsql/train/loop/refit.py)

    @classmethod
    def of(cls, learner, labels: bool = False) -> ModelState:
        """A learner's state (`labels`: with its labels, for training ranks), read through public members."""
        settings = learner.settings
        return cls(template=learner.template, target=learner.target, output=learner.output,
                   time_column=learner.time_column, fractions=learner.fractions, seed=learner.seed,
                   dtype=settings.dtype, history=list(learner.record.history), best_epoch=learner.record.best_epoch,
                   batch_size=settings.batch_size, fanout=settings.fanout, embedding_optimizer=settings.embedding_optimizer,
                   embedding_lr=settings.embedding_lr, task=learner.task, split=dict(learner.rows),
                   presets=learner.encodings(),
                   weights={k: v.detach().cpu() for k, v in learner.net.weights_by_name().items()},
                   head={k: v.detach().cpu() for k, v in learner.head.state_dict().items()},
                   labelled=learner.labelled if labels else None, y=learner.y.detach().cpu() if labels else None,
                   device=str(settings.device), hybrid=_hybrid(learner), refit=getattr(learner, "refit", None))


Saved = ModelState  # the name it had


def _hybrid(learner) -> dict | None:
    blend = getattr(learner, "hybrid", None)
    return None if blend is None else blend.to_plain()


SAVE_FIX = "save the model under another name, or move that file away"


def write(state: ModelState, path: str | Path) -> Path:
    """The state as a model file (format FORMAT), atomically; never over a file relsql did not
    write (relsql/ownfiles.py), nor when Model.save's plot beside it would go over one."""
    path = files.writable(path, "model file")
    ownfiles.check(path, "model", SAVE_FIX)
    if state.history and state.task.plots_history:  # Model.save then plots the history beside it
        plot = path.with_suffix(".png")
        ownfiles.check(plot, "metrics plot", f"save the model under another name (its plot goes beside it as "
                       f"{plot.name}), or move that file away")
    task, encodings = state.task, state.presets
    return ownfiles.write_marked(path, "model", SAVE_FIX, lambda partial: files.write(partial, FORMAT, {
        "template": state.template.source, "language": state.template.language, **template_ir(state.template),
        "target": state.target, "output": state.output, "time_column": state.time_column,
        "fractions": tuple(float(f) for f in state.fractions), "seed": int(state.seed),
        "dtype": str(state.dtype).removeprefix("torch."),
        "task": {"kind": task.kind, "classes": files.table_bytes(pa.table({"value": pa.array(task.classes)})),
                 "mean": float(task.mean), "std": float(task.std), **task.saved_fields()},
        "rows": {k: torch.as_tensor(v, dtype=torch.int64) for k, v in state.split.items()},
        "dictionaries": {w: files.table_bytes(t) for w, t in encodings.dictionaries.items()},
        "feature_stats": plain(encodings.feature_stats),
        "weights": state.weights, "head": state.head,
        "history": plain(state.history), "best_epoch": state.best_epoch,
        "batch_size": state.batch_size, "fanout": state.fanout,
        "embedding_optimizer": state.embedding_optimizer, "embedding_lr": float(state.embedding_lr),
        **({} if state.hybrid is None else {"hybrid": state.hybrid}),
        **({} if state.refit is None else {"refit": plain(state.refit)}),
    }, "model file"))


def read(path: str | Path) -> ModelState:
    """The checked state of a model file; a RelsqlError of at most MESSAGE_LIMIT characters otherwise."""
    try:
        return _read(path)
    except RelsqlError as err:
        text = str(err)
        if len(text) <= MESSAGE_LIMIT:
            raise
        cut = f" [... {len(text) - MESSAGE_LIMIT + 200:,} characters of the file's value left out ...] "
        raise type(err)(text[: MESSAGE_LIMIT - 200] + cut + text[-150:]) from None


def _read(path: str | Path) -> ModelState:
    state = files.read(path, FORMAT, "model file")
    where = f"model file {path}"

    def get(name, types, within=state):
        return files.field(within, name, types, where)

    def check(name, fn, *args, **kwargs):
        return fn(f"{where}: {name}", *args, **kwargs)

    def damaged(fn, *args):  # a check whose message names no place: the file is named in front
        try:
            return fn(*args)
        except RelsqlError as err:
            raise RelsqlError(f"{where} is damaged: {err}") from None

    template = saved_template(state, where)
    output = get("output", str)
    if output not in template.relations:
        raise RelsqlError(f"{where} is damaged: its output {files.shown(output)} is not a relation of its template")
    target = get("target", str)
    damaged(arguments.target, target)
    batch_size = get("batch_size", (int, NoneType))
    task = get("task", dict)
    classes = saved_classes(files.bytes_table(get("classes", bytes, task), where), where)
    split = saved_split(get("rows", dict), where)
    weights = get("weights", dict)
    bad = [n for n, v in weights.items()
           if n not in template.weights or not isinstance(v, torch.Tensor) or not v.is_floating_point()]
    if bad:
        raise RelsqlError(f"{where} does not fit its own template: weights {files.shown(bad)} are not the template's")
    flat = [n for n, v in weights.items() if v.dim() == 0 and template.weights[n].shape]  # the head has scalars
    if flat:
        raise RelsqlError(f"{where} is damaged: weight(s) {files.shown(flat)} hold a single number, not a vector or matrix")
    checked_task = saved_task(task, classes, template, where)
    return ModelState(
        template=template, target=target, output=output, time_column=get("time_column", (str, NoneType)),
        fractions=damaged(arguments.split, get("fractions", (tuple, list))),
        seed=check("seed", arguments.integer, get("seed", int), minimum=0, maximum=2**31 - 1),
        dtype=getattr(torch, check("dtype", arguments.choice, get("dtype", str), ("float32", "float64"))),
        history=list(get("history", list)), best_epoch=get("best_epoch", (int, NoneType)),
        batch_size=None if batch_size is None else check("batch_size", arguments.integer, batch_size),
        fanout=damaged(arguments.fanout, get("fanout", (int, dict, NoneType)), template.relations),
        embedding_optimizer=check("embedding_optimizer", arguments.choice, get("embedding_optimizer", (str, NoneType)),
                                  (None, "adagrad", "sgd")),
        embedding_lr=check("embedding_lr", arguments.number, get("embedding_lr", (int, float)), positive=True),
        task=checked_task,
        split=split,
        presets=Presets({w: files.bytes_table(data, where) for w, data in get("dictionaries", dict).items()},
                        feature_stats(get("feature_stats", dict), where)),
        weights=weights, head=get("head", dict),
        hybrid=hybrid(state.get("hybrid"), where, target=target, keys=template.relations[output].keys, task=checked_task),
        refit=refit(state.get("refit"), where),
    )


def template_ir(template: ir.Template) -> dict:
    """The parsed template as plain data (relsql/template/plain.py), for `Model.load` to rebuild
    instead of parsing the text again; none for a template without a plain form (Datalog)."""
    text = plain_ir.dumps(template)
    return {} if text is None else {"template_ir": text}


def saved_template(state: dict, where: str) -> Template:
    """A file's template: its plain IR, checked, where it has one that fits its text; the text
    parsed otherwise (files written before plain IRs, Datalog, an edited text, another sqlglot)."""
    language = arguments.choice(f"{where}: language", files.field(state, "language", str, where), ("sql", "datalog"))
    text = files.field(state, "template", str, where)
    if "template_ir" in state:
        try:
            built = plain_ir.loads(files.field(state, "template_ir", str, where), source=text, language=language)
        except plain_ir.PlainError as err:
            raise RelsqlError(f"{where} is damaged: its parsed template (template_ir): {err}; build the model again "
                              "and save it") from None
        if built is not None:
            return Template._of(built)
    try:
        return Template.from_sql(text) if language == "sql" else Template.from_datalog(text)
    except TemplateError as err:
        raise TemplateError(f"{where}: its template: {err}") from None


def saved_classes(table: pa.Table, where: str) -> list:
    """The task's class labels: one column of plain values (they are compared and hashed)."""
    if table.num_columns != 1:
        raise RelsqlError(f"{where} is damaged: its class labels are a table of {table.num_columns} columns, not one")
    kind = table.schema.field(0).type
    if pa.types.is_nested(kind) or pa.types.is_dictionary(kind):
        raise RelsqlError(f"{where} is damaged: its class labels are {kind} values, not plain ones")
    return table.column(0).to_pylist()


def saved_split(rows: dict, where: str) -> dict[str, np.ndarray]:
    """The saved train/val/test split: positions among the labelled rows, each at most once over
    all three splits, none negative (numpy would read -1 as the last row: silently another row).
    Their upper bound is the database's labelled rows, checked by `check_loaded`."""
    split = {}
    for name in ("train", "val", "test"):
        part = files.field(rows, name, torch.Tensor, where)
        if part.dtype != torch.int64 or part.dim() != 1:
            raise RelsqlError(f"{where} is damaged: split {name!r} is not a list of row positions")
        split[name] = part.numpy()
    every = np.concatenate(list(split.values()))
    if len(every) and (every.min() < 0 or len(np.unique(every)) != len(every)):
        raise RelsqlError(f"{where} is damaged: its train/val/test split names a negative row position or one row "
                          "twice; a split holds each labelled row once")
    return split


def check_loaded(learner, path: str | Path) -> None:
    """What a model file says that only the database it is loaded on can confirm: its split's row
    positions exist among the labelled rows, and its blend's tables and columns exist (they are
    read by SQL for every prediction)."""
    labelled = getattr(learner, "labelled", None)
    if labelled is not None:
        check_split(learner, path, len(labelled))
    check_blend(learner, path)


def check_blend(learner, path: str | Path) -> None:
    """Every table and column a GBM blend reads exists in the learner's database."""
    blend = getattr(learner, "hybrid", None)
    if blend is not None:
        _check_blend_columns(learner.db, blend.features, f"model file {path}")


def check_split(learner, path: str | Path, labelled: int | None = None, stacklevel: int = 5) -> None:
    """The split's row positions exist among the `labelled` rows (default: the learner's); on
    another database (new rows to score) the split was the training database's, so none holds
    here: said, and not kept. Model.load runs it first against the count of labelled target rows
    (an upper bound of those the output relation reaches: no grounding needed), then exactly."""
    goal = learner.goal
    labelled = len(goal.labelled) if labelled is None else labelled
    beyond = {name: int(np.max(p)) for name, p in goal.rows.items() if len(p) and int(np.max(p)) >= labelled}
    if beyond:
        name, last = next(iter(beyond.items()))
        warnings.warn(f"model file {path}: its {name} split names labelled row {last:,}, but {learner.db.description} has "
                      f"{labelled:,} labelled rows for {learner.target}: a database other than the one it was "
                      "trained on, so its train/val/test split is not kept here (predict works; evaluate and "
                      "fit need the training database)", RuntimeWarning, stacklevel=stacklevel)
        goal.rows = {name: np.zeros(0, dtype=np.int64) for name in goal.rows}


def _check_blend_columns(db, flat, where: str) -> None:
    """Every table and column the blend's features read exists in `db`."""
    tables = {t.casefold(): t for t in db.tables()}
    needed: dict[str, list[str]] = {}

    def need(table: str, *columns: str) -> None:
        needed.setdefault(table, []).extend(columns)

    need(flat.table, *flat.keys, *([flat.time_column] if flat.time_column else []), *[c.name for c in flat.own])
    for parent in flat.parents:
        need(flat.parents[parent.of].table if parent.of >= 0 else flat.table, *parent.columns)
        need(parent.table, *parent.references, *[c.name for c in parent.features])
    for child in flat.children:
        need(child.table, *child.columns, *[c.name for c in child.features])
        for lookup in child.lookups:
            need(child.table, *lookup.columns)
            need(lookup.table, *lookup.references, *[c.name for c in lookup.features])
        need(flat.table, *child.references)
        if child.via is not None:
            need(child.table, *child.via[0])
            need(child.via[1], *child.via[2], *([child.time] if child.time else []))
        elif child.time:
            need(child.table, child.time)
    for table, columns in needed.items():
        if table.casefold() not in tables:
            raise RelsqlError(f"{where}: its GBM blend reads table {files.shown(table)}, which {db.description} lacks; "
                              "load the model on the database it was trained on")
        present = {c.casefold() for c, _ in db.columns(tables[table.casefold()])}
        missing = [c for c in columns if c.casefold() not in present]
        if missing:
            raise RelsqlError(f"{where}: its GBM blend reads column(s) {files.shown(missing)} of `{table}`, which "
                              f"{db.description} lacks; load the model on the database it was trained on")


def saved_task(task: dict, classes: list, template: ir.Template, where: str) -> Task | RankingTask:
    """The task of a model file, every field checked like an argument."""
    def get(name, types):
        return files.field(task, name, types, where)

    kind = arguments.choice(f"{where}: task", get("kind", str), ("binary", "multiclass", "regression", "ranking"))
    if kind == "ranking":
        candidates = get("candidates", str)
        if candidates not in template.relations:
            raise RelsqlError(f"{where} is damaged: its candidate relation {files.shown(candidates)} is not in its template")
        pairs = task.get("pairs", "")  # files written before pair relations have none
        if not isinstance(pairs, str) or (pairs and pairs not in template.relations):
            raise RelsqlError(f"{where} is damaged: its pair relation {files.shown(pairs)} is not in its template")
        return RankingTask(k=arguments.integer(f"{where}: k", get("k", int)),
                           loss=arguments.choice(f"{where}: loss", get("loss", str), RANKING_LOSSES),
                           negatives=arguments.choice(f"{where}: negatives", get("negatives", str), NEGATIVES),
                           count=arguments.integer(f"{where}: count", get("count", int)), candidates=candidates,
                           pairs=pairs)
    return Task(kind, classes, arguments.number(f"{where}: task mean", get("mean", (int, float))),
                arguments.number(f"{where}: task std", get("std", (int, float)), positive=True))


def refit(data: object, where: str) -> dict | None:
    """A saved refit's record, checked: its epochs and rows (counts), the final training loss, the
    held-out scores per split (names to numbers), the GBM's rounds and the selected epochs it went on
    from (`kept_epochs`, absent in a refit that started again); None for a model not refit."""
    if data is None:
        return None
    where = f"{where}: refit"
    if not isinstance(data, dict) or not {"epochs", "rows", "train_loss", "held_out"} <= set(data) or \
            not set(data) <= {"epochs", "rows", "train_loss", "held_out", "gbm_rounds", "kept_epochs"}:
        raise RelsqlError(f"{where} is damaged: not the record of a refit")
    counts = {k: data[k] for k in ("epochs", "rows", "gbm_rounds", "kept_epochs") if k in data}
    gbm_only = counts["epochs"] == 0 and "gbm_rounds" in counts  # the blend's GBM alone was refit (network weight 0)
    if not all(type(v) is int and (0 < v or (k == "epochs" and gbm_only)) and v <= 2**40 for k, v in counts.items()) \
            or type(data["train_loss"]) is not float:
        raise RelsqlError(f"{where} is damaged: its epochs, rows, rounds or loss")
    held = data["held_out"]
    if not isinstance(held, dict) or not set(held) <= {"val", "test"} or not all(
            isinstance(s, dict) and len(s) <= 32 and all(isinstance(k, str) and len(k) <= 64 and type(v) is float
                                                         for k, v in s.items()) for s in held.values()):
        raise RelsqlError(f"{where} is damaged: its held-out scores are not metric names and numbers per split")
    return {**counts, "train_loss": data["train_loss"], "held_out": {s: dict(v) for s, v in held.items()}}


def hybrid(data: object, where: str, target: str | None = None, keys: list[str] | None = None,
           task: Task | RankingTask | None = None) -> dict | None:
    """A saved blend with a GBM, checked whole (its names reach SQL, its trees index arrays) and
    against the rest of the file: it reads the target's own table by (some of) the output's keys, and its
    trees give one score per class the task has; files without one (a network alone, or
    written before blends existed) give None."""
    from relsql.train.gbm.hybrid import Hybrid

    if data is None:
        return None
    where = f"{where}: hybrid"
    scores = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(scores, list) or not all(
            isinstance(p, list | tuple) and len(p) == 2 and all(type(v) in (int, float) for v in p) for p in scores):
        raise RelsqlError(f"{where} is damaged: its blend scores are not (weight, score) pairs of numbers")
    blend = Hybrid.from_plain(data, where)
    table = target.split(".")[0] if target else None
    if table is not None and blend.features.table.casefold() != table.casefold():
        raise RelsqlError(f"{where} is damaged: its GBM reads table {files.shown(blend.features.table)}, but the "
                          f"model's target is in `{table}`")
    if keys is not None and (not blend.features.keys or not set(blend.features.keys) <= set(keys)):
        raise RelsqlError(f"{where} is damaged: its GBM joins on {files.shown(blend.features.keys)}, not on the output's "
                          f"keys {keys}")
    flat = blend.features
    links = [(p.columns, p.references) for p in [*flat.parents, *[p for c in flat.children for p in c.lookups]]]
    links += [(c.columns, c.references) for c in flat.children]
    links += [(c.references, flat.keys) for c in flat.children if c.through is None]  # else the target's foreign key
    links += [(c.via[0], c.via[2]) for c in flat.children if c.via is not None]
    if any(not columns or len(columns) != len(references) for columns, references in links):
        raise RelsqlError(f"{where} is damaged: a join of its GBM features names no columns, or not as many as it "
                          "references")
    units = len(task.classes) if task is not None and task.kind == "multiclass" else 1
    if task is not None and blend.trees.units != units:
        raise RelsqlError(f"{where} is damaged: its trees give {blend.trees.units:,} scores per row, the task needs {units}")
    return data


def plain(value: object) -> object:
    """Numbers as Python floats/ints (numpy scalars pickle as numpy objects, which the safe
    loader refuses), containers copied."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def feature_stats(stats: dict, where: str) -> dict[str, dict]:
    """Saved standardization statistics, checked: they become typed literals in SQL."""
    checked = {}
    for key, entry in stats.items():
        if not isinstance(key, str) or not isinstance(entry, dict):
            raise RelsqlError(f"{where} is damaged: feature statistics {files.shown(key)}")
        nulls = entry.get("nulls")
        if not (nulls is None or isinstance(nulls, (bool, np.bool_)) or (type(nulls) is int and nulls in (0, 1))):
            raise RelsqlError(f"{where} is damaged: feature statistics {files.shown(key)}: nulls is not true or false")
        checked[key] = {**entry, "mean": arguments.number(f"{where}: {key} mean", entry.get("mean")),
                        "std": arguments.number(f"{where}: {key} std", entry.get("std"), positive=True),
                        "nulls": bool(nulls)}
    return checked
