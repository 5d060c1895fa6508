"""Keys of a real warehouse: star-schema inference on TPC-DS, keys given in a file, in Python or
in an `EXPORT DATABASE` folder's schema.sql, and how `relsql inspect` shows where each came from."""

from __future__ import annotations

import re
import time

import duckdb
import pytest

import relsql
from relsql.cli import main
from relsql.connectors.extensions import load
from relsql.data.catalog import ForeignKey
from relsql.data.keys import schema


@pytest.fixture(scope="module")
def tpcds(tmp_path_factory):
    """TPC-DS at scale factor 0.01 as dsdgen writes it: no keys declared."""
    path = tmp_path_factory.mktemp("tpcds") / "tpcds.duckdb"
    con = duckdb.connect(str(path))
    load(con, "tpcds")
    con.execute("CALL dsdgen(sf=0.01)")
    con.close()
    return path


@pytest.fixture(scope="module")
def inferred(tpcds):
    db = relsql.connect(tpcds, read_only=True)
    started = time.perf_counter()
    keys = schema(db, db.catalog())
    seconds = time.perf_counter() - started
    yield keys, seconds
    db.close()


def _fks(keys) -> dict[tuple[str, str], str]:
    return {(child, fk.columns[0]): fk.table for child, fk in keys.foreign_keys if len(fk.columns) == 1}


def test_tpcds_primary_keys_are_surrogate_keys_named_after_their_table(inferred):
    keys, seconds = inferred
    expected = {"customer": ("c_customer_sk",), "date_dim": ("d_date_sk",), "item": ("i_item_sk",),
                "customer_address": ("ca_address_sk",), "customer_demographics": ("cd_demo_sk",),
                "household_demographics": ("hd_demo_sk",), "promotion": ("p_promo_sk",), "web_site": ("web_site_sk",),
                "call_center": ("cc_call_center_sk",), "time_dim": ("t_time_sk",)}
    for table, key in expected.items():
        assert keys.primary_keys[table] == key, table
        assert table in keys.inferred_primary
    assert keys.primary_note("customer").startswith("inferred: names: c_customer_sk names its table customer")
    assert "unique and never NULL in 1,000 rows" in keys.primary_note("customer")
    # fact tables: the smallest unique set of foreign-key and identifier columns, never 5-7 columns
    assert keys.primary_keys["store_sales"] == ("ss_item_sk", "ss_ticket_number")
    assert keys.primary_keys["web_sales"] == ("ws_item_sk", "ws_order_number")
    assert keys.primary_keys["catalog_returns"] == ("cr_item_sk", "cr_order_number")
    assert all(len(k) <= 3 for k in keys.primary_keys.values())
    assert seconds < 20, seconds


def test_tpcds_role_playing_foreign_keys(inferred):
    keys, _ = inferred
    fks = _fks(keys)
    expected = {("store_sales", "ss_customer_sk"): "customer", ("store_sales", "ss_sold_date_sk"): "date_dim",
                ("web_sales", "ws_bill_customer_sk"): "customer", ("customer", "c_current_addr_sk"): "customer_address",
                ("store_sales", "ss_cdemo_sk"): "customer_demographics", ("store_sales", "ss_hdemo_sk"): "household_demographics",
                ("catalog_sales", "cs_ship_addr_sk"): "customer_address", ("store_returns", "sr_return_time_sk"): "time_dim",
                ("household_demographics", "hd_income_band_sk"): "income_band", ("web_sales", "ws_web_site_sk"): "web_site",
                ("web_sales", "ws_web_page_sk"): "web_page", ("catalog_sales", "cs_promo_sk"): "promotion"}
    for column, parent in expected.items():
        assert fks.get(column) == parent, column
    fk = next(fk for child, fk in keys.foreign_keys if child == "store_sales" and fk.columns == ("ss_sold_date_sk",))
    note = keys.foreign_note("store_sales", fk)
    assert note.startswith("inferred: names: ss_sold_date_sk ~ d_date_sk (entity date, role sold)")
    assert re.search(r"all [\d,]+ non-NULL values found in date_dim\.d_date_sk", note)


def test_tpcds_no_business_ids_or_bogus_keys(inferred):
    keys, _ = inferred
    assert keys.primary_keys["web_site"] != ("web_mkt_id",) and keys.primary_keys["call_center"] != ("cc_mkt_id",)
    assert all("_id" not in c for k in keys.primary_keys.values() for c in k)  # c_customer_id is text, not the key
    fks = _fks(keys)
    assert ("call_center", "cc_mkt_id") not in fks and ("web_site", "web_mkt_id") not in fks
    assert not any(column.endswith("_id") for _, column in fks)


def test_tpcds_with_declared_primary_keys_finds_the_foreign_keys():
    """`dsdgen(keys=true)` declares primary keys only; those stay declared, the foreign keys are inferred."""
    db = relsql.connect()
    load(db.con, "tpcds")
    db.con.execute("CALL dsdgen(sf=0.01, keys=true)")
    keys = schema(db, db.catalog())
    assert not keys.inferred_primary and keys.primary_note("store_sales") == "declared"
    fks = _fks(keys)
    assert fks[("web_sales", "ws_bill_customer_sk")] == "customer"
    assert fks[("store_sales", "ss_sold_date_sk")] == "date_dim"
    assert fks[("customer", "c_current_hdemo_sk")] == "household_demographics"
    db.close()


def test_tpch_inference_keeps_its_keys():
    from relsql.datasets import tpch

    db = relsql.connect()
    tpch.generate(db.con, sf=0.01)
    keys = schema(db, db.catalog())
    assert keys.primary_keys["customer"] == ("c_custkey",) and keys.primary_keys["orders"] == ("o_orderkey",)
    assert keys.primary_keys["lineitem"] == ("l_orderkey", "l_linenumber")  # TPC-H's own key, not 4 columns
    assert keys.primary_keys["partsupp"] == ("ps_partkey", "ps_suppkey")
    fks = {(child, fk) for child, fk in keys.foreign_keys}
    assert ("orders", ForeignKey(("o_custkey",), "customer", ("c_custkey",))) in fks
    assert ("lineitem", ForeignKey(("l_orderkey",), "orders", ("o_orderkey",))) in fks
    assert ("lineitem", ForeignKey(("l_suppkey",), "supplier", ("s_suppkey",))) in fks
    assert len(fks) == 9
    db.close()


def test_best_scoring_parent_wins_and_orphans_need_exact_names():
    """Both demographics tables contain the values: the name decides. Orphans are tolerated
    (1%) only for an exact name match."""
    db = relsql.connect()
    db.execute("""
        CREATE TABLE customer_demographics AS SELECT range AS cd_demo_sk, range % 3 AS cd_dep_count FROM range(1, 101);
        CREATE TABLE household_demographics AS SELECT range AS hd_demo_sk, range % 5 AS hd_dep_count FROM range(1, 101);
        CREATE TABLE customer_address AS SELECT range AS ca_address_sk, 'x' || range AS ca_city FROM range(1, 101);
        CREATE TABLE sale AS SELECT range AS sale_sk, 1 + range % 50 AS sale_cdemo_sk, 1 + range % 40 AS sale_hdemo_sk,
            CASE WHEN range = 7 THEN 999 ELSE 1 + range % 90 END AS sale_address_sk,
            CASE WHEN range = 7 THEN 999 ELSE 1 + range % 90 END AS sale_addr_sk
            FROM range(1, 301);
    """)
    keys = schema(db, db.catalog())
    fks = _fks(keys)
    assert fks[("sale", "sale_cdemo_sk")] == "customer_demographics"
    assert fks[("sale", "sale_hdemo_sk")] == "household_demographics"
    assert fks[("sale", "sale_address_sk")] == "customer_address"  # exact name: 1 orphan in 300 tolerated
    fk = next(fk for child, fk in keys.foreign_keys if fk.columns == ("sale_address_sk",))
    assert "299 of 300 (1 missing)" in keys.foreign_note("sale", fk)
    assert ("sale", "sale_addr_sk") not in fks  # only an abbreviation: every value must be found
    db.close()


# -- keys given by the user ------------------------------------------------------------------------------------
KEYS = """-- people and their visits: names inference cannot link
ALTER TABLE people ADD PRIMARY KEY (pid);
FOREIGN KEY visits(who) REFERENCES people(pid)
PRIMARY KEY visits(vno)
"""


@pytest.fixture
def clinic(tmp_path):
    path = tmp_path / "clinic.duckdb"
    db = relsql.connect(path)
    db.execute("""
        CREATE TABLE people AS SELECT range AS pid, range % 2 = 0 AS sick, range * 1.5 AS age FROM range(1, 41);
        CREATE TABLE visits AS SELECT range AS vno, 1 + range % 40 AS who, range % 7 AS cost FROM range(1, 201);
    """)
    db.close()
    (tmp_path / "keys.sql").write_text(KEYS)
    return path


def test_keys_file_is_parsed_and_applied(clinic):
    plain = relsql.connect(clinic, read_only=True)
    alone = schema(plain, plain.catalog())
    assert not alone.primary_keys["people"] and not alone.foreign_keys  # `pid`, `who`: nothing to infer from
    keys = schema(plain, plain.catalog(), given=clinic.parent / "keys.sql")
    assert keys.primary_keys["people"] == ("pid",) and keys.primary_note("people") == "given in keys.sql line 2"
    assert ("visits", ForeignKey(("who",), "people", ("pid",))) in keys.foreign_keys
    assert keys.foreign_note("visits", ForeignKey(("who",), "people", ("pid",))) == "given in keys.sql line 3"
    plain.close()
    db = relsql.connect(clinic, read_only=True, keys=clinic.parent / "keys.sql")
    tables = relsql.Template.auto(db, "people.sick").source.split("-- tables used:")[1].splitlines()[0]
    assert "visits" in tables
    db.close()


def test_template_auto_takes_keys(clinic):
    db = relsql.connect(clinic, read_only=True)
    with pytest.raises(relsql.SchemaError, match="no primary key"):
        relsql.Template.auto(db, "people.sick")  # nothing to infer from
    source = relsql.Template.auto(db, "people.sick", keys=clinic.parent / "keys.sql").source
    assert "visits" in source.split("-- tables used:")[1].splitlines()[0]
    assert "given in keys.sql line 3" in source
    db.close()


def test_keys_as_text_and_as_tuples(clinic):
    db = relsql.connect(clinic, read_only=True)
    text = schema(db, db.catalog(), given="PRIMARY KEY people(pid)\nFOREIGN KEY visits(who) REFERENCES people")
    assert ("visits", ForeignKey(("who",), "people", ("pid",))) in text.foreign_keys  # REFERENCES t: t's primary key
    assert text.primary_note("people") == "given in the keys text line 1"
    listed = schema(db, db.catalog(),
                    given=[("PRIMARY KEY", "PEOPLE", "pid"), ("FOREIGN KEY", "visits", ["who"], "people", ["pid"])])
    assert listed.primary_keys["people"] == ("pid",)  # names are matched case-insensitively when unambiguous
    assert listed.foreign_note("visits", ForeignKey(("who",), "people", ("pid",))) == "given in the keys list entry 2"
    db.close()


@pytest.mark.parametrize(("text", "message"), [
    ("PRIMARY KEY people(pid)\nPRIMARY KEY patients(pid)", r"keys\.sql line 2: table `patients` does not exist"),
    ("\n\nALTER TABLE people ADD PRIMARY KEY (id);", r"keys\.sql line 3: `people` has no column `id`"),
    ("FOREIGN KEY visits(who) REFERENCES people(pid, age)", r"line 1: 1 column\(s\) reference 2"),
    ("PRIMARY KEY people", r"line 1: cannot parse 'PRIMARY KEY people'"),
    ("ALTER TABLE people ADD COLUMN x INT;", r"line 1: .* states no PRIMARY KEY or FOREIGN KEY"),
    ("DROP TABLE people;", r"line 1: 'DROP TABLE people' states no key"),
    ("FOREIGN KEY visits(who) REFERENCES people", r"`people` has no 1-column primary key"),
])
def test_bad_keys_files_name_the_line(clinic, text, message):
    keys = clinic.parent / "keys.sql"
    keys.write_text(text)
    opened = []
    with pytest.raises(relsql.SchemaError, match=message):
        opened.append(relsql.connect(clinic, read_only=True, keys=keys))
        schema(opened[0], opened[0].catalog(), infer=False)
    for db in opened:
        db.close()
    with pytest.raises(relsql.SchemaError, match="keys file .*missing.sql does not exist"):
        relsql.connect(clinic, read_only=True, keys=clinic.parent / "missing.sql")
    check = duckdb.connect(str(clinic), read_only=True)  # the file was never run against the database
    assert check.execute("SELECT count(*) FROM people").fetchone()[0] == 40
    assert not check.execute("SELECT * FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY'").fetchall()
    check.close()


def test_export_database_folder_declares_its_keys(tmp_path):
    """EXPORT DATABASE writes schema.sql beside the files; its constraints are the folder's keys."""
    con = duckdb.connect()
    con.execute("""
        CREATE TABLE owner(a INTEGER PRIMARY KEY, name VARCHAR);
        CREATE TABLE "Pet Log"(b INTEGER, c INTEGER, a INTEGER REFERENCES owner(a), w DOUBLE, PRIMARY KEY (b, c));
        INSERT INTO owner VALUES (1, 'x'), (2, 'y');
        INSERT INTO "Pet Log" VALUES (1, 1, 1, 2.0), (1, 2, 2, 3.0), (2, 1, 1, 4.0);
    """)
    for kind in ("PARQUET", "CSV"):
        folder = tmp_path / kind
        con.execute(f"EXPORT DATABASE '{folder}' (FORMAT {kind})")
        assert (folder / "schema.sql").is_file()
        db = relsql.connect(folder, read_only=True)
        catalog = db.catalog()
        pets = next(name for name in catalog.names if name != "owner")  # the file is named pet_log
        assert catalog["owner"].primary_key == ("a",) and catalog[pets].primary_key == ("b", "c")
        assert catalog[pets].foreign_keys == (ForeignKey(("a",), "owner", ("a",)),)
        keys = schema(db, catalog)
        assert keys.primary_note("owner") == "declared in schema.sql"
        db.close()
    con.close()


def test_inspect_marks_declared_given_and_inferred_keys(tmp_path, capsys):
    path = tmp_path / "shop.duckdb"
    db = relsql.connect(path)
    db.execute("""
        CREATE TABLE region(r_region_sk INTEGER PRIMARY KEY, r_name VARCHAR);
        CREATE TABLE store AS SELECT range AS s_store_sk, 1 + range % 3 AS s_region_sk, range AS s_owner FROM range(1, 11);
        CREATE TABLE staff AS SELECT range AS badge, 1 + range % 10 AS works_at FROM range(1, 31);
        INSERT INTO region VALUES (1, 'n'), (2, 's'), (3, 'e');
    """)
    db.close()
    keys = tmp_path / "keys.sql"
    keys.write_text("PRIMARY KEY staff(badge);\nFOREIGN KEY staff(works_at) REFERENCES store;\n")  # store's key
    assert main(["inspect", str(path), "--keys", str(keys)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"r_region_sk\s+INTEGER\s+PK \(declared\)", out)
    assert re.search(r"s_store_sk\s+BIGINT\s+PK \(inferred\)", out)
    assert re.search(r"s_region_sk\s+BIGINT\s+FK -> region\.r_region_sk \(inferred\)", out)
    assert re.search(r"badge\s+BIGINT\s+PK \(given in keys\.sql line 1\)", out)
    assert re.search(r"works_at\s+BIGINT\s+FK -> store\.s_store_sk \(given in keys\.sql line 2\)", out)
    assert "primary key (s_store_sk), inferred: names: s_store_sk names its table store" in out
    assert "foreign key (s_region_sk) -> region(r_region_sk), inferred: names: s_region_sk ~ r_region_sk" in out
    assert main(["inspect", str(path), "--no-infer"]) == 0
    assert "(inferred)" not in capsys.readouterr().out
    assert main(["inspect", str(path), "--keys", str(tmp_path / "none.sql")]) == 2  # usage: no such file
    keys.write_text("PRIMARY KEY staff(nope)\n")
    for argv in (["inspect", str(path)], ["template", str(path), "--target", "store.s_owner"],
                 ["train", str(path), "--template", str(keys), "--target", "store.s_owner"]):
        assert main([*argv, "--keys", str(keys)]) == 1
        assert "keys.sql line 1: `staff` has no column `nope`" in capsys.readouterr().err
