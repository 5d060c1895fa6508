"""What a template is about, checked against the database: the target table and column, the keys it
joins by (discovered, given or inferred, less other questions' task tables and models' outputs), a
ranking target's referenced table and interactions, and each table's time."""

from __future__ import annotations

import re
from dataclasses import dataclass

from relsql import arguments
from relsql.data.catalog import Catalog
from relsql.data.engine import Database
from relsql.data.keys import Schema, schema
from relsql.data.references import Reference, referenced
from relsql.errors import SchemaError
from relsql.predictive.terms import is_task_table
from relsql.template import ir
from relsql.template.auto.options import Options
from relsql.template.auto.ranking import Interaction, interactions
from relsql.template.auto.times import Time, table_times


@dataclass
class Scope:
    """The target and the schema a template is generated over."""

    table: str
    column: str
    keys: Schema  # without other questions' task tables; a scalar ranking target's own foreign key removed
    reference: Reference | None  # the table a ranking target references (None: not a ranking target)
    dimension: int | None  # a ranking target's towers' width
    tasks: list[str]  # task tables of other questions, left out
    outputs: list[str]  # tables a model wrote, left out
    interactions: list[Interaction]  # a ranking target's links from the target row's entity to candidates
    times: dict[str, Time]  # each table's time (empty without a time column)
    inclusive: bool = False  # rows at exactly the target row's time join too (`<=`): a RelBench task's cut


def _unread(db: Database, table: str) -> str:
    """Where a table of that name is that relsql does not read, and how to read it; or nothing."""
    found = db.unread_scopes(table)
    if not found:
        return ""
    catalog, schema = found[0]
    return (f"; a table `{table}` is in schema `{schema}` of catalog `{catalog}`, which relsql does not read (it reads "
            f"the connection's current schema): open the database with duckdb, run `USE \"{catalog}\".\"{schema}\"` "
            "on that connection and pass it (relsql.connect(con))")


def scope(db: Database, table: str, column: str, options: Options) -> Scope:
    """The scope of a template predicting `table`.`column` with (checked) `options`."""
    if not isinstance(db, Database):
        raise SchemaError(f"db must be a relsql.Database (from relsql.connect(...)), got {type(db).__name__}")
    catalog = db.catalog()
    if table not in catalog.tables:
        raise SchemaError(f"target table `{table}` does not exist; tables: {', '.join(catalog.names) or 'none'}"
                          + _unread(db, table))
    if column not in [c.name for c in catalog[table].columns]:
        raise SchemaError(f"target {table}.{column}: `{table}` has no column `{column}`")
    keys = schema(db, catalog, infer=options.infer_keys, **({"given": options.keys} if options.keys is not None else {}))
    reference = referenced(db, table, column)  # before output_units, which refuses a list target
    dimension = _dimension(keys, f"{table}.{column}", reference, options)
    _printable(keys)
    tasks = _other_task_tables(keys, table, set(getattr(db, "relbench_tasks", {})))
    found = interactions(keys, table, column, reference) if reference is not None else []
    if reference is not None and not reference.many:  # the label's own key is never followed
        keys.foreign_keys[:] = [(c, fk) for c, fk in keys.foreign_keys if not (c == table and fk.columns == (column,))]
    if not keys.primary_keys.get(table):
        raise SchemaError(f"target table `{table}` has no primary key (declared or inferable); declare one so each "
                          "prediction has a key")
    named_h = [k for k in keys.primary_keys[table] if k.casefold() == "h" or ir.reserved(k)]
    if named_h:  # the output relation is keyed by the target's key names: h is every relation's value column, and
        # names such as _rid are relsql's own columns in the grounding queries
        what = ("the name of every template relation's value column (h)" if named_h[0].casefold() == "h"
                else "a name relsql's grounding queries use for their own columns")
        raise SchemaError(f"target table `{table}`'s key column `{named_h[0]}` has {what}, so no template can key its "
                          f"predictions by it; predict from a view that "
                          f"renames it (CREATE VIEW {table}_v AS SELECT \"{named_h[0]}\" AS {table}_key, * EXCLUDE "
                          f"(\"{named_h[0]}\") FROM \"{table}\"), target {table}_v.{column}, and give the foreign keys "
                          "that reference the view in a keys file (relsql.connect(..., keys=), docs/keys.md)")
    times = _times(db, catalog, keys, table, options, set(tasks))
    # keys.outputs: tables a model wrote (relsql.data.keys.schema leaves them out), some model's predictions
    return Scope(table, column, keys, reference, dimension, tasks, keys.outputs, found, times,
                 inclusive=relbench_cut(db, table, options.time_column))


def relbench_cut(db: Database, table: str, time_column: str | None) -> bool:
    """Whether `table` is a RelBench task (relsql.relbench added it: `db.relbench_tasks`) timed by
    `time_column`: RelBench's cut keeps rows at exactly the task row's timestamp (`<=`), its labels
    counting what happens after it; relsql's own task tables count events from the snapshot on
    (`snapshot <= time`), so every other template keeps those out (`<`)."""
    task = getattr(db, "relbench_tasks", {}).get(table)
    return time_column is not None and task is not None and task.time_column == time_column


def _dimension(keys: Schema, target: str, reference: Reference | None, options: Options) -> int | None:
    """A ranking target's towers' width (None for other targets, which take no ranking options)."""
    if reference is None:
        if options.dimension is not None or options.history is not None:
            raise SchemaError(f"dimension and history are for ranking targets (a foreign key or a list of keys); "
                              f"{target} references no table: leave them out")
        return None
    dimension = arguments.integer("dimension", 32 if options.dimension is None else options.dimension, maximum=ir.MAX_WIDTH)
    if options.history is not None and not isinstance(options.history, bool):
        raise SchemaError(f"history must be True or False, got {options.history!r}")
    if reference.table not in keys.tables or not keys.primary_keys.get(reference.table):
        raise SchemaError(f"target {target} references {reference.table}({reference.key}), which the template's keys "
                          "do not hold; pass the same keys to connect(keys=...) and Template.auto")
    return dimension


def _printable(keys: Schema) -> None:
    """Names go into the template's comments, one per line: a line break in one is refused."""
    for name, info in keys.tables.items():
        for label in [name, *[c.name for c in info.columns]]:
            if re.search(r"[\x00-\x1f\x7f]", label):
                raise SchemaError(f"{'table' if label == name else f'table {name!r}: column'} {label!r} has a line break "
                                  "or control character in its name; rename it to generate a template")


def _other_task_tables(keys: Schema, target_table: str, relbench: set[str]) -> list[str]:
    """Task tables written by relsql.PredictiveQuery, and a RelBench dataset's task tables
    (`relbench`), other than the target's, taken out of the schema: their labels count events
    after their snapshot, which may be after ours."""
    tasks = [name for name, info in keys.tables.items()
             if name != target_table and (name in relbench or is_task_table(info.columns))]
    for name in tasks:
        del keys.tables[name]
        keys.primary_keys.pop(name, None)
        keys.inferred_primary.discard(name)
    keys.foreign_keys[:] = [(child, fk) for child, fk in keys.foreign_keys
                            if child not in tasks and fk.table not in tasks]
    keys.inferred_foreign[:] = [(child, fk) for child, fk in keys.inferred_foreign
                                if child not in tasks and fk.table not in tasks]
    return tasks


def _times(db: Database, catalog: Catalog, keys: Schema, table: str, options: Options,
           left_out: set[str]) -> dict[str, Time]:
    """Each table's time when the target has one (`options.time_column`), else none (the task
    tables `left_out` of the schema have none: a RelBench dataset declares their times too)."""
    if options.time_column is None:
        return {}
    if options.time_column not in [c.name for c in catalog[table].columns]:
        raise SchemaError(f"time_column `{options.time_column}` is not a column of `{table}`")
    declared = getattr(db, "time_columns", {}) if options.time_columns is None else options.time_columns  # a RelBench dataset's
    declared = {t: c for t, c in declared.items() if t != table and t not in left_out}
    return table_times(db, catalog, keys, table, options.time_column, declared)
