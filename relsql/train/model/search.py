"""`Model.search(budget=...)`: the model's settings tuned on its own validation rows.

A search of relsql's own (Optuna was not needed: a few dozen trials of a seconds-long fit are
what a random search with successive halving handles, and it keeps the search seeded and free
of another dependency). Configurations are drawn at random from a seeded generator, the
model's own settings first; each bracket trains up to `BRACKET` of them for a ninth of the
epoch budget, keeps the best third for a third of it, and the best of those for all of it
(successive halving, eta = 3). Every trial learns from the same training rows and is scored on
the same validation rows with the metric the target's models are compared on (`task.compared`:
ROC-AUC, accuracy, MAE, or MAP@k for a ranking target), ranked as early stopping ranks epochs
(relsql.train.loop.callbacks.ranked), so scores compare. The best trial is then trained again (its epochs) and becomes the model.

What is searched: the fit settings (learning rate, weight decay) always; for a template that
`Template.auto` made (its text is exactly what `generate` writes for the options its header
names), or when `auto={...}` gives generate()'s options, also the template: width, hops,
aggregation, layer kind and whichever other options generate() takes that are listed in
`TEMPLATE_SPACE` (dropout, once it takes one). A hand-written template means what it says:
only its fit settings are tuned.

Trials are deterministic for a seed when the budget does not cut them short: each trial's
weights start from the seed's draw and its dropout draws from the seed, in a stream of its own
(the caller's torch generator is left as it was).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from relsql import arguments
from relsql.errors import RelsqlError
from relsql.ground.demand import database_embeddings
from relsql.template import Template
from relsql.train.loop.callbacks import ranked

log = logging.getLogger("relsql")

BRACKET, ETA, RUNGS = 9, 3, 3  # configurations per bracket; kept share 1/ETA per rung; rungs per bracket
_BUDGET = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(s|sec|m|min|h)?", re.IGNORECASE)
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
_HEADER = re.compile(r"-- relsql automatic template \((\w+) layers\): predict \S+ from up to (\d+) foreign-key hops away\n"
                     r"-- width (\d+), (.*); edit freely and retrain\.")
_OWN = {"epochs", "lr", "weight_decay", "checkpoint", "resume", "checkpoint_every", "callback", "callbacks", "workers"}
FIT_SPACE = {"lr": (1e-3, 3e-2), "weight_decay": (0.0, 1e-5, 1e-4, 1e-3, 1e-2)}  # lr: log-uniform between
TEMPLATE_SPACE = {"width": (8, 16, 32, 64), "hops": (1, 2, 3), "aggregation": ("all", "avg", "avg,count", "sum,max,count"),
                  "layer": ("sage", "rgcn", "gat", "hgt"), "dropout": (0.0, 0.1, 0.2, 0.3), "numbers": ("ple", "standardized")}
_DROPOUT = re.compile(r"\bdropout\(.*, ([0-9.]+)\) AS ")
_BLOCKS = re.compile(r"\bblocks=(\d+)\)")


def budget_seconds(budget: object) -> float:
    """A search budget in seconds: a number of seconds, or a string "90s", "10m", "1.5h"."""
    if isinstance(budget, str):
        match = _BUDGET.fullmatch(budget.strip())
        seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()] if match else None
    elif isinstance(budget, int | float) and not isinstance(budget, bool):
        seconds = float(budget)
    else:
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise RelsqlError(f"budget must be a time above 0: seconds as a number (600), or a string such as '90s', '10m' "
                          f"or '1h'; got {budget!r}")
    return seconds


# -- what is searched ---------------------------------------------------------------------------------------------
def generate_options() -> set[str]:
    """The options Template.auto's generate() takes today (the space follows what it offers)."""
    from relsql.template.auto import generate

    return set(inspect.signature(generate).parameters) - {"db", "target"}


def header_options(source: str) -> dict | None:
    """generate()'s layer, hops, width and aggregation as an automatic template's header names them."""
    match = _HEADER.match(source)
    if match is None:
        return None
    layer, hops, width, combined = match.groups()
    options = {"layer": layer, "hops": int(hops), "width": int(width)}
    terms = re.fullmatch(r"aggregation over child rows (?:all: )?(.*)", combined)
    if layer in ("sage", "rgcn") and terms is None:
        return None
    if layer == "sage":
        options["aggregation"] = ("all" if combined.startswith("aggregation over child rows all:")
                                  else terms.group(1).replace(" ", ""))
    accepted = generate_options()
    if "numbers" in accepted:  # encoders the header does not name, read from the body
        options["numbers"] = "ple" if re.search(r"\bple\(", source) else "standardized"
    dropout = _DROPOUT.search(source)
    if "dropout" in accepted:
        options["dropout"] = float(dropout.group(1)) if dropout else 0.0
    if "members" in accepted:  # members side by side: every map between vectors in that many blocks
        blocks = _BLOCKS.search(source)
        options["members"] = int(blocks.group(1)) if blocks else 1
    return options


def auto_options(model) -> dict | None:
    """generate()'s options for the model's template if Template.auto made it unedited, else None:
    the header's options regenerate exactly its text (with the model's time column)."""
    from relsql.template.auto import generate

    options = header_options(model.template.source or "")
    if options is None:
        return None
    if model.time_column is not None:
        options["time_column"] = model.time_column
    try:
        text = generate(model.db, model.target, **options)
    except RelsqlError:
        return None
    return options if text == model.template.source else None


@dataclass
class Config:
    """One point of the search space: fit settings, and generate()'s options (None: the model's template)."""

    number: int
    fit: dict
    template: dict | None = None

    def describe(self) -> str:
        parts = {**(self.template or {}), **self.fit}
        return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in parts.items()
                         if k != "time_column")


def draw(rng: np.random.Generator, number: int, base: dict | None, allowed: set[str]) -> Config:
    """A random configuration: a log-uniform learning rate, a weight decay, and (for an automatic
    template) each searchable generate() option; rgcn takes the mean alone."""
    low, high = FIT_SPACE["lr"]
    fit = {"lr": float(math.exp(rng.uniform(math.log(low), math.log(high)))),
           "weight_decay": float(rng.choice(FIT_SPACE["weight_decay"]))}
    if base is None:
        return Config(number, fit)
    template = dict(base)
    for name, values in TEMPLATE_SPACE.items():
        if name in allowed:
            value = values[int(rng.integers(len(values)))]
            template[name] = value.item() if isinstance(value, np.generic) else value
    if template.get("layer") in ("rgcn", "gat", "hgt"):
        template.pop("aggregation", None)  # rgcn: the mean; gat and hgt: attention
    if template.get("layer") in ("gat", "hgt"):
        template.pop("members", None)  # attention reads every feature of a row: one member
    return Config(number, fit, template)


# -- trials ---------------------------------------------------------------------------------------------------------
@dataclass
class Built:
    """A trial's model, built once per configuration, with its initial weights to start every fit from."""

    model: object
    initial: tuple


@dataclass
class Search:
    """The state of one search: the base model, the split every trial shares, the trials so far."""

    base: object
    seconds: float
    limit: int | None
    epochs: int
    patience: int | None
    fit_options: dict
    searched: set[str]
    started: float = field(default_factory=time.perf_counter)
    records: list[dict] = field(default_factory=list)
    drawn: dict[int, Config] = field(default_factory=dict)

    @property
    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.started)

    def out_of_time(self) -> bool:
        """The budget is spent (a first trial always runs)."""
        return bool(self.records) and self.left <= 0


def labelled_keys(learner) -> list[tuple]:
    """The target keys of the learner's labelled rows, in label order."""
    if learner.mini_batches:
        keys = pl.from_arrow(learner.batched.grounder.keys(learner.output))
    else:
        keys = pl.from_arrow(learner.net.grounding.relations[learner.output].keys)
    by_rid = dict(zip(keys["_rid"].to_list(), keys.drop("_rid").iter_rows()))
    return [by_rid[int(rid)] for rid in learner.labelled]


def share_split(base, trial) -> None:
    """Give the trial's model the base model's split, row for row (matched by the target's keys):
    its labels are read again with that split, so a regression target is standardized alike."""
    base_keys, trial_keys = labelled_keys(base.learner), labelled_keys(trial.learner)
    if base_keys == trial_keys and all(np.array_equal(base.rows[s], trial.rows[s]) for s in base.rows):
        return
    where = {key: i for i, key in enumerate(trial_keys)}
    missing = [key for key in base_keys if key not in where]
    if missing:
        raise RelsqlError(f"this template's output relation has no row for {len(missing)} labelled target rows "
                          f"(e.g. keys {missing[0]}), so it cannot be scored on the model's split")
    trial.learner.resplit({s: np.asarray([where[base_keys[i]] for i in rows], dtype=np.int64) for s, rows in base.rows.items()})


def trial_fanout(fanout: dict[str, int] | int | None, template: Template) -> dict[str, int] | int | None:
    """The model's fan-out caps for a trial's template: a cap per relation kept for the relations the
    template declares (generate() names a relation by its join path, so a name means the same rows
    in every template it writes) and dropped for the others, which that template has no rows of."""
    if not isinstance(fanout, dict):
        return fanout
    return {name: cap for name, cap in fanout.items() if name in template.relations} or None


def build(search: Search, config: Config) -> Built:
    """A fresh model for a configuration: the base model's spec with the template generate()
    writes (or the base's own, whose output, candidates and pairs it keeps), no progress lines and
    a grounding store of its own; its initial weights are the seed's draw."""
    from relsql.template.auto import generate

    base = search.base
    spec = base.spec.replace(progress=False, store=False if base.spec.store is False else None)
    if config.template is None:  # the base passed the leakage check with this very template: not run again
        spec = spec.replace(allow_target_inputs=True)
    else:  # another template: its relations are named anew, and it is checked
        template = Template.from_sql(generate(base.db, base.target, **config.template))
        spec = spec.replace(template=template, output=None, candidates=None, pairs=None, allow_target_inputs=False,
                            fanout=trial_fanout(spec.fanout, template))
    trial = type(base).from_spec(base.db, spec)
    share_split(base, trial)
    return Built(trial, trial.learner.weights_copy())


def fit_keywords(model, search: Search, epochs: int, config: Config, final: bool = False) -> dict:
    """The keyword arguments of one trial's fit: its settings, the epochs of its rung, the user's
    fit options, and no more time than the budget has left (where fit takes a time budget; the
    final training has fit's own)."""
    accepted = inspect.signature(model.fit).parameters
    keywords = {**search.fit_options, **config.fit, "epochs": epochs}
    if not final:  # a trial's validation rows stay held out: only the final training may refit on them
        keywords["refit"] = False
        keywords["hybrid"] = False  # trials compare networks; the final one is blended as fit() blends
    if search.patience is not None:
        keywords["patience"] = min(search.patience, epochs)
    if "time_budget" in accepted and not final:
        left = max(search.left, 1.0)
        given = keywords.get("time_budget", math.inf)
        keywords["time_budget"] = min(left, given if given is not None else math.inf)
    return {k: v for k, v in keywords.items() if k in accepted}


@contextlib.contextmanager
def quiet():
    """relsql's info lines (grounding, planning, fit's epochs) held back: one line per trial."""
    level = log.level
    log.setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    try:
        yield
    finally:
        log.setLevel(level)


def train(built: Built, keywords: dict) -> None:
    """One fit from the configuration's initial weights, its random draws (dropout) from the seed."""
    model = built.model
    learner = model.learner
    learner.restore_weights(built.initial)
    learner.record = dataclasses.replace(learner.record, history=[], best_epoch=None, stopped=None)  # the trial's alone
    learner.hybrid = None
    learner.random_state = None  # each training draws its dropout masks from the seed, as the trial did
    with quiet(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(model.seed)
        model.fit(**keywords)


def selected_score(learner) -> tuple[str, float, float]:
    """(metric, value, validation loss) at the epoch fit kept, the metric the task's models are
    compared on (ROC-AUC, accuracy, MAE, MAP@k) whatever fit selected its epoch on."""
    kept = learner.record.kept()
    key = f"val_{learner.task.compared}"
    if kept is None:
        return key, float("nan"), float("nan")
    return key, float(kept.get(key, float("nan"))), float(kept.get("val_loss", float("nan")))


def run_trial(search: Search, built: dict[int, Built], config: Config, rung: int, bracket: int, epochs: int) -> dict:
    """Build (once) and train one configuration for `epochs`; its record for the trials frame."""
    started = time.perf_counter()
    searched = {name: (config.template or {}).get(name) for name in TEMPLATE_SPACE if name in search.searched}
    record = {"trial": len(search.records), "config": config.number, "bracket": bracket, "rung": rung,
              **searched, **config.fit, "epochs": epochs}
    try:
        if config.number not in built:
            with quiet():
                built[config.number] = build(search, config)
        model = built[config.number].model
        train(built[config.number], fit_keywords(model, search, epochs, config))
        learner, fitted = model.learner, model.learner.record
        metric, score, loss = selected_score(learner)
        record.update(metric=metric, score=score, val_loss=loss, best_epoch=(fitted.best_epoch or 0) + 1,
                      epochs_run=len(fitted.history), stopped=fitted.stopped, error=None)
    except RelsqlError as err:  # a configuration that cannot be built or trained (too many groundings, ...)
        built.pop(config.number, None)
        record.update(metric=None, score=float("nan"), val_loss=float("nan"), best_epoch=None, epochs_run=0, stopped=None,
                      error=str(err).splitlines()[0][:200])
    record["seconds"] = time.perf_counter() - started
    search.records.append(record)
    shown = "failed: " + record["error"] if record["error"] else f"{record['metric']} {record['score']:.4f} at epoch " \
        f"{record['best_epoch']} of {record['epochs_run']}"
    log.info("trial %d (config %d, rung %d, %d epochs): %s -> %s (%.1fs)", record["trial"] + 1, config.number, rung,
             epochs, config.describe(), shown, record["seconds"])
    return record


def better(record: dict) -> tuple[float, float]:
    """A trial's (score, -validation loss), larger better, as early stopping ranks an epoch: the loss
    breaks ties (two ROC-AUCs of 1.0), an unscored trial comes after the scored ones, a failed one last."""
    if record["metric"] is None:
        return -math.inf, -math.inf
    return ranked(record["metric"].removeprefix("val_"), record["score"], record["val_loss"])


def rung_epochs(epochs: int) -> list[int]:
    """The epoch budget of each rung: epochs / ETA^(RUNGS-1), ..., epochs / ETA, epochs."""
    return [max(1, round(epochs / ETA ** (RUNGS - 1 - r))) for r in range(RUNGS)]


def first_rung(count: int) -> int:
    """The rung a bracket of `count` configurations starts at: as many rungs as its halvings
    leave someone for (one configuration is trained once, in full)."""
    halvings = 0
    while ETA ** (halvings + 1) <= count and halvings < RUNGS - 1:
        halvings += 1
    return RUNGS - 1 - halvings


def bracket(search: Search, configs: list[Config], number: int) -> None:
    """Successive halving over `configs`: each rung trains them for more epochs, the best third go on."""
    built: dict[int, Built] = {}
    alive = configs
    start = first_rung(len(configs))
    for rung, epochs in list(enumerate(rung_epochs(search.epochs)))[start:]:
        records = []
        for config in alive:
            if search.out_of_time():
                return
            records.append((run_trial(search, built, config, rung, number, epochs), config))
        ranked = sorted(records, key=lambda rc: (*(-v for v in better(rc[0])), rc[1].number))
        alive = [config for record, config in ranked[:max(1, len(ranked) // ETA)] if record["error"] is None]
        for gone in set(built) - {c.number for c in alive}:
            del built[gone]
        if not alive:
            return


def best_record(records: list[dict]) -> dict:
    """The trial with the best validation score (the longer-trained, then the earlier, on a tie)."""
    scored = [r for r in records if r["error"] is None and r["score"] == r["score"]]
    if not scored:
        errors = "; ".join(dict.fromkeys(r["error"] for r in records if r["error"]))
        raise RelsqlError(f"no trial of the search could be scored on the validation rows ({errors or 'no trials ran'}); "
                          "give the search more budget, or check that the model trains with fit()")
    return max(scored, key=lambda r: (better(r), r["epochs"], -r["trial"]))


def check(model) -> None:
    """Search scores trials on validation rows and builds models of its own: refuse what cannot be."""
    if not len(model.rows.get("val", ())):
        raise RelsqlError("search scores every trial on the validation rows, and this model's split has none: build "
                          "the Model with a validation part in split=, e.g. split=(0.7, 0.15, 0.15)")
    if database_embeddings(model.template):
        raise RelsqlError("search trains many models, and this template keeps embeddings in database tables, which "
                          "every trial would overwrite: tune it with fit() by hand, or keep the embeddings in memory")


def search(model, budget: float | str = "10m", trials: int | None = None, *, auto: dict | None = None,
           epochs: int | None = None, patience: int | None = None, seed: int | None = None, **fit_options):
    """Tune `model` within `budget` (seconds, or "90s", "10m", "1h") and at most `trials`
    configurations; the best by validation score is trained again (at its epochs) and becomes the model
    (its learner), with `model.trials` (a polars frame, one row per trial) beside it.

    `auto`: generate()'s options to search the template from (default: read from a template
    Template.auto made, else only the fit settings are searched). `epochs`/`patience`: the full
    rung's (default fit's). `seed`: the draws of configurations (default the model's seed).
    Other keywords go to every fit (refit= to the final one only: trials never refit, they score
    held-out rows; the final training refits on every labelled row as fit() does by default).
    The final training comes after the budget, with fit's own time budget."""
    seconds = budget_seconds(budget)
    limit = None if trials is None else arguments.integer("trials", trials, maximum=10_000)
    check(model)
    accepted = inspect.signature(model.fit).parameters
    unknown = sorted((set(fit_options) - set(accepted)) | (_OWN & set(fit_options)))
    if unknown:
        raise RelsqlError(f"search sets epochs, lr and weight_decay itself, writes no checkpoints, and passes fit() its "
                          f"other options: drop {', '.join(unknown)}")
    epochs = arguments.integer("epochs", epochs) if epochs is not None else accepted["epochs"].default
    patience = None if patience is None else arguments.integer("patience", patience, minimum=0)
    seed = model.seed if seed is None else arguments.integer("seed", seed, minimum=0, maximum=2**31 - 1)
    if auto is not None and not isinstance(auto, dict):
        raise RelsqlError(f"auto must be a dict of Template.auto's options (e.g. {{'hops': 2}}), got {type(auto).__name__}")
    base_options = dict(auto) if auto is not None else auto_options(model)
    if base_options is not None and model.time_column is not None:
        base_options.setdefault("time_column", model.time_column)  # later rows stay out of every trial's template
    allowed = generate_options() if base_options is not None else set()
    state = Search(model, seconds, limit, epochs, patience, fit_options, set(TEMPLATE_SPACE) & allowed)
    rng = np.random.default_rng([seed, 29])
    own_fit = {"lr": model.learner.fit_lr, "weight_decay": float(accepted["weight_decay"].default)}  # fit's defaults
    log.info("search: up to %s trials in %.0fs, %s", limit or "any number of", seconds,
             f"template options {sorted(set(TEMPLATE_SPACE) & allowed)} and fit settings" if allowed else "fit settings only")
    number = 0
    while not state.out_of_time() and (limit is None or len(state.drawn) < limit):
        size = BRACKET if limit is None else min(BRACKET, limit - len(state.drawn))
        configs = []
        for _ in range(size):
            n = len(state.drawn)
            state.drawn[n] = Config(n, dict(own_fit), base_options) if n == 0 else draw(rng, n, base_options, allowed)
            configs.append(state.drawn[n])
        bracket(state, configs, number)
        number += 1
    return finish(model, state)


def finish(model, state: Search):
    """Train the best trial again (a fresh build: its weights, split and tables are the latest;
    its rung's epochs) and make it the model; the trials frame goes beside it."""
    best = best_record(state.records)
    config = state.drawn[best["config"]]
    with quiet():
        built = build(state, config)
    keywords = fit_keywords(built.model, state, best["epochs"], config, final=True)  # its rung's epochs: its score again
    started = time.perf_counter()
    train(built, keywords)
    frame = pl.from_dicts(state.records, infer_schema_length=None).with_columns(
        (pl.col("trial") == best["trial"]).alias("chosen"))
    progress = model.spec.progress
    model.learner = built.model.learner  # the model is now made of the trial's spec (model.spec reads it)
    model.learner.settings.progress = progress  # the trials ran without progress lines; the model keeps the user's
    model.learner.trials = frame
    metric, score, _ = selected_score(model.learner)
    log.info("search: %d trials in %.0fs; best config %d (%s %.4f), trained again: %s %.4f (%.1fs)", frame.height,
             time.perf_counter() - state.started, best["config"], best["metric"], best["score"], metric, score,
             time.perf_counter() - started)
    return model


def summary(trials: pl.DataFrame, top: int = 5) -> str:
    """The trials as a report prints them: how many, the chosen one, and the best `top` by score."""
    if trials is None or not trials.height:
        return ""
    chosen = trials.filter(pl.col("chosen")).row(0, named=True)
    metric = chosen["metric"]
    failed = trials.filter(pl.col("error").is_not_null()).height
    settings = [c for c in (*TEMPLATE_SPACE, *FIT_SPACE) if c in trials.columns]
    lines = [f"search: {trials.height} trials of {trials['config'].n_unique()} configurations in "
             f"{trials['seconds'].sum():.1f}s{f' ({failed} failed)' if failed else ''}, all on the model's split; "
             f"chosen: configuration {chosen['config']} ({metric} {chosen['score']:.4f} on validation at {chosen['epochs']} "
             "epochs), trained again"]
    ranked = sorted(trials.filter(pl.col("error").is_null()).iter_rows(named=True),
                    key=lambda r: (*(-v for v in better(r)), r["trial"]))
    for row in ranked[:top]:
        shown = ", ".join(f"{c}={row[c]:.3g}" if isinstance(row[c], float) else f"{c}={row[c]}" for c in settings
                          if row[c] is not None)
        lines.append(f"  {'*' if row['chosen'] else ' '} {row['score']:.4f} "
                     f"config {row['config']}, {row['epochs']} epochs (kept {row['best_epoch']}), {row['seconds']:.1f}s: {shown}")
    return "\n".join(lines)
