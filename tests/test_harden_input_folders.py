"""Dataset folders are untrusted input (issue 42, items 2 and 4): a RelBench folder's manifests and
footers, and the links in any folder, are refused with a SourceError naming the file and the
fix, never a raw exception, a hang, or a file outside the folder read as a table.

The folders are written here by hand (tiny Parquet files, hand-written YAML): RelBench 3's layout
(`manifest.yaml`, `db/`, `tasks/<task>/`) and the older one (keys as JSON in Parquet footers).
Cases that would hang if a check regressed (alias bombs) run in a child process with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import relsql
from relsql.errors import SourceError

TABLES = """tables:
  customers:
    pkey: customer_id
    time_col: null
    fkeys: {}
  orders:
    pkey: PKEY
    time_col: date
    fkeys:
      customer_id: PARENT
"""
TASK = """name: again
kind: external
task_type: TYPE
entity_table: customers
entity_col: customer_id
target_col: TARGET
time_col: date
"""
# 9 ** 8 = 43 million strings behind one name: what the "billion laughs" does with 8 lines
BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{p}' if p else 'lol'] * 9)}]\n"
               for p, a in zip(["", *"abcdefg"], "abcdefgh"))


def dataset(root: Path, manifest: str | None = None, task: str | None = None) -> Path:
    """A RelBench 3 folder: two tables and one task with a train/val/test split."""
    (root / "db").mkdir(parents=True)
    pq.write_table(pa.table({"customer_id": [0, 1, 2]}), root / "db" / "customers.parquet")
    dates = pa.array([1, 2, 3, 4], pa.int64()).cast(pa.timestamp("s"))
    pq.write_table(pa.table({"order_id": [0, 1, 2, 3], "customer_id": [0, 1, 1, 2], "date": dates}),
                   root / "db" / "orders.parquet")
    (root / "manifest.yaml").write_text(manifest or TABLES.replace("PKEY", "order_id").replace("PARENT", "customers"))
    folder = root / "tasks" / "again"
    folder.mkdir(parents=True)
    (folder / "manifest.yaml").write_text(task or TASK.replace("TYPE", "binary_classification").replace("TARGET", "again"))
    for i, split in enumerate(("train", "val", "test")):
        when = pa.array([10 * i + 1, 10 * i + 2], pa.int64()).cast(pa.timestamp("s"))
        pq.write_table(pa.table({"date": when, "customer_id": [0, 1], "again": [i % 2, 1]}), folder / f"{split}.parquet")
    return root


def test_a_well_formed_folder_opens(tmp_path):
    db = relsql.connect(dataset(tmp_path))
    assert db.tables() == ["again", "customers", "orders"]
    assert db.catalog()["orders"].primary_key == ("order_id",)


def refused(path: Path, *words: str) -> str:
    with pytest.raises(SourceError) as err:
        relsql.connect(path)
    text = str(err.value)
    assert all(w in text for w in words), text
    return text


FIELDS = {  # a manifest field of the wrong type: (manifest, task manifest), the field's name in the error
    "pkey int": (TABLES.replace("PKEY", "1"), None, "pkey"),
    "pkey list": (TABLES.replace("PKEY", "[order_id, date]"), None, "pkey"),
    "pkey dict": (TABLES.replace("PKEY", "{a: 1}"), None, "pkey"),
    "fkey parent list": (TABLES.replace("PARENT", "[customers]"), None, "fkeys.customer_id"),
    "fkey parent int": (TABLES.replace("PARENT", "7"), None, "fkeys.customer_id"),
    "fkeys a list": ("tables:\n  orders: {pkey: order_id, fkeys: [customer_id]}\n", None, "fkeys"),
    "tables a list": ("tables: [orders]\n", None, "tables"),
    "table spec an int": ("tables:\n  orders: 3\n", None, "table 'orders'"),
    "table name an int": ("tables:\n  1: {pkey: x}\n", None, "table's name"),
    "task_type list": (None, TASK.replace("TYPE", "[a, b]").replace("TARGET", "again"), "task_type"),
    "task_type dict": (None, TASK.replace("TYPE", "{a: b}").replace("TARGET", "again"), "task_type"),
    "target int": (None, TASK.replace("TYPE", "regression").replace("TARGET", "9"), "target_col"),
    "target list": (None, TASK.replace("TYPE", "regression").replace("TARGET", "[again]"), "target_col"),
    "entity_table list": (None, TASK.replace("TYPE", "regression").replace("TARGET", "again")
                          .replace("entity_table: customers", "entity_table: [customers]"), "entity_table"),
    "remove_columns int": (None, TASK.replace("TYPE", "regression").replace("TARGET", "again") + "remove_columns: 5\n",
                           "remove_columns"),
    "recommendation cols": (None, "src_entity_col: 5\nsrc_entity_table: customers\ndst_entity_col: [x]\n"
                            "dst_entity_table: orders\n", "src_entity_col"),
}


@pytest.mark.parametrize("case", FIELDS)
def test_a_manifest_field_of_the_wrong_type_is_named(tmp_path, case):
    manifest, task, field = FIELDS[case]
    root = dataset(tmp_path, manifest, task)
    refused(root, field, "manifest.yaml", "fix the manifest")


def test_deep_or_big_yaml_is_refused_before_it_is_built(tmp_path):
    root = dataset(tmp_path)
    (root / "manifest.yaml").write_text("tables: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n")
    refused(root, "manifest.yaml", "nested more than")
    (root / "manifest.yaml").write_text("tables:\n" + "".join("  " * i + "-\n" for i in range(1, 200)))
    refused(root, "manifest.yaml", "nested more than")
    (root / "manifest.yaml").write_text("tables:\n  x: [" + ",".join(["1"] * 120_000) + "]\n")
    refused(root, "manifest.yaml", "YAML values")
    (root / "manifest.yaml").write_text("# " + "x" * (2 << 20) + "\n")
    refused(root, "manifest.yaml", "bytes")


def test_alias_bombs_are_refused_before_they_expand(tmp_path):
    """In a child process with a deadline: an expanded bomb would run for minutes, not fail."""
    cases = {"pkey": (BOMB + TABLES.replace("PKEY", "*h").replace("PARENT", "customers"), None),
             "fkey": (BOMB + TABLES.replace("PKEY", "order_id").replace("PARENT", "*h"), None),
             "target": (None, BOMB + TASK.replace("TYPE", "regression").replace("TARGET", "*h")),
             "task_type": (None, BOMB + TASK.replace("TYPE", "*h").replace("TARGET", "again"))}
    roots = [str(dataset(tmp_path / name, *texts)) for name, texts in cases.items()]
    child = textwrap.dedent("""
        import sys, relsql
        for root in sys.argv[1:]:
            try:
                relsql.connect(root)
                print("opened", root)
            except relsql.RelsqlError as err:
                print(type(err).__name__, len(str(err)), str(err).replace(chr(10), " "))
    """)
    out = subprocess.run([sys.executable, "-c", child, *roots], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).parent.parent)
    lines = out.stdout.splitlines()
    assert len(lines) == len(cases), out.stdout + out.stderr
    for line, root in zip(lines, roots):
        kind, size, text = line.split(" ", 2)
        assert kind == "SourceError" and int(size) < 400 and "alias" in text and root in text, line


@pytest.mark.parametrize("make", ["fifo", "folder", "dangling link"])
@pytest.mark.parametrize("where", ["manifest.yaml", "tasks/again/manifest.yaml"])
def test_a_manifest_that_is_not_a_file_is_refused_not_skipped(tmp_path, make, where):
    root = dataset(tmp_path)
    path = root / where
    path.unlink()
    {"fifo": os.mkfifo, "folder": os.mkdir, "dangling link": lambda p: p.symlink_to(root / "gone.yaml")}[make](path)
    refused(root, str(path))


def test_parquet_footer_keys_nested_deep_or_mistyped(tmp_path):
    """The layout before manifests: relbench's keys as JSON in each file's footer."""
    root = tmp_path / "old"
    (root / "db").mkdir(parents=True)
    keys = {b"pkey_col": b'"customer_id"', b"time_col": b"null", b"fkey_col_to_pkey_table": b"{}"}
    pq.write_table(pa.table({"customer_id": [0, 1]}).replace_schema_metadata(keys), root / "db" / "customers.parquet")
    orders = root / "db" / "orders.parquet"
    for pkey, words in [(b"[" * 100_000 + b"]" * 100_000, ("orders.parquet", "plain JSON")),
                        (b'["order_id"]', ("orders.parquet", "pkey_col", "rewrite the file"))]:
        pq.write_table(pa.table({"order_id": [0]}).replace_schema_metadata({**keys, b"pkey_col": pkey}), orders)
        refused(root, *words)


def test_links_out_of_the_folder_are_refused(tmp_path):
    outside = tmp_path / "outside.csv"
    outside.write_text("secret\nhunter2\n")
    root = dataset(tmp_path / "set")
    (root / "db" / "passwd.csv").symlink_to("/etc/passwd")
    refused(root, "passwd.csv", "/etc/passwd", "outside the folder")
    (root / "db" / "passwd.csv").unlink()
    (root / "tasks" / "again" / "train.parquet").unlink()
    (root / "tasks" / "again" / "train.parquet").symlink_to(root.parent / "elsewhere.parquet")
    refused(root, "train.parquet", "outside the folder")

    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.table({"x": [1]}), plain / "t.parquet")
    (plain / "u.parquet").symlink_to("t.parquet")  # a link inside the folder is fine
    assert relsql.connect(plain).tables() == ["t", "u"]
    (plain / "secret.csv").symlink_to(outside)
    refused(plain, "secret.csv", str(outside), "outside the folder")
