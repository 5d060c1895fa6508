"""RelBench link (recommendation) tasks through both routes, issue 45: a task table whose
destination column is a list of keys (`product_id BIGINT[]`, eval_k 10) trains as a ranking target
from `relsql.from_relbench` and from a RelBench dataset folder, with the same table names on both
routes; `relsql.relbench.evaluate` equals relbench's own `task.evaluate` on the [n, k] array
`relsql.relbench.recommendations` gives. A dataset folder is never written into. The user's common
mistakes are RelsqlErrors naming the fix.

Oracles: relbench's own classes (Dataset, RecommendationTask, EntityTask, manifests, its loader)
and its `task.evaluate`. Everything is built here (nothing downloaded)."""

from __future__ import annotations

import importlib
import json
import os
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

relbench_base = importlib.import_module("relbench.base")
relbench_load = importlib.import_module("relbench.load")
relbench_manifest = importlib.import_module("relbench.manifest")
relbench_metrics = importlib.import_module("relbench.metrics")

import relsql  # noqa: E402
from relsql import relbench as rb  # noqa: E402
from relsql.cli import main  # noqa: E402
from relsql.data.keys import schema  # noqa: E402

VAL, TEST = pd.Timestamp("2021-07-01"), pd.Timestamp("2021-09-01")
DELTA = pd.Timedelta(days=30)
LINK, CHURN = "customer-product", "customer-churn"  # RelBench's task names; relsql's tables: customer_product, ...
FIT = {"epochs": 12, "patience": 12, "time_budget": None}


def shop_frames(seed: int = 0, customers: int = 100, products: int = 25) -> dict[str, pd.DataFrame]:
    """Customers buying products; each customer prefers a few products (so history predicts)."""
    rng = np.random.default_rng(seed)
    people = pd.DataFrame({"customer_id": np.arange(customers), "age": rng.uniform(18, 80, customers)})
    goods = pd.DataFrame({"product_id": np.arange(products), "price": rng.gamma(2, 10, products)})
    rows = []
    for c in range(customers):
        liked = rng.choice(products, 3, replace=False)
        for day in np.flatnonzero(rng.uniform(0, 1, 330) < 0.04):
            item = liked[rng.integers(3)] if rng.uniform() < 0.7 else rng.integers(products)
            rows.append((c, int(item), pd.Timestamp("2021-01-01") + pd.Timedelta(days=int(day))))
    sales = pd.DataFrame(rows, columns=["customer_id", "product_id", "date"]).sort_values("date", kind="stable")
    sales.insert(0, "sale_id", np.arange(len(sales)))
    return {"customers": people, "products": goods, "sales": sales.reset_index(drop=True)}


class Shop(relbench_base.Dataset):
    val_timestamp, test_timestamp = VAL, TEST

    def __init__(self):
        self.frames = shop_frames()

    def make_db(self):
        f = self.frames
        return relbench_base.Database({
            "customers": relbench_base.Table(f["customers"].copy(), {}, pkey_col="customer_id"),
            "products": relbench_base.Table(f["products"].copy(), {}, pkey_col="product_id"),
            "sales": relbench_base.Table(f["sales"].copy(), {"customer_id": "customers", "product_id": "products"},
                                         pkey_col="sale_id", time_col="date")})


def _window(db, t):
    sales = db.table_dict["sales"].df
    return sales[(sales["date"] > t) & (sales["date"] <= t + DELTA)]


class CustomerProduct(relbench_base.RecommendationTask):
    """The products a customer buys in the next 30 days (relbench's link task: lists, MAP@10)."""

    task_type = relbench_base.TaskType.RECOMMENDATION
    src_entity_col, src_entity_table, dst_entity_col, dst_entity_table = "customer_id", "customers", "product_id", "products"
    time_col, timedelta, eval_k = "date", DELTA, 10
    metrics = [relbench_metrics.map]

    def make_table(self, db, timestamps):
        frames = []
        for t in timestamps:
            bought = _window(db, t).groupby("customer_id")["product_id"].apply(lambda s: sorted(set(s))).reset_index()
            bought["date"] = t
            frames.append(bought[["date", "customer_id", "product_id"]])
        return relbench_base.Table(pd.concat(frames, ignore_index=True),
                                   {"customer_id": "customers", "product_id": "products"}, None, "date")


class CustomerChurn(relbench_base.EntityTask):
    """Does a customer buy nothing in the next 30 days?"""

    task_type = relbench_base.TaskType.BINARY_CLASSIFICATION
    entity_col, entity_table, time_col, target_col = "customer_id", "customers", "date", "churn"
    timedelta = DELTA
    metrics = [relbench_metrics.roc_auc]

    def make_table(self, db, timestamps):
        people = db.table_dict["customers"].df["customer_id"]
        frames = [pd.DataFrame({"date": t, "customer_id": people,
                                "churn": (~people.isin(set(_window(db, t)["customer_id"]))).astype(int)})
                  for t in timestamps]
        return relbench_base.Table(pd.concat(frames, ignore_index=True), {"customer_id": "customers"}, None, "date")


@pytest.fixture(scope="module")
def shop():
    """The dataset, its relbench Database and both tasks."""
    dataset = Shop()
    return dataset, dataset.get_db(), {LINK: CustomerProduct(dataset), CHURN: CustomerChurn(dataset)}


@pytest.fixture(scope="module")
def labels(shop):
    """{task: {split: relbench Table}}: relbench computes them on every get_table call, so once here."""
    return {name: {s: task.get_table(s, mask_input_cols=False) for s in rb.SPLITS} for name, task in shop[2].items()}


def write_folder(root, shop, labels) -> None:
    """RelBench 3's layout, written with relbench's own manifest classes."""
    _, database, _ = shop
    specs = {name: relbench_manifest.TableSpec(t.pkey_col, t.time_col, dict(t.fkey_col_to_pkey_table))
             for name, t in database.table_dict.items()}
    relbench_manifest.DatasetManifest("rel-shop", str(VAL.date()), str(TEST.date()), tables=specs).save(root / "manifest.yaml")
    (root / "db").mkdir()
    for name, table in database.table_dict.items():
        table.df.to_parquet(root / "db" / f"{name}.parquet", index=False)
    manifests = {
        LINK: relbench_manifest.TaskManifest(LINK, "external", "recommendation", src_entity_table="customers",
                                             src_entity_col="customer_id", dst_entity_table="products",
                                             dst_entity_col="product_id", time_col="date", eval_k=10, timedelta="30 days"),
        CHURN: relbench_manifest.TaskManifest(CHURN, "external", "binary_classification", entity_table="customers",
                                              entity_col="customer_id", target_col="churn", time_col="date",
                                              timedelta="30 days")}
    for name, manifest in manifests.items():
        manifest.save(root / "tasks" / name / "manifest.yaml")
        for split in rb.SPLITS:
            labels[name][split].df.to_parquet(root / "tasks" / name / f"{split}.parquet", index=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, shop, labels):
    root = tmp_path_factory.mktemp("rel-shop")
    write_folder(root, shop, labels)
    return root


@pytest.fixture(scope="module")
def trained(shop, tmp_path_factory):
    """A link model trained through from_relbench with the documented lines, saved."""
    _, database, tasks = shop
    db = relsql.from_relbench(database, tasks=tasks)
    t = rb.tasks(db)["customer_product"]
    model = relsql.Model(db, relsql.Template.auto(db, t.name, time_column=t.time_column), **t.model_options()).fit(**FIT)
    path = model.save(tmp_path_factory.mktemp("model") / "link.pt")
    return db, model, path


def files_in(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)


# -- the task tables ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_link_task_is_one_ranking_target_with_the_same_name_on_both_routes(shop, labels, folder):
    _, database, tasks = shop
    ours = relsql.from_relbench(database, tasks=tasks)
    theirs = relsql.connect(folder)
    table = {s: labels[LINK][s].df for s in rb.SPLITS}
    for db in (ours, theirs):
        info = rb.tasks(db)["customer_product"]
        assert info.link and info.target == "product_id" and info.eval_k == 10
        assert info.rows == info.labelled == {s: len(table[s]) for s in rb.SPLITS} and info.ordered
        assert info.model_options() == {"target": "customer_product.product_id", "time_column": "date",
                                        "split": tuple(len(table[s]) / sum(map(len, table.values())) for s in rb.SPLITS)}
        assert dict(db.columns("customer_product"))["product_id"].endswith("[]")
        keys = schema(db, db.catalog(), infer=False)  # the list references products, and is never joined
        listed = [(c, fk.columns, fk.table) for c, fk in keys.list_references]
        assert listed == [("customer_product", ("product_id",), "products")]
        assert ("customer_product", ("product_id",)) not in [(c, fk.columns) for c, fk in keys.foreign_keys]
        assert "customer_churn" in rb.tasks(db) and not rb.tasks(db)["customer_churn"].link
    stored = ours.con.execute('SELECT product_id FROM "customer_product" ORDER BY id').fetchall()
    expected = pd.concat([table[s] for s in rb.SPLITS], ignore_index=True)
    assert [list(r[0]) for r in stored] == [list(v) for v in expected["product_id"]]


def test_tasks_given_as_relbench_loaded_list_take_their_names(folder):
    loaded = relbench_load.load_dataset(folder)
    task = loaded.load_task(LINK)
    db = relsql.from_relbench(loaded.get_db(), tasks=[task])
    assert list(rb.tasks(db)) == ["customer_product"]
    with pytest.raises(relsql.RelsqlError, match="has no `name`"):
        relsql.from_relbench(loaded.get_db(), tasks=[CustomerProduct(Shop())])


# -- training and RelBench's metric ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_link_task_trains_and_scores_as_relbench_evaluate(shop, labels, trained):
    _, _, tasks = shop
    db, model, _ = trained
    info = rb.tasks(db)["customer_product"]
    assert {s: len(model.rows[s]) for s in rb.SPLITS} == info.labelled  # RelBench's rows, split for split
    for split in ("val", "test"):
        table = labels[LINK][split]
        predicted = rb.recommendations(model, info, split)
        assert predicted.shape == (len(table), 10)
        theirs = tasks[LINK].evaluate(predicted, table)
        ours = rb.evaluate(model, "customer_product", split)
        assert ours == pytest.approx(theirs, abs=1e-12) and ours["map"] > 0
    # relsql's own MAP@10 over the test rows is RelBench's: the same rows and positives
    assert model.evaluate("test")["map@10"] == pytest.approx(rb.evaluate(model, info)["map"], abs=1e-9)
    assert rb.evaluate(model, info, k=10)["map"] > model.baseline("test")["map@10"]  # it learned the customers' tastes


@pytest.mark.slow
def test_a_model_trained_on_from_relbench_loads_on_the_dataset_folder(folder, trained):
    db, model, path = trained
    loaded = relsql.Model.load(path, relsql.connect(folder))
    expected = rb.recommendations(model, "customer_product", "test")
    np.testing.assert_array_equal(rb.recommendations(loaded, "customer_product", "test"), expected)
    relbench_task = relbench_load.load_dataset(folder).load_task(LINK)  # relbench's own loader and metric
    table = relbench_task.get_table("test", mask_input_cols=False)
    assert rb.evaluate(loaded, "customer_product") == pytest.approx(relbench_task.evaluate(expected, table), abs=1e-12)


# -- mistakes ------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_common_mistakes_are_relsql_errors_naming_the_fix(shop, trained):
    _, database, tasks = shop
    db, model, path = trained
    with pytest.raises(relsql.RelsqlError, match=r"not relbench's CustomerProduct.*tasks\(db\)\['customer_product'\]"):
        rb.evaluate(model, tasks[LINK])
    with pytest.raises(relsql.RelsqlError, match=r"relbench's Database.*relsql.from_relbench"):
        relsql.Model.load(path, database)
    with pytest.raises(relsql.RelsqlError, match=r"chosen by its key `id`.*Model.load\(path, db\).recommend"):
        model.recommend(keys={"customer_id": [1], "date": [TEST]})


# -- a dataset folder is read, never written ------------------------------------------------------------------------
@pytest.mark.slow
def test_nothing_is_written_into_a_dataset_folder(folder, tmp_path, capsys):
    before = files_in(folder)
    db = relsql.connect(folder)
    t = rb.tasks(db)["customer_churn"]
    model = relsql.Model(db, relsql.Template.auto(db, t.name, time_column=t.time_column, width=4, hops=1),
                         **t.model_options()).fit(epochs=2, time_budget=None)
    with pytest.raises(relsql.RelsqlError, match="RelBench dataset.*--out"):
        model.write_predictions("preds")
    path = model.save(tmp_path / "churn.pt")
    capsys.readouterr()
    assert main(["predict", str(folder), "--model", str(path), "--table", "preds"]) == 1
    assert "--out" in capsys.readouterr().err
    assert main(["predict", str(folder), "--model", str(path), "--out", str(tmp_path / "preds.parquet")]) == 0
    assert (tmp_path / "preds.parquet").is_file()
    assert files_in(folder) == before
    assert "preds" not in relsql.connect(folder).tables()


@pytest.mark.slow
def test_cli_trains_a_link_task_on_the_folder_without_a_plot(folder, tmp_path, capsys):
    before = files_in(folder)
    assert main(["inspect", str(folder)]) == 0
    assert re.search(r"product_id +BIGINT\[\] +FK -> products\.product_id", capsys.readouterr().out)
    model = tmp_path / "rec.pt"
    assert main(["train", str(folder), "--target", "customer_product.product_id", "--time-column", "date",
                 "--epochs", "3", "--model", str(model)]) == 0
    out = capsys.readouterr().out
    assert model.is_file() and not model.with_suffix(".png").exists() and "metrics plot" not in out
    assert main(["recommend", str(folder), "--model", str(model), "--table", "recs"]) == 1
    assert "--out" in capsys.readouterr().err
    assert files_in(folder) == before


@pytest.mark.slow
def test_entity_time_pairs_are_refused_as_keys_and_predicted_as_new_task_rows(shop, tmp_path):
    _, database, tasks = shop
    db = relsql.from_relbench(database, tasks={CHURN: tasks[CHURN]})
    t = rb.tasks(db)["customer_churn"]
    model = relsql.Model(db, relsql.Template.auto(db, t.name, time_column=t.time_column, width=4, hops=1),
                         **t.model_options()).fit(epochs=2, time_budget=None)
    with pytest.raises(relsql.RelsqlError, match=r"chosen by its key `id`.*NULL churn.*predict\(where=\"churn IS NULL\"\)"):
        model.predict(keys={"customer_id": [3], "date": [TEST]})
    path = model.save(tmp_path / "churn.pt")
    last = sum(t.rows.values()) - 1  # the error's recipe: the pairs as new rows with a NULL label, then Model.load
    db.con.execute(f'INSERT INTO "customer_churn" (id, customer_id, date) SELECT {last + 1}, customer_id, date '
                   f'FROM "customer_churn" WHERE id = {last}')
    new = relsql.Model.load(path, db).predict(where="churn IS NULL")
    assert new["id"].to_list() == [last + 1]
    same = model.predict(keys={"id": [last]})  # the same (customer, time) pair, scored as the task's own row
    assert new["probability"][0] == pytest.approx(same["probability"][0], abs=1e-6)


def test_link_task_in_the_layout_before_manifests(tmp_path, shop, labels):
    """relbench's Table.save wrote its keys into each Parquet footer; a link task's list column is its target."""
    def save(table, path) -> None:
        data = pa.Table.from_pandas(table.df, preserve_index=False)
        extra = {"fkey_col_to_pkey_table": table.fkey_col_to_pkey_table, "pkey_col": table.pkey_col, "time_col": table.time_col}
        data = data.replace_schema_metadata({**data.schema.metadata, **{k: json.dumps(v).encode() for k, v in extra.items()}})
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(data, path)

    for name, table in shop[1].table_dict.items():
        save(table, tmp_path / "db" / f"{name}.parquet")
    for split in rb.SPLITS:
        save(labels[LINK][split], tmp_path / "tasks" / LINK / f"{split}.parquet")
    info = rb.tasks(relsql.connect(tmp_path))["customer_product"]
    assert info.link and info.target == "product_id" and info.eval_k is None
    assert info.model_options()["target"] == "customer_product.product_id"


def test_a_link_list_named_unlike_its_key_references_the_declared_table():
    """rel-stack's user-post-comment lists `post_id`s of posts(Id): the given key says which table, not the name."""
    from types import SimpleNamespace

    from relsql.data.references import Reference, referenced

    day = [pd.Timestamp("2020-01-01") + pd.Timedelta(days=10 * i) for i in range(6)]
    database = SimpleNamespace(table_dict={
        "users": SimpleNamespace(df=pd.DataFrame({"Id": [0, 1]}), fkey_col_to_pkey_table={}, pkey_col="Id", time_col=None),
        "posts": SimpleNamespace(df=pd.DataFrame({"Id": [0, 1, 2], "OwnerUserId": [0, 1, 1], "made": day[:3]}),
                                 fkey_col_to_pkey_table={"OwnerUserId": "users"}, pkey_col="Id", time_col="made")})

    class Comments:
        src_entity_col, src_entity_table, dst_entity_col, dst_entity_table = "user_id", "users", "post_id", "posts"
        time_col, eval_k, task_type = "date", 2, "recommendation"

        def get_table(self, split, mask_input_cols=False):
            at = day[3 + rb.SPLITS.index(split)]
            return SimpleNamespace(df=pd.DataFrame({"date": [at, at], "user_id": [0, 1], "post_id": [[1, 2], [0]]}))

    db = relsql.from_relbench(database, tasks={"user-post-comment": Comments()})
    assert rb.tasks(db)["user_post_comment"].link
    assert referenced(db, "user_post_comment", "post_id") == Reference("posts", "Id", True)


def test_an_automatic_template_never_reads_another_tasks_table(shop):
    """A task table's rows hold labels of events after their time; another task's windows need not
    line up with the target's, so Template.auto leaves every other RelBench task table out."""
    _, database, tasks = shop
    db = relsql.from_relbench(database, tasks=tasks)
    churn = rb.tasks(db)["customer_churn"]
    def read(target: rb.RelbenchTask) -> str:
        source = relsql.Template.auto(db, target.name, time_column=target.time_column).source
        return "\n".join(line for line in source.splitlines() if not line.startswith("--"))  # statements only

    link = rb.tasks(db)["customer_product"]
    assert "customer_product" not in read(churn) and "customer_churn" in read(churn)
    assert "customer_churn" not in read(link) and "customer_product" in read(link)


@pytest.mark.slow
def test_a_relbench_users_script_trains_both_task_kinds_with_relbenchs_metrics(folder):
    """The bar of issue 45: RelBench's own loader, then relsql in a few lines, for an entity task and a
    link task; the metrics relsql reports are those relbench's task.evaluate gives on the same predictions."""
    dataset = relbench_load.load_dataset(folder)                                   # relbench's own
    tasks = [dataset.load_task(LINK), dataset.load_task(CHURN)]
    db = relsql.from_relbench(dataset.get_db(), tasks=tasks)                       # relsql: these lines
    scores, models = {}, {}
    for name in ("customer_product", "customer_churn"):
        t = relsql.relbench.tasks(db)[name]
        models[name] = relsql.Model(db, relsql.Template.auto(db, t.name, time_column=t.time_column),
                                    **t.model_options()).fit(**FIT)
        scores[name] = relsql.relbench.evaluate(models[name], t, "test")
    link, churn = tasks
    table = link.get_table("test", mask_input_cols=False)
    assert scores["customer_product"] == pytest.approx(
        link.evaluate(rb.recommendations(models["customer_product"], "customer_product", "test"), table), abs=1e-12)
    info = rb.tasks(db)["customer_churn"]
    first = info.rows["train"] + info.rows["val"]
    frame = models["customer_churn"].predict().sort(info.key)[first:first + info.rows["test"]]
    table = churn.get_table("test", mask_input_cols=False)
    theirs = churn.evaluate(frame["probability"].to_numpy(), table)
    assert theirs and scores["customer_churn"]["roc_auc"] == pytest.approx(theirs["roc_auc"], abs=1e-12)
