"""Hard negatives from a SQL rule: pairs (target row, candidate) the user knows are wrong answers.

`fit(hard_negatives="SELECT t.task_id, i.item_id FROM ...")`: one SELECT (or SELECTs joined by
UNION, INTERSECT or EXCEPT), parsed with sqlglot and run by the database, returning the target
table's key column(s) and the candidate key (under the target column's name, as recommend() names
it, or the referenced key's). Each pair becomes (labelled row, candidate row); pairs that are
positives of their row are dropped, pairs of rows without a label have nothing to train and are
dropped too, and keys the model does not know are a SchemaError. The query is bounded as a
template rule is: the model's max_groundings (10^8 by default) refuses one the database estimates
larger before it runs (unless its tables are all joined by equalities: then it is counted), and
stops one that returns more rows while it runs; running out of the database's memory is a
GroundingError naming the fix. In each step, each hard pair of the step's rows is scored against
one of its row's positives, drawn from the step's stream: the term softplus(s_hard - s_positive)
(BPR), averaged over the step's hard pairs and added to the step's loss with weight HARD_WEIGHT.
"""

from __future__ import annotations

import re

import duckdb
import numpy as np
import polars as pl
import sqlglot
import torch
import torch.nn.functional as F
from sqlglot import exp

from relsql import sql as q
from relsql.errors import GroundingError, SchemaError
from relsql.ground.execute import groundings_limit
from relsql.train.ranking.rows import key_rows

HARD_WEIGHT = 1.0
ESCAPES = re.compile(r"\x1b\[[0-9;]*m")  # sqlglot underlines the bad token with terminal escapes


def fix(goal) -> str:
    """How a hard_negatives query looks for this target, e.g. SELECT t.task_id, c.item_id FROM ..."""
    keys = ", ".join(f"t.{k}" for k in goal.keys)
    return (f"hard_negatives= is one SELECT returning {goal.table}'s key column(s) and the candidate key, e.g. "
            f"\"SELECT {keys}, c.{goal.reference.key} AS {goal.column} FROM {goal.table} t JOIN {goal.reference.table} c "
            "ON ...\"")


class HardNegatives:
    """Hard pairs per labelled row, as CSR: `offsets` per labelled position, `items` candidate rows."""

    def __init__(self, positions: np.ndarray, items: np.ndarray, labelled_rows: int):
        order = np.lexsort((items, positions))
        self.items = items[order].astype(np.int64)
        counts = np.bincount(positions, minlength=labelled_rows)
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @property
    def size(self) -> int:
        return len(self.items)

    def of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into `positions`, candidate row) of every hard pair of labelled rows `positions`."""
        starts, ends = self.offsets[positions], self.offsets[positions + 1]
        counts = ends - starts
        total = int(counts.sum())
        index = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(total)
        return np.repeat(np.arange(len(positions)), counts), self.items[index]


def parse(text: object, fix: str) -> exp.Query:
    """The user's query as one sqlglot query: a SELECT, or SELECTs joined by UNION/INTERSECT/EXCEPT
    (nothing that writes); anything else is a SchemaError naming the fix."""
    if not isinstance(text, str) or not text.strip():
        raise SchemaError(f"hard_negatives must be SQL text, got {type(text).__name__}; {fix}")
    try:
        statements = [s for s in sqlglot.parse(text, read="duckdb") if s is not None]
    except sqlglot.errors.ParseError as err:
        message = " ".join(ESCAPES.sub("", str(err)).split())[:200]
        raise SchemaError(f"hard_negatives is not valid SQL ({message}); {fix}") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select | exp.SetOperation):
        raise SchemaError(f"hard_negatives must be a single SELECT, got {len(statements)} statement(s) "
                          f"({', '.join(type(s).__name__.upper() for s in statements)}); {fix}")
    select = statements[0]
    if select.find(exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Drop, exp.Alter, exp.Command) is not None:
        raise SchemaError(f"hard_negatives must only read: its SELECT holds a statement that writes; {fix}")
    return select


def read_pairs(db, select: exp.Query, keys: list[str], candidate: list[str], fix: str,
               limit: int | None = None) -> pl.DataFrame:
    """The query's target keys and candidate key (renamed to candidate[0]), run by the database:
    at most `limit` rows (max_groundings; None: its default), see the module."""
    limit = groundings_limit(limit)
    try:
        columns = [name for name, _ in db.result_columns(select.copy().limit(0))]
    except Exception as err:  # the engine's verdict: an unknown table or column, a type error
        raise SchemaError(f"the database could not run hard_negatives: {' '.join(str(err).split())[:300]}; {fix}") from None
    folded = {c.casefold(): c for c in columns}
    missing = [k for k in keys if k.casefold() not in folded]
    found = next((folded[c.casefold()] for c in candidate if c.casefold() in folded), None)
    if missing or found is None:
        need = [*keys, " or ".join(dict.fromkeys(candidate))]
        raise SchemaError(f"hard_negatives returns columns {columns}; it must return {need} (alias them: "
                          f"SELECT ... AS {candidate[0]}); {fix}")
    inner = exp.alias_(exp.Subquery(this=select), q.ident("hard"), table=True)
    query = exp.select(*[exp.alias_(q.col(folded[k.casefold()], "hard"), q.ident(k)) for k in keys],
                       exp.alias_(q.col(found, "hard"), q.ident(candidate[0]))).from_(inner)
    _check_estimate(db, select, limit)
    try:
        found_rows = db.arrow(query.limit(q.integer(limit + 1)))
    except duckdb.OutOfMemoryException as err:
        raise GroundingError(f"hard_negatives ran the database out of memory ({' '.join(str(err).split())[:160]}): its "
                             "SELECT makes too many rows on the way (a join without an equality condition pairs every "
                             f"row with every row); join the candidates to the target rows on a key. {fix}") from None
    if found_rows.num_rows > limit:
        raise GroundingError(f"hard_negatives returns more than max_groundings={limit:,} pairs (counted while it ran); "
                             "keep the few wrong answers that matter per row (join on a key, add a condition), or pass "
                             f"a larger max_groundings= to relsql.Model. {fix}")
    return pl.from_arrow(found_rows)


def _check_estimate(db, select: exp.Query, limit: int) -> None:
    """Refuse a query the database estimates beyond `limit` rows at some step, before it runs, unless
    its tables are all joined by equalities (an estimate that is then often far too high: the
    LIMIT bounds it while it runs)."""
    estimate = db.estimate_rows(select)
    if estimate is None or estimate <= limit:
        return
    groups = q.unjoined_tables(select) if isinstance(select, exp.Select) else None
    if groups is not None and len(groups) <= 1 and not any(select.args.get(k) for k in ("group", "having", "distinct", "order")):
        return
    raise GroundingError(f"hard_negatives: the database estimates about {estimate:,} rows for its SELECT (its largest "
                         f"join step), more than max_groundings={limit:,}. A join without an equality condition (a cross "
                         "join, or only <, >, <> between tables) pairs every row with every row: join the candidates "
                         "to the target rows on a key, or pass a larger max_groundings= to relsql.Model")


def hard_negatives(learner, text: str) -> HardNegatives:
    """The hard pairs of `text` mapped to (labelled row, candidate row), checked (see the module)."""
    goal = learner.goal
    keys = list(goal.keys)
    name = goal.column if goal.column.casefold() not in {k.casefold() for k in keys} else goal.reference.key
    how = fix(goal)
    found = read_pairs(learner.db, parse(text, how), keys, [name, goal.reference.key], how, learner.settings.max_groundings)
    out_keys = pl.from_arrow(learner.net.grounding.relations[learner.output].keys)
    cand_keys = pl.from_arrow(goal.candidate_keys).rename({goal.reference.key: name}) \
        if goal.reference.key != name else pl.from_arrow(goal.candidate_keys)
    joined = key_rows(found, out_keys, cand_keys, name, keep_unmatched=True,
                      mismatch=f"hard_negatives' columns do not have the key types of `{goal.table}` and "
                               f"`{goal.reference.table}`; cast them")
    _refuse_unknown(joined, "_out", keys, f"no row of `{goal.table}` (output `{learner.output}`)")
    _refuse_unknown(joined, "_cand", [name], f"no candidate row in `{goal.candidates}` ({goal.reference.table})")
    return _labelled_pairs(learner, joined["_out"].to_numpy(), joined["_cand"].to_numpy())


def _refuse_unknown(joined: pl.DataFrame, column: str, keys: list[str], what: str) -> None:
    """Keys that matched nothing: a SchemaError with examples."""
    unknown = joined.filter(pl.col(column).is_null()).select(keys).unique()
    if unknown.height:
        examples = unknown.head(5).to_dicts()
        raise SchemaError(f"hard_negatives returns {unknown.height} key(s) with {what}, e.g. {examples}; keep only "
                          "existing keys (join the query with the table)")


def _labelled_pairs(learner, out_rids: np.ndarray, cand_rids: np.ndarray) -> HardNegatives:
    """Pairs on labelled rows, positives and repeats dropped, as CSR per labelled position."""
    goal = learner.goal
    position = np.full(learner.output_rows, -1, dtype=np.int64)
    position[goal.labelled] = np.arange(len(goal.labelled))
    at = position[out_rids.astype(np.int64)]
    keep = at >= 0
    at, cand = at[keep], cand_rids.astype(np.int64)[keep]
    m = learner.candidate_rows
    pairs = np.unique(at * m + cand)
    rows, items = goal.pairs(np.arange(len(goal.labelled)))
    positives = position[rows] * m + items
    pairs = pairs[~np.isin(pairs, positives)]
    return HardNegatives(pairs // m, pairs % m, len(goal.labelled))


def hard_loss(learner, positions: np.ndarray, query: torch.Tensor, candidate: torch.Tensor, pair_term,
              generator: torch.Generator) -> torch.Tensor | None:
    """The hard pairs' term for labelled rows `positions` (None when they have none): BPR of each
    hard pair against one of its row's positives drawn from `generator`."""
    which, items = learner.hard.of(positions)
    if not len(which):
        return None
    goal = learner.goal
    rows = positions[which]
    starts, counts = goal.offsets[rows], goal.offsets[rows + 1] - goal.offsets[rows]
    draw = torch.rand(len(rows), generator=generator, dtype=torch.float64).numpy()
    positive_items = goal.items[starts + np.minimum((draw * counts).astype(np.int64), counts - 1)]
    device = query.device
    out = torch.as_tensor(goal.labelled[rows], device=device)
    hard_items, positive_items = torch.as_tensor(items, device=device), torch.as_tensor(positive_items, device=device)
    q = query.index_select(0, out)
    hard = (q * candidate.index_select(0, hard_items)).sum(1) + pair_term(out, hard_items)
    positive = (q * candidate.index_select(0, positive_items)).sum(1) + pair_term(out, positive_items)
    return HARD_WEIGHT * F.softplus(hard - positive).mean()
