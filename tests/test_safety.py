"""relsql never modifies the user's data: sources are byte-for-byte unchanged after training,
prediction and evaluation, except for the tables it was asked to write."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq

import relsql
from tests.test_model import SIMPLE, build


def digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_parquet_folder_unchanged_except_written_predictions(tmp_path):
    source = build(tmp_path / "build.duckdb")
    folder = tmp_path / "shop"
    folder.mkdir()
    for table in ("customer", "orders"):
        pq.write_table(source.arrow(f'SELECT * FROM "{table}"'), folder / f"{table}.parquet")
    source.con.close()
    before = digests(folder)
    db = relsql.connect(folder)
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
    model.fit(epochs=5)
    model.evaluate()
    model.predict()
    model.write_predictions("predictions")
    after = digests(folder)
    assert {k: v for k, v in after.items() if k != "predictions.parquet"} == before
    assert pq.read_table(folder / "predictions.parquet").num_rows == 300


def test_duckdb_file_bytes_unchanged_by_training_read_only(tmp_path):
    path = tmp_path / "shop.duckdb"
    build(path).con.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    db = relsql.connect(path, read_only=True)
    model = relsql.Model(db, relsql.Template.from_sql(SIMPLE), target="customer.churned", seed=0, progress=False)
    model.fit(epochs=5)
    model.predict()
    model.save(tmp_path / "m.pt")
    relsql.Model.load(tmp_path / "m.pt", db).predict()
    db.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_time_conditioned_join_keeps_the_future_out(tmp_path):
    """With the cut-off in the join, changing rows after a target's time does not move its prediction."""
    db = relsql.connect(tmp_path / "t.duckdb")
    db.execute("""
        CREATE TABLE customer(customer_id INT PRIMARY KEY, snapshot DATE, churned BOOLEAN);
        INSERT INTO customer VALUES (1, DATE '2020-02-01', true), (2, DATE '2020-03-01', false),
                                    (3, DATE '2020-04-01', true), (4, DATE '2020-05-01', false);
        CREATE TABLE orders(order_id INT PRIMARY KEY, customer_id INT, day DATE, amount DOUBLE);
        INSERT INTO orders VALUES (1, 1, DATE '2020-01-10', 5), (2, 1, DATE '2020-03-10', 7), (3, 2, DATE '2020-02-10', 1),
                                  (4, 3, DATE '2020-03-15', 2), (5, 4, DATE '2020-04-20', 3), (6, 2, DATE '2020-06-01', 9);
    """)
    tpl = relsql.Template.from_sql("""
        CREATE TABLE predict AS
        SELECT c.customer_id, linear(avg(linear(o.amount, 4, 'w')), 1, 'v')
        FROM customer c JOIN orders o ON o.customer_id = c.customer_id AND o.day < c.snapshot
        GROUP BY c.customer_id;
    """)
    first = relsql.Model(db, tpl, target="customer.churned", seed=0, split=(0.5, 0.25, 0.25), progress=False).predict()
    db.execute("UPDATE orders SET amount = amount * 100 WHERE order_id IN (2, 6)")  # both after their snapshots
    second = relsql.Model(db, tpl, target="customer.churned", seed=0, split=(0.5, 0.25, 0.25), progress=False).predict()
    assert first.equals(second)
    db.execute("UPDATE orders SET amount = 50 WHERE order_id = 1")  # before customer 1's snapshot
    third = relsql.Model(db, tpl, target="customer.churned", seed=0, split=(0.5, 0.25, 0.25), progress=False).predict()
    assert not first.equals(third)
    assert pa.types.is_boolean(third.to_arrow().schema.field("prediction").type)
