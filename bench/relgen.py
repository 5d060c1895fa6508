"""Seeded relational databases with planted targets, for bench/quality.py.

Four schema shapes, each a structural causal model: a target column depends NONLINEARLY on its
own row and on related rows (thresholds of a child aggregate, a count of children, interactions
of a parent column with an own column, step functions of a low-cardinality code, 2-hop means),
plus noise.

- shop (a star): customer <- orders -> product
- retail (a chain of 4): region <- store <- visit <- line
- social (a snowflake): city <- member <- post -> app -> vendor
- bank (a time column on the event table): account <- txn -> merchant, txn.ts a TIMESTAMP

Every table has a declared PRIMARY KEY, every link a declared FOREIGN KEY; numeric columns have
1-10% NULLs; there are low-cardinality integer codes and text categories. Each target keeps its
noiseless `signal` (what the label was drawn from), computed from the tables AS WRITTEN (NULLs
included, replaced by the constants named in each formula), so it can be recomputed from the
database independently (tests/test_bench_quality.py does, in SQL).

`write(db, path, target)` writes one database file holding the tables and only that target's
column: a model of one target never sees another target as an input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

EPOCH = np.datetime64("2024-01-01T00:00:00")
LATE = np.datetime64("2024-11-01T00:00:00")  # bank: "recent" transactions are on or after this


@dataclass
class Table:
    name: str
    frame: pd.DataFrame  # columns in order; the first is the primary key
    foreign: dict[str, str] = field(default_factory=dict)  # column -> referenced table (its primary key)

    @property
    def key(self) -> str:
        return str(self.frame.columns[0])


@dataclass
class Target:
    name: str  # "table.column"
    kind: str  # binary | multiclass | regression
    values: np.ndarray  # the label of each row of the table, in row order
    signal: np.ndarray  # the noiseless score the label was drawn from
    how: str  # the formula, in words

    @property
    def table(self) -> str:
        return self.name.split(".")[0]

    @property
    def column(self) -> str:
        return self.name.split(".")[1]


@dataclass
class Database:
    name: str
    shape: str
    tables: dict[str, Table]  # parents before children
    targets: dict[str, Target]


# --------------------------------------------------------------------------- helpers
def _nulls(rng: np.random.Generator, x: np.ndarray, fraction: float) -> np.ndarray:
    """`x` (float) with a random `fraction` of its entries NaN (NULL once written)."""
    x = x.astype(np.float64).copy()
    x[rng.random(len(x)) < fraction] = np.nan
    return x


def _skewed_parents(rng: np.random.Generator, n_child: int, n_parent: int) -> np.ndarray:
    """Parent ids (1-based) for `n_child` rows, some parents much busier than others, some childless."""
    weight = rng.gamma(0.7, 1.0, n_parent)
    return rng.choice(n_parent, size=n_child, p=weight / weight.sum()) + 1


def _ids(n: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=np.int64)


def _per_parent(child: pd.DataFrame, fk: str, column: str | None, how: str, parents: np.ndarray) -> np.ndarray:
    """A child aggregate for each parent id in `parents` (count: 0 without children; others NaN),
    NULLs skipped as SQL's aggregates skip them."""
    if column is None:
        return child.groupby(fk).size().reindex(parents, fill_value=0).to_numpy(np.float64)
    return child.groupby(fk)[column].agg(how).reindex(parents).to_numpy(np.float64)


def _parent_column(child_fk: np.ndarray, parent: pd.DataFrame, column: str) -> np.ndarray:
    """The parent's `column` for each child row (parent ids are 1..n in order)."""
    return parent[column].to_numpy()[child_fk - 1]


def _fill(x: np.ndarray, value: float) -> np.ndarray:
    return np.where(np.isnan(x), value, x)


def _binary(rng: np.random.Generator, signal: np.ndarray, noise: float = 0.3) -> np.ndarray:
    """1 where signal + logistic noise is above the signal's median (about balanced)."""
    return (signal + noise * rng.logistic(size=len(signal)) > np.median(signal)).astype(np.int64)


def _classes(rng: np.random.Generator, signal: np.ndarray, names: list[str], noise: float = 0.3) -> np.ndarray:
    """Text classes by tertiles (or k-tiles) of signal + noise."""
    noisy = signal + noise * rng.standard_normal(len(signal))
    cuts = np.quantile(noisy, np.linspace(0, 1, len(names) + 1)[1:-1])
    return np.asarray(names, dtype=object)[np.searchsorted(cuts, noisy)]


def _regression(rng: np.random.Generator, signal: np.ndarray, noise: float = 0.1) -> np.ndarray:
    return signal + noise * signal.std() * rng.standard_normal(len(signal))


def _lookup(rng: np.random.Generator, size: int) -> np.ndarray:
    """A non-monotonic step function of a small code: a random value in {-1, 1} per code."""
    return rng.choice([-1.0, 1.0], size=size)


# --------------------------------------------------------------------------- shapes
def shop(seed: int, scale: float = 1.0) -> Database:
    """A star: customer <- orders -> product."""
    rng = np.random.default_rng([seed, 1])
    nc, np_, no = int(1000 * scale), int(600 * scale), int(5000 * scale)
    customer = pd.DataFrame({"customer_id": _ids(nc), "age": _nulls(rng, rng.uniform(18, 80, nc), 0.05),
                             "income": _nulls(rng, rng.lognormal(10, 0.5, nc), 0.08),
                             "segment": rng.choice(["A", "B", "C", "D"], nc), "region": rng.integers(1, 13, nc)})
    product = pd.DataFrame({"product_id": _ids(np_), "price": _nulls(rng, rng.lognormal(3, 0.6, np_), 0.03),
                            "weight": _nulls(rng, rng.uniform(0.1, 20, np_), 0.03),
                            "category": rng.choice([f"cat{i}" for i in range(8)], np_), "rating": rng.integers(1, 6, np_)})
    orders = pd.DataFrame({"order_id": _ids(no), "customer_id": _skewed_parents(rng, no, nc),
                           "product_id": rng.integers(1, np_ + 1, no), "quantity": rng.integers(1, 10, no),
                           "discount": _nulls(rng, rng.uniform(0, 0.5, no), 0.10), "channel": rng.integers(0, 4, no)})
    region_step, channel_step = _lookup(rng, 13), np.array([0.8, -0.6, 0.3, -1.0])

    # customer.churned: few orders, a step function of region, the mean price of what they bought (2 hops) x segment
    orders["_price"] = _parent_column(orders.product_id.to_numpy(), product, "price")
    n_orders = _per_parent(orders, "customer_id", None, "count", customer.customer_id.to_numpy())
    mean_price = _fill(_per_parent(orders, "customer_id", "_price", "mean", customer.customer_id.to_numpy()), 20.0)
    sign = np.where(customer.segment.isin(["A", "B"]), 1.0, -1.0)
    churn = 1.5 * (n_orders < 3) + region_step[customer.region.to_numpy()] + 1.2 * sign * np.tanh((mean_price - 22.0) / 6.0)
    # product.return_rate: a threshold of its orders' mean quantity, heavy items' log price, a count of orders
    mean_qty = _fill(_per_parent(orders, "product_id", "quantity", "mean", product.product_id.to_numpy()), 5.0)
    n_sold = _per_parent(orders, "product_id", None, "count", product.product_id.to_numpy())
    heavy = _fill(product.weight.to_numpy(), 10.0) > 10.0
    returns = (2.0 * np.tanh((mean_qty - 5.0) / 1.0) + heavy * np.log(_fill(product.price.to_numpy(), 20.0)) / 2.0
               + 0.5 * np.sqrt(n_sold))
    # orders.priority: the customer's log income x the order's discount, and the channel's step
    income = np.log(_fill(_parent_column(orders.customer_id.to_numpy(), customer, "income"), 22026.0))
    priority = (income - 10.0) * 4.0 * (_fill(orders.discount.to_numpy(), 0.25) - 0.25) + channel_step[orders.channel.to_numpy()]
    orders = orders.drop(columns="_price")

    tables = {t.name: t for t in (Table("customer", customer), Table("product", product),
                                  Table("orders", orders, {"customer_id": "customer", "product_id": "product"}))}
    targets = [
        Target("customer.churned", "binary", _binary(rng, churn), churn,
               "1.5*[orders < 3] + step(region) + 1.2*(segment in A,B ? 1 : -1)"
               "*tanh((avg product price of its orders, NULL->20) - 22)/6)"),
        Target("product.return_rate", "regression", _regression(rng, returns), returns,
               "2*tanh(avg order quantity (NULL->5) - 5) + [weight (NULL->10) > 10]*ln(price (NULL->20))/2 + 0.5*sqrt(#orders)"),
        Target("orders.priority", "multiclass", _classes(rng, priority, ["high", "low", "mid"]), priority,
               "(ln(customer income, NULL->e^10) - 10)*4*(discount (NULL->0.25) - 0.25) + step(channel); tertiles"),
    ]
    return Database("shop", "star", tables, {t.name: t for t in targets})


def retail(seed: int, scale: float = 1.0) -> Database:
    """A chain of 4: region <- store <- visit <- line."""
    rng = np.random.default_rng([seed, 2])
    nr, ns, nv, nl = int(500 * scale), int(1500 * scale), int(5000 * scale), int(5000 * scale)
    region = pd.DataFrame({"region_id": _ids(nr), "climate": rng.choice(["hot", "mild", "cold"], nr),
                           "tax": _nulls(rng, rng.uniform(0, 0.3, nr), 0.05)})
    store = pd.DataFrame({"store_id": _ids(ns), "region_id": _skewed_parents(rng, ns, nr),
                          "size": _nulls(rng, rng.lognormal(6, 0.7, ns), 0.06), "kind": rng.integers(0, 6, ns)})
    visit = pd.DataFrame({"visit_id": _ids(nv), "store_id": _skewed_parents(rng, nv, ns),
                          "spend": _nulls(rng, rng.gamma(2.0, 30.0, nv), 0.05), "hour": rng.integers(0, 24, nv)})
    line = pd.DataFrame({"line_id": _ids(nl), "visit_id": _skewed_parents(rng, nl, nv), "qty": rng.integers(1, 6, nl),
                         "unit_price": _nulls(rng, rng.lognormal(2, 0.8, nl), 0.02)})
    kind_step = _lookup(rng, 6)
    sid, rid = store.store_id.to_numpy(), region.region_id.to_numpy()

    # store.tier: log of its visits' total spend, a step of its kind, hot regions' size
    total = _per_parent(visit, "store_id", "spend", "sum", sid)
    total = _fill(total, 0.0)
    hot = _parent_column(store.region_id.to_numpy(), region, "climate") == "hot"
    tier = (np.log1p(total) / 2.0 + kind_step[store.kind.to_numpy()]
            + hot * np.tanh((_fill(store["size"].to_numpy(), 400.0) - 400.0) / 200.0))
    # region.growth: the share of its stores with more than 3 visits, and tax squared
    store["_busy"] = (_per_parent(visit, "store_id", None, "count", sid) > 3).astype(np.float64)
    busy = _fill(_per_parent(store, "region_id", "_busy", "mean", rid), 0.0)
    growth = 3.0 * busy ** 2 + 20.0 * _fill(region.tax.to_numpy(), 0.15) ** 2
    store = store.drop(columns="_busy")
    # visit.returned: night visits, a threshold on its lines' value, the store's kind step
    line["_value"] = line.qty * line.unit_price
    value = _fill(_per_parent(line, "visit_id", "_value", "sum", visit.visit_id.to_numpy()), 0.0)
    line = line.drop(columns="_value")
    hour = visit.hour.to_numpy()
    returned = (1.5 * ((hour < 6) | (hour >= 22)) + 1.5 * (value > 25.0)
                + kind_step[_parent_column(visit.store_id.to_numpy(), store, "kind")])

    tables = {t.name: t for t in (Table("region", region), Table("store", store, {"region_id": "region"}),
                                  Table("visit", visit, {"store_id": "store"}), Table("line", line, {"visit_id": "visit"}))}
    targets = [
        Target("store.tier", "multiclass", _classes(rng, tier, ["bronze", "gold", "silver"]), tier,
               "ln(1 + sum of visit spend)/2 + step(kind) + [region hot]*tanh((size (NULL->400) - 400)/200); tertiles"),
        Target("region.growth", "regression", _regression(rng, growth), growth,
               "3*(share of its stores with > 3 visits)^2 + 20*tax (NULL->0.15)^2"),
        Target("visit.returned", "binary", _binary(rng, returned), returned,
               "1.5*[hour < 6 or >= 22] + 1.5*[sum of line qty*unit_price > 25] + step(store kind)"),
    ]
    return Database("retail", "chain", tables, {t.name: t for t in targets})


def social(seed: int, scale: float = 1.0) -> Database:
    """A snowflake: city <- member <- post -> app -> vendor (dimensions of dimensions)."""
    rng = np.random.default_rng([seed, 3])
    nv, na, nc, nm, npo = int(500 * scale), int(600 * scale), int(500 * scale), int(2000 * scale), int(5000 * scale)
    vendor = pd.DataFrame({"vendor_id": _ids(nv), "rating": rng.integers(1, 11, nv),
                           "country": rng.choice(["fr", "de", "us", "jp", "br"], nv)})
    app = pd.DataFrame({"app_id": _ids(na), "vendor_id": rng.integers(1, nv + 1, na),
                        "size_mb": _nulls(rng, rng.lognormal(4, 1, na), 0.04),
                        "genre": rng.choice(["game", "tool", "news", "chat"], na)})
    city = pd.DataFrame({"city_id": _ids(nc), "population": _nulls(rng, rng.lognormal(11, 1.5, nc), 0.03),
                         "zone": rng.choice(["north", "south", "east", "west"], nc)})
    member = pd.DataFrame({"member_id": _ids(nm), "city_id": _skewed_parents(rng, nm, nc),
                           "age": _nulls(rng, rng.uniform(15, 70, nm), 0.07), "plan": rng.choice(["free", "basic", "pro"], nm)})
    post = pd.DataFrame({"post_id": _ids(npo), "member_id": _skewed_parents(rng, npo, nm), "app_id": rng.integers(1, na + 1, npo),
                         "length": _nulls(rng, rng.lognormal(4, 1, npo), 0.05), "hour": rng.integers(0, 24, npo)})
    rating_step = _lookup(rng, 11)

    # member.premium: big city XOR older member, and more than 4 posts
    population = np.log(_fill(_parent_column(member.city_id.to_numpy(), city, "population"), 60000.0))
    older = _fill(member.age.to_numpy(), 40.0) > 40.0
    posts = _per_parent(post, "member_id", None, "count", member.member_id.to_numpy())
    premium = 1.5 * ((population > 11.0) != older) + 1.2 * (posts > 4)
    # post.likes: a step of its app's vendor rating (2 hops), its log length, the member's age band
    rating = _parent_column(_parent_column(post.app_id.to_numpy(), app, "vendor_id"), vendor, "rating")
    age = _fill(_parent_column(post.member_id.to_numpy(), member, "age"), 40.0)
    likes = 2.0 * rating_step[rating] + np.log(_fill(post.length.to_numpy(), 55.0)) + np.where((age > 25) & (age < 35), 1.5, 0.0)
    # app.popular: a count of posts (threshold), the mean age of its posters (2 hops), its genre
    post["_age"] = _parent_column(post.member_id.to_numpy(), member, "age")
    mean_age = _fill(_per_parent(post, "app_id", "_age", "mean", app.app_id.to_numpy()), 42.5)
    post = post.drop(columns="_age")
    n_posts = _per_parent(post, "app_id", None, "count", app.app_id.to_numpy())
    popular = 1.5 * (n_posts > 8) - 1.5 * np.tanh((mean_age - 42.5) / 5.0) + 1.0 * app.genre.isin(["game", "chat"]).to_numpy()

    tables = {t.name: t for t in (Table("vendor", vendor), Table("app", app, {"vendor_id": "vendor"}), Table("city", city),
                                  Table("member", member, {"city_id": "city"}),
                                  Table("post", post, {"member_id": "member", "app_id": "app"}))}
    targets = [
        Target("member.premium", "binary", _binary(rng, premium), premium,
               "1.5*[ln(city population, NULL->60000) > 11 XOR age (NULL->40) > 40] + 1.2*[posts > 4]"),
        Target("post.likes", "regression", _regression(rng, likes), likes,
               "2*step(app's vendor rating) + ln(length, NULL->55) + 1.5*[25 < member age (NULL->40) < 35]"),
        Target("app.popular", "binary", _binary(rng, popular), popular,
               "1.5*[posts > 8] - 1.5*tanh((avg poster age (NULL->42.5) - 42.5)/5) + [genre in game, chat]"),
    ]
    return Database("social", "snowflake", tables, {t.name: t for t in targets})


def bank(seed: int, scale: float = 1.0) -> Database:
    """A time column on the event table: account <- txn -> merchant, txn.ts over 2024."""
    rng = np.random.default_rng([seed, 4])
    nm, na, nt = int(600 * scale), int(1000 * scale), int(5000 * scale)
    merchant = pd.DataFrame({"merchant_id": _ids(nm), "risk": rng.integers(1, 6, nm),
                             "country": rng.choice(["fr", "de", "us", "gb"], nm)})
    account = pd.DataFrame({"account_id": _ids(na), "kind": rng.choice(["credit", "debit", "savings"], na),
                            "credit_limit": _nulls(rng, rng.lognormal(8, 0.6, na), 0.06), "branch": rng.integers(1, 9, na)})
    seconds = rng.integers(0, 366 * 86400, nt)
    txn = pd.DataFrame({"txn_id": _ids(nt), "account_id": _skewed_parents(rng, nt, na),
                        "merchant_id": rng.integers(1, nm + 1, nt),
                        "ts": EPOCH + seconds.astype("timedelta64[s]"), "amount": _nulls(rng, rng.lognormal(3.5, 1.0, nt), 0.04)})
    risk_step, branch_step = np.array([0, -1.0, -0.5, 0.5, 1.0, 1.5]), _lookup(rng, 9)
    aid = account.account_id.to_numpy()

    # account.defaulted: recent transactions (on or after LATE) above 1, the largest amount, the branch's step
    txn["_recent"] = (txn.ts >= LATE).astype(np.float64)
    recent = _fill(_per_parent(txn, "account_id", "_recent", "sum", aid), 0.0)
    txn = txn.drop(columns="_recent")
    largest = _fill(_per_parent(txn, "account_id", "amount", "max", aid), 0.0)
    defaulted = 1.5 * (recent > 1) + 1.2 * (largest > 100.0) + branch_step[account.branch.to_numpy()]
    # txn.fraud: night hours x large amount, and the merchant's risk
    hour = ((seconds % 86400) // 3600).astype(np.int64)
    amount = _fill(txn.amount.to_numpy(), 33.0)
    fraud = 2.0 * ((hour < 5) & (amount > 40.0)) + risk_step[_parent_column(txn.merchant_id.to_numpy(), merchant, "risk")]
    # account.balance: credit accounts' sqrt limit, log of their total spend x kind
    total = _fill(_per_parent(txn, "account_id", "amount", "sum", aid), 0.0)
    credit = (account.kind == "credit").to_numpy()
    balance = np.where(credit, np.sqrt(_fill(account.credit_limit.to_numpy(), 3000.0)) / 10.0, 1.0) * np.log1p(total)

    tables = {t.name: t for t in (Table("merchant", merchant), Table("account", account),
                                  Table("txn", txn, {"account_id": "account", "merchant_id": "merchant"}))}
    targets = [
        Target("account.defaulted", "binary", _binary(rng, defaulted), defaulted,
               "1.5*[transactions since 2024-11-01 > 1] + 1.2*[max amount (NULL->0) > 100] + step(branch)"),
        Target("txn.fraud", "binary", _binary(rng, fraud), fraud,
               "2*[hour(ts) < 5 and amount (NULL->33) > 40] + step(merchant risk)"),
        Target("account.balance", "regression", _regression(rng, balance), balance,
               "(kind = credit ? sqrt(credit_limit, NULL->3000)/10 : 1) * ln(1 + sum of amounts)"),
    ]
    return Database("bank", "temporal", tables, {t.name: t for t in targets})


SHAPES = {"shop": shop, "retail": retail, "social": social, "bank": bank}


def databases(seed: int = 0, scale: float = 1.0) -> dict[str, Database]:
    return {name: make(seed, scale) for name, make in SHAPES.items()}


def all_targets(seed: int = 0, scale: float = 1.0) -> dict[str, tuple[Database, Target]]:
    """{"table.column": (its database, the target)} over every shape."""
    return {t.name: (db, t) for db in databases(seed, scale).values() for t in db.targets.values()}


# --------------------------------------------------------------------------- writing
_SQL_TYPES = {"i": "BIGINT", "f": "DOUBLE", "O": "VARCHAR", "M": "TIMESTAMP", "b": "BOOLEAN"}


def _arrow(frame: pd.DataFrame) -> pa.Table:
    """NaN in float columns becomes NULL."""
    return pa.Table.from_pandas(frame, preserve_index=False)


def _ddl(table: Table, frame: pd.DataFrame) -> str:
    """CREATE TABLE with the primary key and foreign keys declared (names are this module's own)."""
    columns = [f'"{c}" {_SQL_TYPES[frame[c].dtype.kind]}' + (" PRIMARY KEY" if c == table.key else "") for c in frame.columns]
    columns += [f'FOREIGN KEY ("{c}") REFERENCES "{parent}" ("{parent}_id")' for c, parent in table.foreign.items()]
    return f'CREATE TABLE "{table.name}" ({", ".join(columns)})'


def write(db: Database, path: str | Path, target: str | None = None) -> Path:
    """A new DuckDB file at `path` with every table of `db` and, for `target`, its label column
    appended to its table (no other target's). An existing file is replaced."""
    import duckdb

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + ".wal")):
        stale.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    try:
        for table in db.tables.values():
            frame = table.frame
            if target is not None and db.targets[target].table == table.name:
                label = db.targets[target]
                frame = frame.assign(**{label.column: label.values})
            con.execute(_ddl(table, frame))
            arrow = _arrow(frame)  # noqa: F841 (read by DuckDB's replacement scan)
            con.execute(f'INSERT INTO "{table.name}" SELECT * FROM arrow')
    finally:
        con.close()
    return path
