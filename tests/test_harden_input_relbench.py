"""from_relbench and to_heterodata take the user's objects (issue 42, item 4): frames that are not
frames, columns Arrow cannot type, tasks whose get_table raises, returns None or names a missing
column, a list where a mapping belongs. Each is a SchemaError naming the table, task, column or
argument, raised before anything is written to the database; never an AttributeError, an
ArrowInvalid or a DuckDB BinderException.

Duck-typed stand-ins for relbench's Database, Table and EntityTask (what relsql reads of them)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

import relsql
from relsql import relbench as rb
from relsql.errors import SchemaError


def table(df, fkeys=None, pkey=None, time=None):
    return SimpleNamespace(df=df, fkey_col_to_pkey_table=fkeys if fkeys is not None else {}, pkey_col=pkey, time_col=time)


def tables(**extra) -> SimpleNamespace:
    found = {"customers": table(pd.DataFrame({"customer_id": [0, 1, 2]}), pkey="customer_id"),
             "orders": table(pd.DataFrame({"order_id": [0, 1], "customer_id": [0, 2]}), {"customer_id": "customers"},
                             "order_id"),
             **extra}
    return SimpleNamespace(table_dict=found)


class Task:
    """An entity task: a customer, a date and a number, one day per split."""

    entity_col, entity_table, target_col, time_col, task_type = "customer_id", "customers", "y", "date", "regression"

    def __init__(self, get=None, **attributes):
        self.get = get
        self.__dict__.update(attributes)

    def get_table(self, split, mask_input_cols=False):
        if self.get is not None:
            return self.get(split)
        day = pd.Timestamp("2020-01-01") + pd.Timedelta(days=10 * rb.SPLITS.index(split))
        return table(pd.DataFrame({"customer_id": [0, 1], "date": [day, day], "y": [1.0, 2.0]}))


def fail(error: Exception):
    def get(split):
        raise error
    return get


def test_a_well_formed_database_and_task_are_added():
    db = rb.from_relbench(tables(), tasks={"again": Task()})
    assert sorted(db.tables()) == ["again", "customers", "orders"]
    assert rb.tasks(db)["again"].rows == {"train": 2, "val": 2, "test": 2}


CASES = {  # (extra tables, tasks) -> words the error must hold
    "df a list": ({"x": table([1, 2])}, None, ["`x`", "DataFrame", "list"]),
    "df None": ({"x": table(None)}, None, ["`x`", "DataFrame"]),
    "mixed column": ({"x": table(pd.DataFrame({"a": [1, "x", 2.5]}))}, None, ["`x`", "column `a`", "one type"]),
    "object column": ({"x": table(pd.DataFrame({"a": [object(), object()]}))}, None, ["`x`", "column `a`"]),
    "int column name": ({"x": table(pd.DataFrame({0: [1]}))}, None, ["`x`", "column names must be text"]),
    "duplicate columns": ({"x": table(pd.DataFrame([[1, 2]], columns=["a", "a"]))}, None, ["`x`", "a appear twice"]),
    "fkeys a list": ({"x": table(pd.DataFrame({"a": [1]}), fkeys=["a"])}, None, ["`x`", "fkey_col_to_pkey_table"]),
    "pkey a list": ({"x": table(pd.DataFrame({"a": [1]}), pkey=["a"])}, None, ["`x`", "pkey_col"]),
    "tasks a list": ({}, [Task()], ["tasks is a list", "no `name`", "tasks={"]),
    "get_table raises": ({}, {"t": Task(fail(RuntimeError("no labels here")))},
                         ["task `t`", "get_table('train')", "RuntimeError", "no labels here"]),
    "get_table returns None": ({}, {"t": Task(lambda split: None)}, ["task `t`", "NoneType", "relbench Table"]),
    "get_table returns a frame": ({}, {"t": Task(lambda split: pd.DataFrame({"y": [1]}))}, ["task `t`", "DataFrame"]),
    "missing target": ({}, {"t": Task(target_col="nope")}, ["task `t`", "no column `nope`"]),
    "missing time column": ({}, {"t": Task(time_col="nope")}, ["task `t`", "no column `nope`"]),
    "missing entity": ({}, {"t": Task(entity_col="nope")}, ["task `t`", "no column `nope`"]),
    "unknown entity table": ({}, {"t": Task(entity_table="nope")}, ["task `t`", "entity table `nope`"]),
    "target an int": ({}, {"t": Task(target_col=5)}, ["task `t`", "target_col"]),
    "entity a list": ({}, {"t": Task(entity_col=["customer_id"])}, ["task `t`", "entity_col"]),
    "remove_columns an int": ({}, {"t": Task(remove_columns=5)}, ["task `t`", "remove_columns"]),
    "object labels": ({}, {"t": Task(lambda s: table(pd.DataFrame({"customer_id": [0], "date": [pd.Timestamp(0)],
                                                                   "y": [object()]})))}, ["task `t`", "column `y`"]),
    "splits of two types": ({}, {"t": Task(lambda s: table(pd.DataFrame({"customer_id": [0], "date": [pd.Timestamp(0)],
                                                                         "y": [1.0] if s == "train" else ["a"]})))},
                            ["task `t`", "different types", "Field y"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_relbench_objects_are_named_before_anything_is_written(case):
    extra, tasks, words = CASES[case]
    db = relsql.connect()
    with pytest.raises(SchemaError) as err:
        rb.from_relbench(tables(**extra), db, tasks=tasks)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert db.tables() == [] and db.given_keys is None


@pytest.mark.parametrize("argument", [dict(time_columns=["orders"]), dict(time_columns="orders"),
                                      dict(time_columns={"orders": 5}), dict(tables="orders"), dict(tables=5)])
def test_to_heterodata_arguments_of_the_wrong_form(argument):
    """Checked before PyTorch Geometric is imported (tests/test_pyg_export.py exports graphs)."""
    db = rb.from_relbench(tables())
    (name,) = argument
    with pytest.raises(SchemaError, match=f"^{name} must"):
        relsql.to_heterodata(db, **argument)
