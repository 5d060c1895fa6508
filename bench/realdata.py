"""Targets beyond bench/relgen.py for bench/quality.py: TPC-DS labels, Mutagenesis, Nations.

Each writer makes a NEW DuckDB file (an existing one is replaced) with declared PRIMARY and
FOREIGN KEYs and one label column, built offline (nothing downloaded):

- TPC-DS (DuckDB's `tpcds` extension from its wheel, `dsdgen` at scale factor 0.01): the
  customers who bought in a store before CUT, their demographics, household, income band, the
  items, and their store and web sales BEFORE CUT only (each sale with its date, a time column).
  Labels come from the sales on or after CUT (the last half year of the data, 2002-07-01 to
  2003-01-02), which the file does not hold: `customer.buys_again` (binary: a store sale in that
  half year) and `customer.spend` (regression: ln(1 + store and web net paid in it)).
- Mutagenesis: the relsql demo's molecule/atom/bond tables (`relsql.datasets.mutagenesis.load`), target
  `molecule.mutagenic` (188 molecules).
- Nations (PyNeuraLogic's dataset, from the installed wheel): its 14 nations and their 996
  relation facts r(nation, relation, nation) as tables; the 806 queries predict(nation, attribute)
  as rows of `holds` (nation, attribute, label). A query's positive facts r(nation, attribute)
  are NOT written (they are its labels); nations and attributes carry their name as a category,
  the only thing known of them. The 4,541 queries predict(nation, relation, nation) are left
  out: their positives are the relation facts the inputs hold, so the labels would be inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import duckdb

CUT = "2002-07-01"  # TPC-DS labels: sales on or after this date (the inputs hold only earlier ones)
SF = 0.01


@dataclass(frozen=True)
class Spec:
    name: str  # "table.column"
    database: str
    shape: str
    kind: str  # binary | multiclass | regression


SPECS = {s.name: s for s in (Spec("customer.buys_again", "tpcds", "warehouse", "binary"),
                             Spec("customer.spend", "tpcds", "warehouse", "regression"),
                             Spec("molecule.mutagenic", "mutagenesis", "molecules", "binary"),
                             Spec("holds.label", "nations", "knowledge graph", "binary"))}


def _fresh(path: str | Path) -> duckdb.DuckDBPyConnection:
    """A connection to a new, empty DuckDB file at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + ".wal")):
        stale.unlink(missing_ok=True)
    return duckdb.connect(str(path))


# --------------------------------------------------------------------------- TPC-DS
_TPCDS_SCHEMA = """
CREATE TABLE income_band (ib_income_band_sk BIGINT PRIMARY KEY, ib_lower_bound BIGINT, ib_upper_bound BIGINT);
CREATE TABLE household_demographics (hd_demo_sk BIGINT PRIMARY KEY,
    hd_income_band_sk BIGINT REFERENCES income_band (ib_income_band_sk), hd_buy_potential VARCHAR,
    hd_dep_count BIGINT, hd_vehicle_count BIGINT);
CREATE TABLE customer_demographics (cd_demo_sk BIGINT PRIMARY KEY, cd_gender VARCHAR, cd_marital_status VARCHAR,
    cd_education_status VARCHAR, cd_purchase_estimate BIGINT, cd_credit_rating VARCHAR, cd_dep_count BIGINT);
CREATE TABLE item (i_item_sk BIGINT PRIMARY KEY, i_current_price DOUBLE, i_category VARCHAR, i_class VARCHAR,
    i_brand VARCHAR);
CREATE TABLE customer (c_customer_sk BIGINT PRIMARY KEY,
    c_current_cdemo_sk BIGINT REFERENCES customer_demographics (cd_demo_sk),
    c_current_hdemo_sk BIGINT REFERENCES household_demographics (hd_demo_sk),
    c_preferred_cust_flag VARCHAR, c_birth_year BIGINT, c_birth_country VARCHAR, {label});
CREATE TABLE store_sales (ss_id BIGINT PRIMARY KEY, ss_customer_sk BIGINT REFERENCES customer (c_customer_sk),
    ss_item_sk BIGINT REFERENCES item (i_item_sk), ss_sold_date DATE, ss_quantity BIGINT, ss_sales_price DOUBLE,
    ss_ext_discount_amt DOUBLE, ss_net_paid DOUBLE);
CREATE TABLE web_sales (ws_id BIGINT PRIMARY KEY, ws_bill_customer_sk BIGINT REFERENCES customer (c_customer_sk),
    ws_item_sk BIGINT REFERENCES item (i_item_sk), ws_sold_date DATE, ws_quantity BIGINT, ws_net_paid DOUBLE);
"""

# Filled from the generated warehouse `g` (attached read-only), in foreign-key order. `?` is CUT.
_TPCDS_FILL = {
    "keep": """CREATE TEMP TABLE keep AS SELECT DISTINCT ss_customer_sk AS k FROM g.store_sales
               JOIN g.date_dim ON d_date_sk = ss_sold_date_sk WHERE d_date < $cut AND ss_customer_sk IS NOT NULL""",
    "income_band": "INSERT INTO income_band SELECT ib_income_band_sk, ib_lower_bound, ib_upper_bound FROM g.income_band",
    "household_demographics": """INSERT INTO household_demographics SELECT hd_demo_sk, hd_income_band_sk, hd_buy_potential,
        hd_dep_count, hd_vehicle_count FROM g.household_demographics
        WHERE hd_demo_sk IN (SELECT c_current_hdemo_sk FROM g.customer JOIN keep ON k = c_customer_sk)""",
    "customer_demographics": """INSERT INTO customer_demographics SELECT cd_demo_sk, cd_gender, cd_marital_status,
        cd_education_status, cd_purchase_estimate, cd_credit_rating, cd_dep_count FROM g.customer_demographics
        WHERE cd_demo_sk IN (SELECT c_current_cdemo_sk FROM g.customer JOIN keep ON k = c_customer_sk)""",
    "item": "INSERT INTO item SELECT i_item_sk, i_current_price, i_category, i_class, i_brand FROM g.item",
    "customer": """INSERT INTO customer SELECT c.c_customer_sk,
            CASE WHEN c.c_current_cdemo_sk IN (SELECT cd_demo_sk FROM customer_demographics) THEN c.c_current_cdemo_sk END,
            CASE WHEN c.c_current_hdemo_sk IN (SELECT hd_demo_sk FROM household_demographics) THEN c.c_current_hdemo_sk END,
            c.c_preferred_cust_flag, c.c_birth_year, c.c_birth_country, {label}
        FROM g.customer c JOIN keep ON k = c.c_customer_sk
        LEFT JOIN (SELECT ss_customer_sk AS k2, count(*) AS n, sum(ss_net_paid) AS paid FROM g.store_sales
                   JOIN g.date_dim ON d_date_sk = ss_sold_date_sk WHERE d_date >= $cut GROUP BY 1) s ON s.k2 = c.c_customer_sk
        LEFT JOIN (SELECT ws_bill_customer_sk AS k3, sum(ws_net_paid) AS paid FROM g.web_sales
                   JOIN g.date_dim ON d_date_sk = ws_sold_date_sk WHERE d_date >= $cut GROUP BY 1) w ON w.k3 = c.c_customer_sk""",
    "store_sales": """INSERT INTO store_sales SELECT row_number() OVER (ORDER BY ss_ticket_number, ss_item_sk), ss_customer_sk,
        ss_item_sk, d_date, ss_quantity, ss_sales_price, ss_ext_discount_amt, ss_net_paid FROM g.store_sales
        JOIN g.date_dim ON d_date_sk = ss_sold_date_sk JOIN keep ON k = ss_customer_sk WHERE d_date < $cut""",
    "web_sales": """INSERT INTO web_sales SELECT row_number() OVER (ORDER BY ws_order_number, ws_item_sk), ws_bill_customer_sk,
        ws_item_sk, d_date, ws_quantity, ws_net_paid FROM g.web_sales
        JOIN g.date_dim ON d_date_sk = ws_sold_date_sk JOIN keep ON k = ws_bill_customer_sk WHERE d_date < $cut""",
}
_TPCDS_LABELS = {"buys_again": ("buys_again BOOLEAN", "s.n IS NOT NULL"),
                 "spend": ("spend DOUBLE", "ln(1 + coalesce(s.paid, 0) + coalesce(w.paid, 0))")}


def write_tpcds(path: str | Path, label: str, sf: float = SF, cut: str = CUT) -> Path:
    """A keyed TPC-DS extract at `path` with the customer label `label` (buys_again | spend)."""
    from relsql.connectors.extensions import load

    column, expression = _TPCDS_LABELS[label]
    con = _fresh(path)
    try:
        load(con, "tpcds")
        con.execute("ATTACH ':memory:' AS g")  # the generated warehouse stays in memory
        con.execute("CALL dsdgen(sf=$sf, catalog='g')", {"sf": float(sf)})
        con.execute(_TPCDS_SCHEMA.replace("{label}", column))
        for statement in _TPCDS_FILL.values():
            statement = statement.replace("{label}", expression)
            con.execute(statement, {"cut": cut} if "$cut" in statement else None)
        con.execute("DETACH g")
    finally:
        con.close()
    return Path(path)


# --------------------------------------------------------------------------- Mutagenesis
def write_mutagenesis(path: str | Path) -> Path:
    """The relsql demo's Mutagenesis tables (molecule.mutagenic the label) at `path`."""
    from relsql.datasets.mutagenesis import load

    con = _fresh(path)
    try:
        load(con)
    finally:
        con.close()
    return Path(path)


# --------------------------------------------------------------------------- Nations
_ATOM = re.compile(r"(\w+)\(([^()]*)\)")


def nations_facts() -> tuple[list[tuple[str, ...]], list[tuple[float, tuple[str, ...]]]]:
    """(facts as argument tuples of r/2 and r/3, queries as (label, arguments)) from the installed
    PyNeuraLogic wheel's Nations files."""
    from bench.neuralogic import dataset_files

    files = dataset_files("nations")
    facts = [tuple(a.split(",")) for p, a in _ATOM.findall(files.examples.read_text()) if p == "r"]
    queries = []
    for line in files.queries.read_text().splitlines():
        if line.strip():
            value, atom = line.split(maxsplit=1)
            queries.append((float(value), tuple(_ATOM.match(atom).group(2).split(","))))
    return facts, queries


_NATIONS_SCHEMA = """
CREATE TABLE nation (nation_id INTEGER PRIMARY KEY, name VARCHAR);
CREATE TABLE attribute (attribute_id INTEGER PRIMARY KEY, name VARCHAR);
CREATE TABLE tie (tie_id INTEGER PRIMARY KEY, src INTEGER REFERENCES nation (nation_id), relation VARCHAR,
    dst INTEGER REFERENCES nation (nation_id));
CREATE TABLE holds (query_id INTEGER PRIMARY KEY, nation_id INTEGER REFERENCES nation (nation_id),
    attribute_id INTEGER REFERENCES attribute (attribute_id), label BOOLEAN);
"""


def write_nations(path: str | Path) -> Path:
    """Nations' predict(nation, attribute) queries as `holds.label`, its relation facts as `tie`."""
    import pyarrow as pa

    facts, queries = nations_facts()
    pairs = [(label, args) for label, args in queries if len(args) == 2]
    ties = [args for args in facts if len(args) == 3]
    nations = sorted({a for args in ties for a in (args[0], args[2])} | {n for _, (n, _) in pairs})
    attributes = sorted({a for _, (_, a) in pairs})
    nid, aid = {n: i + 1 for i, n in enumerate(nations)}, {a: i + 1 for i, a in enumerate(attributes)}
    tables = {
        "nation": pa.table({"nation_id": list(nid.values()), "name": nations}),
        "attribute": pa.table({"attribute_id": list(aid.values()), "name": attributes}),
        "tie": pa.table({"tie_id": list(range(1, len(ties) + 1)), "src": [nid[s] for s, _, _ in ties],
                         "relation": [r for _, r, _ in ties], "dst": [nid[d] for _, _, d in ties]}),
        "holds": pa.table({"query_id": list(range(1, len(pairs) + 1)), "nation_id": [nid[n] for _, (n, _) in pairs],
                           "attribute_id": [aid[a] for _, (_, a) in pairs], "label": [v > 0.5 for v, _ in pairs]}),
    }
    con = _fresh(path)
    try:
        con.execute(_NATIONS_SCHEMA)
        for name, frame in tables.items():
            con.register("frame", frame)
            con.execute(f'INSERT INTO "{name}" SELECT * FROM frame')
            con.unregister("frame")
    finally:
        con.close()
    return Path(path)


def write(name: str, path: str | Path) -> Path:
    """The database file of target `name` (a key of SPECS) at `path`."""
    if name == "customer.buys_again":
        return write_tpcds(path, "buys_again")
    if name == "customer.spend":
        return write_tpcds(path, "spend")
    if name == "molecule.mutagenic":
        return write_mutagenesis(path)
    if name == "holds.label":
        return write_nations(path)
    raise KeyError(name)
