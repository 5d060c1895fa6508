"""Ranking datasets for bench/recommend.py (issue #30, item 6), each a NEW DuckDB file with declared keys.

- shop: a seeded shop with latent tastes. Customers (age, region) carry a taste vector (their region's
  centre plus their own part), items (price, category) a vector (their category's centre plus their
  own part) and a popularity; a year of purchases draws each item from softmax(taste . item + log
  popularity), so both what sells and what this customer likes matter, and customers re-buy.
- tpcds: TPC-DS `store_sales` from DuckDB's `tpcds` extension (its offline wheel; dsdgen at a small
  scale factor), customer -> item with the sale's date. Its purchases are drawn uniformly by the
  generator: there is little to learn beyond what sells, and that is the honest finding there.
- links: a seeded latent-space graph (nodes in communities on a plane; an edge more likely between
  near nodes of high degree propensity). 20% of the edges are held out, each given to ONE of its
  ends (so no row's label holds another row's answer); the table `edge` keeps the rest.

Every dataset has a task table whose last column is a LIST of candidate keys (the target):
`task_rec(task_id, customer_id, snapshot DATE, item_id BIGINT[])` holds, per customer and snapshot
(every 30 days), the distinct items bought in [snapshot, snapshot + 30 days), rows with no purchase
left out; `task_link(task_id, source_id, node_id BIGINT[])` the held-out neighbours of each node.
A DuckDB list column cannot carry a FOREIGN KEY: the list column is named as the referenced key.

The split is the bench's (`Dataset.split`, positions into the task rows in task_id order): by whole
snapshots for temporal data (the latest ~15% of rows test, the ~15% before validation), so that the
fractions `Dataset.fractions` reproduce it exactly under relsql's time split (a stable sort on the
snapshot, whole snapshots on each side); for links relsql's random split of seed 0 (bench/recommend.py
draws it again per model seed, as relsql's Model seeds its split with its seed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

WINDOW = 30  # days per label window, and between snapshots
FRACTIONS = (0.7, 0.15, 0.15)


@dataclass
class Dataset:
    """A ranking benchmark: its file, the target, and (for the baselines and the peer) its arrays.

    Candidates and query rows are referred to by key; `events` are the history a method may use
    (purchases, or the kept edges in both directions), `truth` the task rows' lists in CSR form."""
    name: str
    path: Path
    target: str  # "task_rec.item_id"
    time_column: str | None  # "snapshot" or None
    query_table: str  # the table of the task table's query column ("customer")
    query_column: str  # the task table's column naming the query row ("customer_id")
    candidate_table: str  # the table the list references ("item")
    event_table: str  # the history's table ("purchase")
    candidates: np.ndarray  # candidate keys, sorted
    event_query: np.ndarray  # per event: the query row's key
    event_item: np.ndarray  # per event: the candidate's key
    event_day: np.ndarray | None  # per event: days since the epoch (None: not temporal)
    task_id: np.ndarray  # the task rows' keys, sorted
    task_query: np.ndarray  # per task row: its query key
    task_day: np.ndarray | None  # per task row: the snapshot, days since the epoch
    truth_offsets: np.ndarray  # [rows + 1]
    truth_ids: np.ndarray  # candidate keys, row after row
    split: dict[str, np.ndarray]  # positions into the task rows

    @property
    def task_table(self) -> str:
        return self.target.split(".")[0]

    @property
    def fractions(self) -> tuple[float, float, float]:
        """Split fractions that reproduce `split` under relsql's split (exact counts)."""
        n = len(self.task_id)
        return tuple(len(self.split[s]) / n for s in ("train", "val", "test"))  # type: ignore[return-value]


def _fresh(path: str | Path) -> duckdb.DuckDBPyConnection:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + ".wal")):
        stale.unlink(missing_ok=True)
    return duckdb.connect(str(path))


def _insert(con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, np.ndarray | pa.Array]) -> None:
    """Rows into the declared table `table` (a bench-internal name) from arrays, through Arrow."""
    staged = pa.table(columns)
    con.register("staged_rows", staged)
    try:
        con.execute(f'INSERT INTO "{table}" SELECT * FROM staged_rows')
    finally:
        con.unregister("staged_rows")


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


# --------------------------------------------------------------------------- tasks and splits
def window_tasks(event_query: np.ndarray, event_item: np.ndarray, event_day: np.ndarray,
                 snapshots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(query key, snapshot, offsets, item keys) per (query row, snapshot) with at least one purchase
    in [snapshot, snapshot + WINDOW): the distinct items, sorted; rows by snapshot, then query key."""
    queries, days, lists = [], [], []
    for s in snapshots:
        inside = (event_day >= s) & (event_day < s + WINDOW)
        pairs = np.unique(np.stack([event_query[inside], event_item[inside]], 1), axis=0)
        if not len(pairs):
            continue
        owners, starts = np.unique(pairs[:, 0], return_index=True)
        queries.append(owners)
        days.append(np.full(len(owners), s, dtype=np.int64))
        lists += np.split(pairs[:, 1], starts[1:])
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    return np.concatenate(queries), np.concatenate(days), offsets, np.concatenate(lists).astype(np.int64)


def snapshot_split(days: np.ndarray, fractions: tuple[float, float, float] = FRACTIONS) -> dict[str, np.ndarray]:
    """Whole snapshots per split: the latest snapshots holding ~fractions[2] of the rows test, the
    ~fractions[1] before them validation, the rest training (each at least one snapshot)."""
    distinct, counts = np.unique(days, return_counts=True)
    if len(distinct) < 3:
        raise ValueError(f"a temporal split needs at least 3 snapshots, got {len(distinct)}")
    tail = np.cumsum(counts[::-1]) / len(days)  # rows in the latest j+1 snapshots
    n_test = max(1, int(np.searchsorted(tail, fractions[2] - 1e-9)) + 1)
    n_val = max(1, int(np.searchsorted(tail, fractions[1] + fractions[2] - 1e-9)) + 1 - n_test)
    n_val = min(n_val, len(distinct) - 1 - n_test)
    test_from, val_from = distinct[-n_test], distinct[-n_test - n_val]
    order = np.arange(len(days))
    return {"train": order[days < val_from], "val": order[(days >= val_from) & (days < test_from)],
            "test": order[days >= test_from]}


def random_split(count: int, seed: int, fractions: tuple[float, float, float] = FRACTIONS) -> dict[str, np.ndarray]:
    """relsql's own seeded random split of `count` rows in key order (relsql/train/task/split.py)."""
    from relsql.train.task.split import split_rows

    return {k: np.sort(v) for k, v in split_rows(count, fractions, seed).items()}


def _task_frame(con: duckdb.DuckDBPyConnection, table: str, query: np.ndarray, day: np.ndarray | None,
                offsets: np.ndarray, ids: np.ndarray, epoch: np.datetime64) -> np.ndarray:
    """Write the task rows (task_id 1..n in this order); returns the task ids."""
    n = len(query)
    task_id = np.arange(1, n + 1, dtype=np.int64)
    lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(ids, pa.int64()))
    columns: dict[str, np.ndarray | pa.Array] = {"task_id": task_id, "q": query.astype(np.int64)}
    if day is not None:
        columns["snapshot"] = pa.array((epoch + day.astype("timedelta64[D]")).astype("datetime64[D]"))
    columns["items"] = lists
    _insert(con, table, columns)
    return task_id


# --------------------------------------------------------------------------- shop
SHOP_SCHEMA = """
CREATE TABLE region (region_id BIGINT PRIMARY KEY, name VARCHAR);
CREATE TABLE customer (customer_id BIGINT PRIMARY KEY, region_id BIGINT REFERENCES region (region_id),
    age DOUBLE, signup DATE);
CREATE TABLE category (category_id BIGINT PRIMARY KEY, name VARCHAR);
CREATE TABLE item (item_id BIGINT PRIMARY KEY, category_id BIGINT REFERENCES category (category_id), price DOUBLE);
CREATE TABLE purchase (purchase_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer (customer_id),
    item_id BIGINT REFERENCES item (item_id), date DATE);
CREATE TABLE task_rec (task_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer (customer_id),
    snapshot DATE, item_id BIGINT[]);
"""
SHOP_EPOCH = np.datetime64("2024-01-01")


def write_shop(path: str | Path, customers: int = 2000, items: int = 1000, purchases: int = 40_000,
               categories: int = 20, regions: int = 8, dim: int = 8, seed: int = 0) -> Dataset:
    """The latent-taste shop at `path` (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    region_centre = rng.normal(0, 1.0, (regions, dim))
    region = rng.integers(0, regions, customers)
    taste = region_centre[region] + rng.normal(0, 0.8, (customers, dim))
    category_centre = rng.normal(0, 1.0, (categories, dim))
    category = rng.integers(0, categories, items)
    vector = category_centre[category] + rng.normal(0, 0.5, (items, dim))
    popularity = rng.normal(0, 1.0, items)
    price = np.round(np.exp(rng.normal(3 + 0.05 * category, 0.5)), 2)
    age = np.round(rng.uniform(18, 80, customers) + 2 * region, 0)

    activity = rng.gamma(1.5, 1.0, customers)
    per_customer = rng.multinomial(purchases, activity / activity.sum())
    choice = _softmax_rows(taste @ vector.T / np.sqrt(dim) * 1.5 + popularity)
    buyer = np.repeat(np.arange(customers), per_customer)
    bought = np.concatenate([rng.choice(items, size=c, p=choice[i]) for i, c in enumerate(per_customer) if c])
    day = rng.integers(0, 365, len(buyer))
    order = np.lexsort((bought, buyer, day))
    buyer, bought, day = buyer[order] + 1, bought[order].astype(np.int64) + 1, day[order].astype(np.int64)

    con = _fresh(path)
    try:
        con.execute(SHOP_SCHEMA)
        _insert(con, "region", {"region_id": np.arange(1, regions + 1), "name": [f"region {r}" for r in range(regions)]})
        signup = (SHOP_EPOCH - rng.integers(30, 1500, customers).astype("timedelta64[D]")).astype("datetime64[D]")
        _insert(con, "customer", {"customer_id": np.arange(1, customers + 1), "region_id": region + 1,
                                  "age": age, "signup": pa.array(signup)})
        _insert(con, "category", {"category_id": np.arange(1, categories + 1),
                                  "name": [f"category {c}" for c in range(categories)]})
        _insert(con, "item", {"item_id": np.arange(1, items + 1), "category_id": category + 1, "price": price})
        dates = (SHOP_EPOCH + day.astype("timedelta64[D]")).astype("datetime64[D]")
        _insert(con, "purchase", {"purchase_id": np.arange(1, len(buyer) + 1), "customer_id": buyer,
                                  "item_id": bought, "date": pa.array(dates)})
        snapshots = np.arange(WINDOW, 365 - WINDOW + 1, WINDOW)
        query, days, offsets, ids = window_tasks(buyer, bought, day, snapshots)
        task_id = _task_frame(con, "task_rec", query, days, offsets, ids, SHOP_EPOCH)
    finally:
        con.close()
    return Dataset("shop", Path(path), "task_rec.item_id", "snapshot", "customer", "customer_id", "item", "purchase",
                   np.arange(1, items + 1, dtype=np.int64), buyer, bought, day, task_id, query, days, offsets, ids,
                   snapshot_split(days))


# --------------------------------------------------------------------------- TPC-DS
TPCDS_SCHEMA = """
CREATE TABLE customer (customer_id BIGINT PRIMARY KEY, c_birth_year BIGINT, c_preferred_cust_flag VARCHAR,
    c_birth_country VARCHAR);
CREATE TABLE item (item_id BIGINT PRIMARY KEY, i_current_price DOUBLE, i_category VARCHAR, i_class VARCHAR,
    i_brand VARCHAR);
CREATE TABLE store_sales (ss_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer (customer_id),
    item_id BIGINT REFERENCES item (item_id), ss_sold_date DATE, ss_quantity BIGINT, ss_net_paid DOUBLE);
CREATE TABLE task_rec (task_id BIGINT PRIMARY KEY, customer_id BIGINT REFERENCES customer (customer_id),
    snapshot DATE, item_id BIGINT[]);
"""
TPCDS_FILL = [
    """INSERT INTO customer SELECT c_customer_sk, c_birth_year, c_preferred_cust_flag, c_birth_country
       FROM g.customer WHERE c_customer_sk IN (SELECT ss_customer_sk FROM g.store_sales)""",
    "INSERT INTO item SELECT i_item_sk, i_current_price, i_category, i_class, i_brand FROM g.item",
    """INSERT INTO store_sales SELECT row_number() OVER (ORDER BY d_date, ss_ticket_number, ss_item_sk), ss_customer_sk,
       ss_item_sk, d_date, ss_quantity, ss_net_paid FROM g.store_sales JOIN g.date_dim ON d_date_sk = ss_sold_date_sk
       WHERE ss_customer_sk IS NOT NULL""",
]
TPCDS_EPOCH = np.datetime64("1998-01-02")  # the first sale date of dsdgen's store_sales


def write_tpcds(path: str | Path, sf: float = 0.01, first: int = 730) -> Dataset:
    """TPC-DS store sales at `path` with `task_rec` every 30 days from `first` days after the first
    sale (the default: its last three years; the history before stays as input)."""
    from relsql.connectors.extensions import load

    con = _fresh(path)
    try:
        load(con, "tpcds", purpose="generate TPC-DS for bench.recommend")
        con.execute("ATTACH ':memory:' AS g")
        con.execute("CALL dsdgen(sf=$sf, catalog='g')", {"sf": float(sf)})
        con.execute(TPCDS_SCHEMA)
        for statement in TPCDS_FILL:
            con.execute(statement)
        con.execute("DETACH g")
        sales = con.execute("SELECT customer_id, item_id, ss_sold_date FROM store_sales ORDER BY ss_id").fetch_arrow_table()
        buyer = sales.column(0).to_numpy().astype(np.int64)
        bought = sales.column(1).to_numpy().astype(np.int64)
        day = (sales.column(2).to_numpy().astype("datetime64[D]") - TPCDS_EPOCH).astype(np.int64)
        snapshots = np.arange(max(WINDOW, first), int(day.max()) - WINDOW + 2, WINDOW)
        query, days, offsets, ids = window_tasks(buyer, bought, day, snapshots)
        task_id = _task_frame(con, "task_rec", query, days, offsets, ids, TPCDS_EPOCH)
        candidates = np.sort(con.execute("SELECT item_id FROM item").fetch_arrow_table().column(0).to_numpy().astype(np.int64))
    finally:
        con.close()
    return Dataset("tpcds", Path(path), "task_rec.item_id", "snapshot", "customer", "customer_id", "item", "store_sales",
                   candidates, buyer, bought, day, task_id, query, days, offsets, ids, snapshot_split(days))


# --------------------------------------------------------------------------- links
LINKS_SCHEMA = """
CREATE TABLE node (node_id BIGINT PRIMARY KEY, x1 DOUBLE, x2 DOUBLE, propensity DOUBLE);
CREATE TABLE edge (edge_id BIGINT PRIMARY KEY, src BIGINT REFERENCES node (node_id), dst BIGINT REFERENCES node (node_id));
CREATE TABLE task_link (task_id BIGINT PRIMARY KEY, source_id BIGINT REFERENCES node (node_id), node_id BIGINT[]);
"""


def write_links(path: str | Path, nodes: int = 2000, degree: float = 10.0, communities: int = 12,
                held_out: float = 0.2, seed: int = 0) -> Dataset:
    """The latent-space graph at `path` (see the module's docstring). Node columns: a noisy copy of
    the position (x1, x2) and a noisy degree propensity."""
    rng = np.random.default_rng(seed)
    centre = rng.uniform(-4, 4, (communities, 2))
    position = centre[rng.integers(0, communities, nodes)] + rng.normal(0, 0.6, (nodes, 2))
    propensity = rng.normal(0, 0.7, nodes)
    distance = np.sqrt(((position[:, None, :] - position[None, :, :]) ** 2).sum(-1))
    logit = -1.5 * distance + propensity[:, None] + propensity[None, :]
    upper = np.triu(np.ones((nodes, nodes), dtype=bool), 1)
    weight = np.exp(logit)[upper]
    p = np.minimum(1.0, weight * (degree * nodes / 2) / weight.sum())
    src_all, dst_all = np.nonzero(upper)
    chosen = rng.random(len(p)) < p
    src_all, dst_all = src_all[chosen] + 1, dst_all[chosen] + 1
    hold = rng.random(len(src_all)) < held_out
    src, dst = src_all[~hold], dst_all[~hold]
    swap = rng.random(int(hold.sum())) < 0.5  # each held-out edge belongs to one of its ends
    owner = np.where(swap, dst_all[hold], src_all[hold]).astype(np.int64)
    other = np.where(swap, src_all[hold], dst_all[hold]).astype(np.int64)
    pairs = np.unique(np.stack([owner, other], 1), axis=0)
    query, starts = np.unique(pairs[:, 0], return_index=True)
    lists = np.split(pairs[:, 1], starts[1:])
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    ids = np.concatenate(lists).astype(np.int64)

    con = _fresh(path)
    try:
        con.execute(LINKS_SCHEMA)
        noisy = position + rng.normal(0, 0.8, position.shape)
        _insert(con, "node", {"node_id": np.arange(1, nodes + 1), "x1": noisy[:, 0], "x2": noisy[:, 1],
                              "propensity": propensity + rng.normal(0, 0.5, nodes)})
        _insert(con, "edge", {"edge_id": np.arange(1, len(src) + 1), "src": src.astype(np.int64),
                              "dst": dst.astype(np.int64)})
        task_id = _task_frame(con, "task_link", query.astype(np.int64), None, offsets, ids, SHOP_EPOCH)
    finally:
        con.close()
    both_q = np.concatenate([src, dst]).astype(np.int64)
    both_i = np.concatenate([dst, src]).astype(np.int64)
    return Dataset("links", Path(path), "task_link.node_id", None, "node", "source_id", "node", "edge",
                   np.arange(1, nodes + 1, dtype=np.int64), both_q, both_i, None, task_id, query.astype(np.int64),
                   None, offsets, ids, random_split(len(task_id), seed))


WRITERS = {"shop": write_shop, "tpcds": write_tpcds, "links": write_links}
