"""A warehouse as it comes: TPC-DS from DuckDB's extension, no keys declared, three labels.

For each label: the automatic template (keys inferred, aggregation "all") against the majority
class and against the target-table-only model (the label table and the customer's own columns,
`hops=1`). The third label is a predictive query (a count of store sales in the next 90 days,
asked every 90 days) trained with `time_column="snapshot"`; a leakage check then shuffles the
store sales after a cut date and asserts that predictions for snapshots up to the cut stay the
same while later ones move.

    python demos/warehouse_evidence.py [--sf 0.1] [--epochs 40]

Prints a table and writes out/evidence/warehouse.csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import relsql  # noqa: E402
from relsql.connectors.extensions import load  # noqa: E402

QUERY = ("COUNT(store_sales.*) OVER 90 DAYS > 0 FOR customer.c_customer_sk = store_sales.ss_customer_sk "
         "TIME date_dim.d_date VIA store_sales.ss_sold_date_sk = date_dim.d_date_sk AT EVERY 90 DAYS")

LABELS = {
    # store spend above web spend, per customer with any sale: an aggregate over two fact tables
    "label_spend": """
        CREATE TABLE label_spend(c_customer_sk BIGINT PRIMARY KEY, label BOOLEAN);
        INSERT INTO label_spend
        SELECT c.c_customer_sk, coalesce(s.paid, 0) > coalesce(w.paid, 0)
        FROM customer c
        LEFT JOIN (SELECT ss_customer_sk AS k, sum(ss_net_paid) AS paid FROM store_sales GROUP BY 1) s ON s.k = c.c_customer_sk
        LEFT JOIN (SELECT ws_bill_customer_sk AS k, sum(ws_net_paid) AS paid FROM web_sales GROUP BY 1) w ON w.k = c.c_customer_sk
        WHERE s.paid IS NOT NULL OR w.paid IS NOT NULL""",
    # the household's income band, two hops from the customer (household_demographics -> income_band)
    "label_income": """
        CREATE TABLE label_income(c_customer_sk BIGINT PRIMARY KEY, label BOOLEAN);
        INSERT INTO label_income
        SELECT c.c_customer_sk, ib.ib_upper_bound > 100000
        FROM customer c JOIN household_demographics hd ON hd.hd_demo_sk = c.c_current_hdemo_sk
        JOIN income_band ib ON ib.ib_income_band_sk = hd.hd_income_band_sk""",
}


def train(db, target: str, hops: int, epochs: int, time_column: str | None = None,
          seed: int = 0) -> tuple[dict, float, relsql.Model]:
    started = time.perf_counter()
    template = relsql.Template.auto(db, target=target, hops=hops, width=16, time_column=time_column)
    model = relsql.Model(db, template, target=target, seed=seed, time_column=time_column, progress=False)
    model.fit(epochs=epochs, lr=0.01, patience=10)
    return model.evaluate(), time.perf_counter() - started, model


def leakage_check(db, model: relsql.Model, tmp: Path) -> tuple[float, float]:
    """Shuffle the customers of store sales after a cut; predictions for snapshots up to the cut must not move."""
    path = model.save(tmp / "task.pt")
    before = model.predict()
    snapshots = sorted(set(db.arrow('SELECT DISTINCT snapshot FROM "task_sales"').column(0).to_pylist()))
    cut = snapshots[len(snapshots) // 2]
    db.con.execute("""
        UPDATE store_sales SET ss_customer_sk = shuffled.k FROM (
            SELECT s.rowid AS r, lead(s.ss_customer_sk, 7, s.ss_customer_sk) OVER (ORDER BY s.ss_ticket_number, s.ss_item_sk) AS k
            FROM store_sales s JOIN date_dim d ON d.d_date_sk = s.ss_sold_date_sk WHERE d.d_date >= ?) shuffled
        WHERE store_sales.rowid = shuffled.r""", [cut])
    after = relsql.Model.load(path, db).predict()
    rows = db.arrow('SELECT task_id, snapshot FROM "task_sales" ORDER BY task_id')
    early = np.array([s <= cut for s in rows.column("snapshot").to_pylist()])
    key = before.columns[0]
    assert before[key].to_list() == after[key].to_list() == rows.column("task_id").to_pylist()
    moved = np.abs(before["probability"].to_numpy() - after["probability"].to_numpy())
    return float(moved[early].max()), float(moved[~early].max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    out = ROOT / "out" / "evidence"
    out.mkdir(parents=True, exist_ok=True)
    db = relsql.connect()
    load(db.con, "tpcds")
    started = time.perf_counter()
    db.execute(f"CALL dsdgen(sf={float(args.sf)})")
    print(f"TPC-DS sf {args.sf} generated in {time.perf_counter() - started:.1f}s, no keys declared")
    task = relsql.PredictiveQuery.parse(QUERY).write(db, "task_sales")
    print(task)
    rows = []
    for target, time_column in (("label_spend.label", None), ("label_income.label", None), ("task_sales.label", "snapshot")):
        label_table = target.split(".")[0]
        if label_table in LABELS:  # one label table at a time: another label is not an input of this one
            db.execute(LABELS[label_table])
        results = {}
        for name, hops in (("auto", 3 if "income" in target else 2), ("target table only", 1)):
            scores, seconds, model = train(db, target, hops, args.epochs, time_column)
            results[name] = (scores, seconds, model)
        auto, own = results["auto"], results["target table only"]
        baseline = auto[2].baseline("test")
        row = {"target": target, "time_column": time_column or "", "test_rows": len(auto[2].rows["test"]),
               "auto_accuracy": auto[0]["accuracy"], "auto_roc_auc": auto[0]["roc_auc"], "auto_seconds": auto[1],
               "own_accuracy": own[0]["accuracy"], "own_roc_auc": own[0]["roc_auc"], "majority_accuracy": baseline["accuracy"]}
        rows.append(row)
        print(f"{target:<20} auto acc {row['auto_accuracy']:.3f} AUC {row['auto_roc_auc']:.3f} ({auto[1]:.0f}s) | "
              f"target table only acc {row['own_accuracy']:.3f} AUC {row['own_roc_auc']:.3f} | "
              f"majority {row['majority_accuracy']:.3f}")
        if time_column:
            early, late = leakage_check(db, auto[2], out)
            print(f"  leakage check: store sales after the middle snapshot shuffled; predictions up to it moved by at most "
                  f"{early:.2e}, later ones by up to {late:.2e}")
            assert early < 1e-5 < late, (early, late)
            row["moved_up_to_cut"], row["moved_after_cut"] = early, late
        if label_table in LABELS:
            db.execute(f'DROP TABLE "{label_table}"')
    with open(out / "warehouse.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out / 'warehouse.csv'}")


if __name__ == "__main__":
    main()
