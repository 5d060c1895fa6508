"""RelBench in relsql: a relbench Database, RelBench dataset folders (3.x manifests and the older
Parquet-metadata layout) and a RelBench entity task trained on exactly RelBench's split, scored
with RelBench's metrics. Oracles: relbench's own classes, loader and metrics, and scikit-learn.
Everything is built in the tests (nothing downloaded)."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

relbench_base = importlib.import_module("relbench.base")
relbench_load = importlib.import_module("relbench.load")
relbench_manifest = importlib.import_module("relbench.manifest")
relbench_metrics = importlib.import_module("relbench.metrics")
skm = importlib.import_module("sklearn.metrics")

import relsql  # noqa: E402
from relsql import relbench as rb  # noqa: E402
from relsql.data.keys import schema  # noqa: E402
from relsql.errors import SchemaError  # noqa: E402
from relsql.template import Template  # noqa: E402

VAL, TEST = pd.Timestamp("2021-07-01"), pd.Timestamp("2021-09-01")
DELTA = pd.Timedelta(days=30)


def shop_tables(seed: int = 0, customers: int = 120) -> dict[str, pd.DataFrame]:
    """Customers (RelBench keys 0..n-1) whose `activity` drives how often they order."""
    rng = np.random.default_rng(seed)
    activity = rng.uniform(0, 1, customers)
    people = pd.DataFrame({"customer_id": np.arange(customers), "activity": activity,
                           "region": rng.choice(["north", "south", "east"], customers)})
    rows = []
    for c in range(customers):
        for day in np.flatnonzero(rng.uniform(0, 1, 330) < 0.05 * activity[c] ** 2):
            rows.append((c, pd.Timestamp("2021-01-01") + pd.Timedelta(days=int(day)), float(rng.gamma(2, 10))))
    orders = pd.DataFrame(rows, columns=["customer_id", "date", "amount"]).sort_values("date", kind="stable")
    orders.insert(0, "order_id", np.arange(len(orders)))
    orders["customer_id"] = orders["customer_id"].astype("float64")
    orders.loc[orders.index[3], "customer_id"] = np.nan  # a dangling key, as relbench stores it
    return {"customers": people, "orders": orders.reset_index(drop=True)}


class ShopDataset(relbench_base.Dataset):
    val_timestamp, test_timestamp = VAL, TEST

    def __init__(self, seed: int = 0):
        self.frames = shop_tables(seed)

    def make_db(self):
        return relbench_base.Database({
            "customers": relbench_base.Table(self.frames["customers"].copy(), {}, pkey_col="customer_id"),
            "orders": relbench_base.Table(self.frames["orders"].copy(), {"customer_id": "customers"},
                                          pkey_col="order_id", time_col="date"),
        })


class OrdersAgain(relbench_base.EntityTask):
    """Does a customer order in the next 30 days? (relbench's own split and evaluation)"""

    task_type = relbench_base.TaskType.BINARY_CLASSIFICATION
    entity_col, entity_table, time_col, target_col = "customer_id", "customers", "date", "again"
    timedelta = DELTA
    metrics = [relbench_metrics.roc_auc]

    def make_table(self, db, timestamps):
        orders, people = db.table_dict["orders"].df, db.table_dict["customers"].df
        frames = []
        for t in timestamps:
            window = orders[(orders["date"] > t) & (orders["date"] <= t + self.timedelta)]
            buyers = set(window["customer_id"].dropna().astype(int))
            frames.append(pd.DataFrame({"date": t, "customer_id": people["customer_id"],
                                        "again": people["customer_id"].isin(buyers).astype(int)}))
        return relbench_base.Table(pd.concat(frames, ignore_index=True), {"customer_id": "customers"}, None, "date")


def task_and_db():
    dataset = ShopDataset()
    return OrdersAgain(dataset), dataset.get_db()


# -- a relbench Database -----------------------------------------------------------------------------------------
def test_from_relbench_keys_time_columns_and_rows():
    task, database = task_and_db()
    db = rb.from_relbench(database)
    keys = schema(db, db.catalog(), infer=False)
    assert keys.primary_keys["customers"] == ("customer_id",)
    assert keys.primary_keys["orders"] == ("order_id",)
    fks = [(child, fk.columns, fk.table, fk.references) for child, fk in keys.foreign_keys]
    assert fks == [("orders", ("customer_id",), "customers", ("customer_id",))]
    assert rb.time_columns(db) == {"orders": "date"}
    orders = db.con.execute('SELECT order_id, customer_id, amount FROM "orders" ORDER BY order_id').fetch_df()
    expected = database.table_dict["orders"].df
    assert dict(db.columns("orders"))["customer_id"] == "BIGINT"  # relbench's float keys (NaN: missing) as integers
    assert orders["customer_id"].isna().sum() == expected["customer_id"].isna().sum() == 1
    np.testing.assert_array_equal(orders["customer_id"].fillna(-1).to_numpy(), expected["customer_id"].fillna(-1).to_numpy())
    np.testing.assert_allclose(orders["amount"].to_numpy(), expected["amount"].to_numpy())


def test_from_relbench_refuses_existing_tables_and_writes_nothing():
    _, database = task_and_db()
    db = relsql.connect({"customers": pd.DataFrame({"x": [1, 2]})})
    with pytest.raises(SchemaError, match="already has table"):
        rb.from_relbench(database, db)
    assert db.tables() == ["customers"] and db.given_keys is None


def test_from_relbench_refuses_what_is_not_a_relbench_database():
    with pytest.raises(SchemaError, match="table_dict"):
        rb.from_relbench({"customers": pd.DataFrame({"x": [1]})})


def test_task_table_holds_relbench_splits_in_order():
    task, database = task_and_db()
    db = rb.from_relbench(database, tasks={"again": task})
    info = rb.tasks(db)["again"]
    tables = {s: task.get_table(s, mask_input_cols=False).df for s in rb.SPLITS}
    assert info.rows == {s: len(tables[s]) for s in rb.SPLITS} and info.ordered
    stored = db.con.execute('SELECT * FROM "again" ORDER BY id').fetch_df()
    expected = pd.concat([tables[s] for s in rb.SPLITS], ignore_index=True)
    np.testing.assert_array_equal(stored["customer_id"].to_numpy(), expected["customer_id"].to_numpy())
    np.testing.assert_array_equal(stored["again"].to_numpy(), expected["again"].to_numpy())
    assert (stored["date"].to_numpy() == expected["date"].to_numpy()).all()
    keys = schema(db, db.catalog(), infer=False)
    assert keys.primary_keys["again"] == ("id",)
    assert ("again", ("customer_id",), "customers") in [(c, fk.columns, fk.table) for c, fk in keys.foreign_keys]
    assert rb.time_columns(db)["again"] == "date"


def test_task_trains_on_exactly_relbench_split_and_scores_with_relbench_metrics():
    task, database = task_and_db()
    db = rb.from_relbench(database, tasks={"again": task})
    info = rb.tasks(db)["again"]
    options = info.model_options()
    template = Template.auto(db, target=options["target"], time_column="date", time_columns=rb.time_columns(db), width=8,
                             numbers="standardized")
    model = relsql.Model(db, template, **options)
    model.fit(epochs=15, patience=15, hybrid=False)
    frame = model.predict().to_pandas().sort_values("id")
    bounds = np.cumsum([0] + [info.rows[s] for s in rb.SPLITS])
    expected = np.repeat(np.array(rb.SPLITS, dtype=object), np.diff(bounds))
    np.testing.assert_array_equal(frame["split"].to_numpy(), expected)  # RelBench's rows, split for split
    for split in ("val", "test"):
        table = task.get_table(split, mask_input_cols=False)
        part = frame.iloc[bounds[rb.SPLITS.index(split)]:bounds[rb.SPLITS.index(split) + 1]]
        probability = part["probability"].to_numpy()
        ours = rb.evaluate(model, "again", split)
        theirs = task.evaluate(probability, table)
        assert ours["roc_auc"] == pytest.approx(theirs["roc_auc"], abs=1e-12)
        y = table.df["again"].to_numpy()
        assert ours["average_precision"] == pytest.approx(skm.average_precision_score(y, probability), abs=1e-12)
        assert ours["accuracy"] == pytest.approx(skm.accuracy_score(y, part["prediction"].to_numpy()), abs=1e-12)
        assert ours["f1"] == pytest.approx(skm.f1_score(y, part["prediction"].to_numpy()), abs=1e-12)


def test_task_without_target_or_time_order_is_refused_for_training():
    rows = {"train": 1, "val": 1, "test": 1}
    nameless = rb.RelbenchTask("t", "", "date", "recommendation", {"a": "x", "b": "y"}, rows, rows, True)
    with pytest.raises(relsql.RelsqlError, match="names no target column"):
        nameless.model_options()
    unordered = rb.RelbenchTask("t", "b", "date", "recommendation", {"a": "x", "b": "y"}, rows, rows, False, eval_k=10)
    assert unordered.link
    with pytest.raises(relsql.RelsqlError, match="not ordered by time"):
        unordered.model_options()


# -- metrics -------------------------------------------------------------------------------------------------------
def test_metrics_match_scikit_learn():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 500).astype(float)
    score = np.round(rng.uniform(0, 1, 500) + 0.3 * y, 1)  # many ties
    found = rb.metrics("binary_classification", y, (score > 0.5).astype(float), score)
    assert found["roc_auc"] == pytest.approx(skm.roc_auc_score(y, score), abs=1e-12)
    assert found["average_precision"] == pytest.approx(skm.average_precision_score(y, score), abs=1e-12)
    assert found["f1"] == pytest.approx(skm.f1_score(y, score > 0.5), abs=1e-12)
    target = rng.normal(size=300)
    guess = target + rng.normal(scale=0.5, size=300)
    found = rb.metrics("regression", target, guess, train_std=2.0)
    assert found["mae"] == pytest.approx(skm.mean_absolute_error(target, guess), abs=1e-12)
    assert found["rmse"] == pytest.approx(np.sqrt(skm.mean_squared_error(target, guess)), abs=1e-12)
    assert found["r2"] == pytest.approx(skm.r2_score(target, guess), abs=1e-12)
    nmae = relbench_metrics.make_nmae(lambda: 2.0)
    assert found["nmae"] == pytest.approx(nmae(target, guess), abs=1e-12)
    classes = rng.integers(0, 4, 200).astype(float)
    guessed = np.where(rng.uniform(size=200) < 0.6, classes, rng.integers(0, 4, 200)).astype(float)
    found = rb.metrics("multiclass_classification", classes, guessed)
    assert found["f1"] == pytest.approx(skm.f1_score(classes, guessed, average="macro"), abs=1e-12)


# -- dataset folders -----------------------------------------------------------------------------------------------
def write_manifest_folder(root, task) -> None:
    """RelBench 3's layout, written with relbench's own manifest classes."""
    database = task.dataset.make_db()
    specs = {name: relbench_manifest.TableSpec(t.pkey_col, t.time_col, dict(t.fkey_col_to_pkey_table))
             for name, t in database.table_dict.items()}
    relbench_manifest.DatasetManifest("rel-shop", str(VAL.date()), str(TEST.date()), tables=specs).save(root / "manifest.yaml")
    (root / "db").mkdir()
    for name, table in database.table_dict.items():
        table.df.to_parquet(root / "db" / f"{name}.parquet", index=False)
    folder = root / "tasks" / "orders-again"
    relbench_manifest.TaskManifest("orders-again", "external", "binary_classification", entity_table="customers",
                                   entity_col="customer_id", target_col="again", time_col="date",
                                   timedelta="30 days").save(folder / "manifest.yaml")
    for split in rb.SPLITS:
        task.get_table(split, mask_input_cols=False).df.to_parquet(folder / f"{split}.parquet", index=False)


def write_metadata_folder(root, task) -> None:
    """The layout before manifests: relbench's keys as JSON in each Parquet file's metadata."""
    def save(table, path) -> None:
        data = pa.Table.from_pandas(table.df, preserve_index=False)
        extra = {"fkey_col_to_pkey_table": table.fkey_col_to_pkey_table, "pkey_col": table.pkey_col, "time_col": table.time_col}
        data = data.replace_schema_metadata({**data.schema.metadata, **{k: json.dumps(v).encode() for k, v in extra.items()}})
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(data, path)

    for name, table in task.dataset.make_db().table_dict.items():
        save(table, root / "db" / f"{name}.parquet")
    for split in rb.SPLITS:
        save(task.get_table(split, mask_input_cols=False), root / "tasks" / "orders-again" / f"{split}.parquet")


@pytest.mark.parametrize("layout", ["manifest", "metadata"])
def test_dataset_folder_keys_time_columns_and_task(tmp_path, layout):
    task, _ = task_and_db()
    (write_manifest_folder if layout == "manifest" else write_metadata_folder)(tmp_path, task)
    db = relsql.connect(tmp_path)
    assert db.tables() == ["customers", "orders", "orders_again"]
    catalog = db.catalog()
    assert catalog["customers"].primary_key == ("customer_id",)
    assert catalog["orders"].primary_key == ("order_id",)
    assert [str(fk) for fk in catalog["orders"].foreign_keys] == ["(customer_id) -> customers(customer_id)"]
    assert catalog["orders_again"].primary_key == ("id",)
    assert [str(fk) for fk in catalog["orders_again"].foreign_keys] == ["(customer_id) -> customers(customer_id)"]
    assert rb.time_columns(db) == {"orders": "date", "orders_again": "date"}
    info = rb.tasks(db)["orders_again"]
    assert info.target == "again" and info.ordered
    assert info.task_type == ("binary_classification" if layout == "manifest" else "")
    tables = {s: task.get_table(s, mask_input_cols=False).df for s in rb.SPLITS}
    assert info.rows == {s: len(tables[s]) for s in rb.SPLITS}
    stored = db.con.execute('SELECT * FROM "orders_again" ORDER BY id').fetch_df()
    expected = pd.concat([tables[s] for s in rb.SPLITS], ignore_index=True)
    np.testing.assert_array_equal(stored["id"].to_numpy(), np.arange(len(expected)))
    np.testing.assert_array_equal(stored["again"].to_numpy(), expected["again"].to_numpy())
    if layout == "manifest":  # relbench's own loader reads the same folder the same way
        loaded = relbench_load.load_dataset(tmp_path)
        theirs = loaded.load_task("orders-again").get_table("val", mask_input_cols=False).df
        ours = stored.iloc[info.rows["train"]:info.rows["train"] + info.rows["val"]]
        np.testing.assert_array_equal(ours["customer_id"].to_numpy(), theirs["customer_id"].to_numpy())
        np.testing.assert_array_equal(ours["again"].to_numpy(), theirs["again"].to_numpy())
    model = relsql.Model(db, Template.auto(db, target="orders_again.again", time_column="date", width=4, hops=1),
                         **info.model_options())
    assert {s: len(model.learner.rows[s]) for s in rb.SPLITS} == info.labelled


def test_broken_manifest_is_a_clear_error(tmp_path):
    task, _ = task_and_db()
    write_manifest_folder(tmp_path, task)
    (tmp_path / "manifest.yaml").write_text("tables: [unclosed\n")
    with pytest.raises(relsql.RelsqlError, match="not valid YAML"):
        relsql.connect(tmp_path)
    (tmp_path / "manifest.yaml").write_text("tables:\n  orders: {pkey: nope}\n")
    with pytest.raises(relsql.RelsqlError, match="has no column `nope`"):
        relsql.connect(tmp_path)
