"""Predictive queries: a training task's labels from a one-line question, not hand-written SQL.

A model learns from a table of labelled examples; on a warehouse those examples are usually
"for each customer at a date, did X happen in the next N days" (RelBench's tasks, Kumo's
predictive queries). Writing that SQL by hand is where time leaks in: a label window that
overlaps the inputs, entities that did not exist yet, a window that runs past the data. This
module writes the TASK TABLE from a small question instead:

    COUNT(orders.*) OVER 30 DAYS > 0 FOR customer AT EVERY 30 DAYS

or in Python `PredictiveQuery(entity="customer", events="orders", window_days=30, op=">",
threshold=0, every_days=30).write(db, "task_churn")`. The table has one row per (entity,
snapshot):

- `task_id` BIGINT, the primary key (declared in DuckDB): one column, so the table is a target
  `Model` and `Template.auto` accept; the natural key (entity key, snapshot) is not one column.
- the entity's key column(s), named as in the entity table, so an automatic template finds the
  foreign key to the entity (inferred from the name; `foreign_key=True` declares it in DuckDB).
- `snapshot` (DATE, or TIMESTAMP when the events' time is a TIMESTAMP): the prediction time;
  pass it as `time_column` so that only rows earlier than it feed the prediction.
- `label`: BOOLEAN for a comparison (`> 0`), else DOUBLE (the count or sum, a regression
  target; DOUBLE so that relsql detects regression rather than classes of small counts); for
  LIST_DISTINCT a list column instead (see Ranking).

Ranking. `LIST_DISTINCT(purchase.item_id) OVER 30 DAYS FOR customer AT EVERY 30 DAYS RANK TOP 10`
(Python: `PredictiveQuery(entity="customer", events="purchase", aggregate="list_distinct",
value="item_id", window_days=30, every_days=30, k=10)`) asks which items each customer buys in
the window: instead of `label` the table has a LIST column holding the window's distinct keys,
sorted ascending, typed as the events' column (`item_id BIGINT[]`). That column must be a foreign
key of the events (declared, or inferred from its name) to a table R; the list column is named
like R's key column (`item.item_id` -> `item_id`), which is how a ranking target finds R: DuckDB
cannot declare a list a foreign key, so `foreign_key=True` declares only the entity's. An
observed window without any key gives NO row (a ranking row needs at least one positive to be
judged on; RelBench's recommendation tasks do the same), so the rows are (entity, snapshot)
pairs with a purchase; a window past the data gives every existing entity a row with a NULL list,
to predict. `RANK TOP k` (k >= 1) is the cut-off a ranking model is judged on (MAP@k): it is not
stored in the table, but returned as `TaskTable.k` (None when absent), with `TaskTable.target`
(the list column) and `TaskTable.references` ((R, key column)). A comparison (`> 0`) does not go
with a list.

Time safety. The label aggregates the events with snapshot <= time < snapshot + window. The
window is half-open on that side because relsql's templates (and `Template.auto` with
`time_column`) join a row only if its time is *strictly earlier* than the snapshot: every event
is then either an input or part of a label, never both and never neither (with a window
(snapshot, snapshot + N] an event stamped on the snapshot's day would be invisible to both).
Only entities that exist at the snapshot get a row: by default those with an event before it
(`ACTIVE`), or every entity row (`ALL`), or those whose creation column is before it (`SINCE
customer.created_at`). A window that ends after the data's last event time is not fully
observed: its label is NULL, which `Model` treats as a row to predict, not to learn from.

Every statement is a sqlglot AST: names are quoted identifiers resolved against the catalog,
numbers typed literals, dates literals printed from validated `date`/`datetime` values; no text
a user wrote reaches SQL.
"""

from __future__ import annotations

from relsql.predictive.parse import GRAMMAR
from relsql.predictive.query import TASK_COLUMNS, PredictiveQuery, QueryError, TaskTable, TimePath, parse

__all__ = ["GRAMMAR", "TASK_COLUMNS", "PredictiveQuery", "QueryError", "TaskTable", "TimePath", "parse"]
