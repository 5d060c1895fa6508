"""The network alone of an automatic template: the whole template, or its target table's own columns.

On a few hundred training rows the relational terms of Template.auto's network fit noise that a GBM's
trees leave out: on hostile databases the network over the target table's own columns alone beat the
two-hop network more often than not, while real targets need the two hops (a player's earlier salaries).
So `fit(hybrid=False)` of an automatic template also trains the template's own-columns part (`part`:
the target table's wide own encoding, own_<target>, and the prediction's own term, on the same split
and seed) and keeps the one that scores better on the validation rows by the metric that chose each run's epoch; a tie keeps
the whole template. Measured in docs/quality.md ("the depth chosen on validation"). The blend
(fit's default) does not: its own-column GBM plays that part there.
"""

from __future__ import annotations

import logging
import re

import numpy as np

from relsql.errors import RelsqlError
from relsql.sql import ident
from relsql.template import ir
from relsql.template.sqlrule import statement_spans
from relsql.train.loop import fitting
from relsql.train.loop.callbacks import ranked
from relsql.train.loop.options import FitConfig

log = logging.getLogger("relsql")
CHOOSE = True  # False: train the template as written (the measurement's base)
_HOPS = re.compile(r"from up to \d+ foreign-key hops? away")
_MARK = "-- the target table's own columns alone: "  # the part's third line: a later fit knows its model kept it
_OWN_TERM = re.compile(r"linear\(e\.h, \d+, '(w_out_own[^']*)'(?:, blocks=\d+)?\)")


def fit(db, learner, threads: int | None, config: FitConfig, spec):
    """`fitting.fit` of `learner`, then, where `applies`, the same fit of the own-columns part of its
    template (a model built from `spec` with that template); returns the learner to keep, whose
    `own_columns` says what was compared."""
    learner.own_columns = None  # an earlier fit's comparison no longer holds
    fitting.fit(db, learner, threads, config)
    text = part(learner.template, learner.output) if applies(learner, config) else None
    if text is None:
        if is_part(learner.template):
            learner.own_columns = {"kept": "own columns", "earlier": True}  # a fit again of the part kept before
        return learner
    from relsql.template import Template
    from relsql.train.model import build

    log.info("the network alone: fitting the template's own-columns part to compare on validation")
    try:
        own = build.learner(db, spec.replace(template=Template.from_sql(text)))
        if any(not np.array_equal(own.rows[s], learner.rows[s]) for s in ("train", "val", "test")):
            return learner  # not the same rows (a split the template changes): nothing to compare
        fitting.fit(db, own, threads, config)
    except RelsqlError as err:  # the whole template's fit stands: the comparison is fit's own addition
        log.warning("the network alone: kept the whole template; its own-columns part did not train (%s)", err)
        return learner
    whole, alone = _kept(learner), _kept(own)
    if alone is None or whole is None:
        return learner
    kept = own if alone[0] > whole[0] else learner  # a tie keeps the template as written
    kept.own_columns = {"kept": "own columns" if kept is own else "whole template", "metric": whole[1],
                        "whole": whole[2], "own": alone[2]}
    return kept


def applies(learner, config: FitConfig) -> bool:
    """Whether fit compares the own-columns part: the network alone (no blend) of an automatic
    template for a label, full batch, in this process, without the user's callbacks, a checkpoint or
    a time budget (each would see or count two fits), with validation rows."""
    return (CHOOSE and not config.hybrid and learner.automatic and learner.blends and not learner.mini_batches
            and config.workers == 1 and not config.users and config.checkpoint is None and not config.resume
            and config.time_budget is None and learner.record.best_epoch is not None and len(learner.rows["val"]) > 0)


def _kept(learner) -> tuple[tuple[float, float], str, float] | None:
    """(rank, metric, value) of the kept epoch's validation score by the monitor that chose it (the
    latest fit's: a model fitted again numbers its epochs from 0 again)."""
    record = learner.record
    entry = record.kept()
    if entry is None:
        return None
    monitor = record.monitor or "val_loss"
    value = float(entry.get(monitor, float("nan")))
    metric = monitor.removeprefix("val_")
    return ranked(metric, value, entry.get("val_loss", float("nan"))), metric, value


def is_part(template: ir.Template) -> bool:
    """Whether `template` is an own-columns part `part` made (its third line says so), as the template of
    a model that kept it and was fitted again is."""
    return any(line.startswith(_MARK) for line in (template.source or "").splitlines()[:3])


def part(template: ir.Template, output: str = "predict") -> str | None:
    """The SQL text of `template`'s own-columns part: its header (0 hops), the statements of the
    relation the prediction's own term reads (`linear(e.h, ..., 'w_out_own')`, the target table's
    own encoding) and of what that relation reads, and a prediction of that term alone. None where the
    template is not an automatic one with that term (edited away, hops=0, a ranking target)."""
    from relsql.template.auto import is_automatic

    predict = template.relations.get(output)
    if template.language != "sql" or not is_automatic(template.source) or predict is None or len(predict.rules) != 1:
        return None
    rule = predict.rules[0]
    expr = rule.expr
    if not (isinstance(expr, ir.Binary) and expr.op == "+" and isinstance(expr.right, ir.Apply)
            and isinstance(expr.right.arg, ir.Ref) and expr.right.weight.startswith("w_out_own")):
        return None
    encoder = rule.refs[expr.right.arg.index]
    spans = statement_spans(template.source)
    number = _statement(rule.origin)
    term = _OWN_TERM.search(_text(template.source, spans, number) or "")
    if term is None or term.group(1) != expr.right.weight:
        return None
    needed, stack = set(), [encoder]
    while stack:  # the encoder and every relation it reads
        name = stack.pop()
        if name not in needed and name in template.relations:
            needed.add(name)
            stack += [d for r in template.relations[name].rules for d in r.depends]
    statements = sorted({_statement(r.origin) for name in needed for r in template.relations[name].rules})
    if None in statements:
        return None
    lines = template.source.splitlines()
    header = [_HOPS.sub("from up to 0 foreign-key hops away", lines[0]), *lines[1:2],
              _MARK + "the part of an automatic template that fit(hybrid=False) compares with the whole on "
              "validation (relsql/train/model/own_columns.py)"]
    keys = ", ".join(f"e.{ident(k).sql(dialect='duckdb')}" for k in predict.keys)
    body = [_text(template.source, spans, n) for n in statements]
    prediction = f"CREATE TABLE {output} AS\nSELECT {keys}, {term.group(0)} AS h\nFROM {encoder} e;"
    return "\n".join(header) + "\n\n" + "\n\n".join([*body, prediction]) + "\n"


def _statement(origin: str) -> int | None:
    found = re.match(r"statement (\d+) ", origin or "")
    return int(found.group(1)) if found else None


def _text(source: str, spans: list[tuple[int, int, int]], number: int | None) -> str | None:
    if number is None or not 0 < number <= len(spans):
        return None
    _, start, end = spans[number - 1]
    return source[start:end]
