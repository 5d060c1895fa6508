"""A seeded shop whose label is decided two foreign-key hops away from the target table.

Tables (``foreign_keys=True`` declares the keys, ``False`` creates the same tables with no
constraints at all, so that key inference has something to infer)::

    customer(customer_id INTEGER PRIMARY KEY, age DOUBLE, region VARCHAR, signup DATE, churned BOOLEAN)
    product(product_id INTEGER PRIMARY KEY, price DOUBLE, category VARCHAR, quality DOUBLE)
    orders(order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer,
           product_id INTEGER REFERENCES product, quantity INTEGER, ordered_at DATE)

The planted rule (``RULE``): before noise, a customer churned iff the average ``quality`` of
the products of its orders (one term per order row, whatever the quantity) is below
``THRESHOLD`` = 0.5; then exactly ``round(NOISE * customers)`` customers, drawn at random, have
their label flipped (NOISE = 0.1), so the rule agrees with ``churned`` on exactly 90% of them.

Everything else is independent noise: the customer's own columns (age, region, signup; regions
are dealt out evenly within each class, so the churn rate is the same in every region), a
product's price and category, an order's quantity and date (``ordered_at`` is after
``signup``, which ties those two together but to nothing else). Product qualities are the
evenly spaced values (i + 0.5) / products in a random order (mean exactly 0.5) and each order
picks its product uniformly, so the classes come out roughly balanced.
"""

from __future__ import annotations

import datetime

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot.expressions as exp

from relsql.errors import SourceError

__all__ = ["NOISE", "REGIONS", "CATEGORIES", "RULE", "TABLES", "THRESHOLD", "build", "generate"]

TABLES = ("customer", "product", "orders")  # in foreign-key order
THRESHOLD = 0.5
NOISE = 0.1
MIN_ORDERS, MAX_ORDERS = 1, 8
REGIONS = ("north", "south", "east", "west", "central")
CATEGORIES = ("gadget", "book", "food", "toy", "garden")
RULE = (f"churned = (avg(product.quality) over the customer's orders < {THRESHOLD}), "
        f"then exactly round({NOISE} * customers) labels flipped at random")

EPOCH = datetime.date(2018, 1, 1)

# (name, type, primary key?, referenced table) per column, in order
SCHEMA: dict[str, list[tuple[str, str, bool, str | None]]] = {
    "customer": [("customer_id", "INTEGER", True, None), ("age", "DOUBLE", False, None), ("region", "VARCHAR", False, None),
                 ("signup", "DATE", False, None), ("churned", "BOOLEAN", False, None)],
    "product": [("product_id", "INTEGER", True, None), ("price", "DOUBLE", False, None), ("category", "VARCHAR", False, None),
                ("quality", "DOUBLE", False, None)],
    "orders": [("order_id", "INTEGER", True, None), ("customer_id", "INTEGER", False, "customer"),
               ("product_id", "INTEGER", False, "product"), ("quantity", "INTEGER", False, None),
               ("ordered_at", "DATE", False, None)],
}
ARROW_TYPES = {"INTEGER": pa.int32(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(), "DATE": pa.date32(), "BOOLEAN": pa.bool_()}


def _dates(days: np.ndarray) -> pa.Array:
    epoch = (EPOCH - datetime.date(1970, 1, 1)).days
    return pa.array((days + epoch).astype(np.int32), pa.date32())


def generate(*, customers: int = 2000, products: int = 200, seed: int = 0) -> dict[str, pa.Table]:
    """The three tables as Arrow tables (what ``build`` writes), a pure function of its arguments."""
    for name, value in (("customers", customers), ("products", products)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    rng = np.random.default_rng(seed)

    # products: quality is the only informative column
    quality = np.round((rng.permutation(products) + 0.5) / products, 6)
    product = {
        "product_id": np.arange(1, products + 1, dtype=np.int32),
        "price": np.round(rng.lognormal(3.0, 0.8, products), 2),
        "category": pa.array(np.asarray(CATEGORIES, dtype=object)[rng.integers(0, len(CATEGORIES), products)], pa.string()),
        "quality": quality,
    }

    # customers: own columns independent of everything else
    signup_days = rng.integers(0, 5 * 365, customers)
    n_orders = rng.integers(MIN_ORDERS, MAX_ORDERS + 1, customers)
    total = int(n_orders.sum())
    owner = np.repeat(np.arange(customers), n_orders)          # index of the customer of each order
    bought = rng.integers(0, products, total)                   # index of the product of each order
    avg_quality = np.bincount(owner, weights=quality[bought], minlength=customers) / n_orders
    churned = avg_quality < THRESHOLD
    flipped = rng.choice(customers, size=int(round(NOISE * customers)), replace=False)
    churned[flipped] = ~churned[flipped]
    # regions dealt out evenly within each class, so every region has the same churn rate (up to rounding)
    region = np.empty(customers, dtype=np.int64)
    for members in (np.flatnonzero(churned), np.flatnonzero(~churned)):
        region[members] = rng.permutation(np.arange(members.size) % len(REGIONS))
    customer = {
        "customer_id": np.arange(1, customers + 1, dtype=np.int32),
        "age": np.round(np.clip(rng.normal(42.0, 13.0, customers), 18.0, 90.0), 1),
        "region": pa.array(np.asarray(REGIONS, dtype=object)[region], pa.string()),
        "signup": _dates(signup_days),
        "churned": churned,
    }

    # orders: shuffled so that order_id says nothing about the customer
    shuffle = rng.permutation(total)
    owner, bought = owner[shuffle], bought[shuffle]
    orders = {
        "order_id": np.arange(1, total + 1, dtype=np.int32),
        "customer_id": (owner + 1).astype(np.int32),
        "product_id": (bought + 1).astype(np.int32),
        "quantity": rng.integers(1, 6, total).astype(np.int32),
        "ordered_at": _dates(signup_days[owner] + rng.integers(0, 365, total)),
    }

    data = {"customer": customer, "product": product, "orders": orders}
    return {name: pa.table({col: pa.array(data[name][col], ARROW_TYPES[typ]) for col, typ, _, _ in SCHEMA[name]})
            for name in TABLES}


def _create(name: str, foreign_keys: bool) -> exp.Create:
    columns = []
    for col, typ, pk, ref in SCHEMA[name]:
        constraints = []
        if foreign_keys and pk:
            constraints.append(exp.ColumnConstraint(kind=exp.PrimaryKeyColumnConstraint()))
        if foreign_keys and ref:
            target = exp.Schema(this=exp.to_table(ref), expressions=[exp.to_identifier(col)])
            constraints.append(exp.ColumnConstraint(kind=exp.Reference(this=target)))
        columns.append(exp.ColumnDef(this=exp.to_identifier(col), kind=exp.DataType.build(typ),
                                     constraints=constraints or None))
    return exp.Create(this=exp.Schema(this=exp.to_table(name), expressions=columns), kind="TABLE")


def _existing(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_catalog = current_database() AND table_schema = current_schema() "
        "AND table_name IN (SELECT unnest(?::VARCHAR[]))", [list(TABLES)]).fetchall()
    return sorted(r[0] for r in rows)


def build(con, *, customers: int = 2000, products: int = 200, seed: int = 0, foreign_keys: bool = True) -> dict[str, int]:
    """Create and fill ``customer``, ``product`` and ``orders`` in ``con``; return their row counts.

    ``con`` is a DuckDB connection or a ``relsql.Database`` (its ``.con``). The same arguments
    always give the same rows. Existing tables of these names are never overwritten (a
    ``SourceError``); the whole build is one transaction, so a failure leaves nothing behind.
    """
    con = getattr(con, "con", con)
    tables = generate(customers=customers, products=products, seed=seed)
    clash = _existing(con)
    if clash:
        raise SourceError(f"table(s) {', '.join(clash)} already exist in this database; the synthetic shop is not "
                          "built over them: drop them or build into another connection or schema")
    views = {name: f"__relsql_synthetic_{name}" for name in TABLES}
    counts: dict[str, int] = {}
    con.execute("BEGIN TRANSACTION")
    try:
        for name in TABLES:
            con.execute(_create(name, foreign_keys).sql("duckdb"))
            con.register(views[name], tables[name])
            columns = [col for col, *_ in SCHEMA[name]]
            insert = exp.insert(exp.select(*columns).from_(exp.to_table(views[name])), exp.to_table(name), columns=columns)
            con.execute(insert.sql("duckdb"))
            counts[name] = con.execute(exp.select("count(*)").from_(exp.to_table(name)).sql("duckdb")).fetchone()[0]
        con.execute("COMMIT")
    except duckdb.Error as err:
        con.execute("ROLLBACK")
        raise SourceError(f"building the synthetic shop failed (nothing was written): {str(err).splitlines()[0]}") from err
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        for view in views.values():
            try:
                con.unregister(view)
            except duckdb.Error:
                pass
    return counts
