"""Saved models are input too (issue 42, items 4 and 5): a file named like a model may be a FIFO,
a zip bomb, a pickle whose shared references stand for billions of values, tensors that claim
more elements than their bytes, a split naming rows that do not exist, a blend with a GBM that
reads another table; and its template may call functions that change the database. Each is a
RelsqlError naming the file (and the statement, for a template), refused before the cost it
would run up; a refused template leaves the user's sequence as it was.

One small model (tests/test_trainer.py's customers, with a GBM blend) is trained once; the cases
are that file's contents changed and written back with torch.save, as an attacker would."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pyarrow as pa
import pytest
import torch

import relsql
from relsql.errors import RelsqlError, TemplateError
from relsql.train.persist import checkpoint as files
from tests.test_trainer import TEMPLATE, customers

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    """A model file with a GBM blend, and its contents as torch reads them."""
    db = customers()
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), "customer.churned", seed=5, dtype=torch.float64,
                         progress=False, split=(0.6, 0.2, 0.2))
    model.fit(epochs=2, lr=0.05, hybrid=True)
    assert model.learner.hybrid is not None
    path = model.save(tmp_path_factory.mktemp("model") / "m.pt")
    return path, torch.load(path, weights_only=True)


def write(tmp_path: Path, contents: dict, change) -> Path:
    state = copy.deepcopy(contents)
    change(state)
    path = tmp_path / "changed.pt"
    torch.save(state, path)
    return path


def test_the_model_file_loads_and_predicts(saved):
    path, _ = saved
    db = customers()
    assert relsql.Model.load(path, db).predict().height == 240


def nested(levels: int = 8, width: int = 9) -> list:
    """width ** levels floats behind one list of `width` references (pickle keeps the sharing)."""
    value: list = [1.0] * width
    for _ in range(levels):
        value = [value] * width
    return value


def tuple_key(levels: int = 21) -> tuple:
    """A dict key whose hash visits 2 ** levels tuples (at 40 levels, unpickling it would never finish:
    building the dict hashes the key; the test stays at 21, past the limit, so that building it here is quick)."""
    value: tuple = ("a", "b")
    for _ in range(levels):
        value = (value, value)
    return value


def cycle() -> list:
    value: list = []
    value.append(value)
    return value


def broadcast(dtype: torch.dtype) -> torch.Tensor:
    """10^10 elements over one stored number (stride 0): 8 bytes in the file, 80 GB once copied."""
    return torch.zeros(1, dtype=dtype).expand(10**10)


CHANGES = {  # what is changed -> words the RelsqlError must hold
    "history of 9^9 shared floats": (lambda s: s.update(history=nested()), ["500,000 values", "shared"]),
    "a tuple bomb as a dict key": (lambda s: s.update(feature_stats={tuple_key(): 1}), ["500,000 values", "shared"]),
    "a history of 600,000 floats": (lambda s: s.update(history=[0.5] * 600_000), ["builds more than 500,000 values"]),
    "a list holding itself": (lambda s: s.update(history=cycle()), ["holds itself"]),
    "a bytearray (a global relsql never writes)": (lambda s: s.update(history=[bytearray(8)]), ["bytearray"]),
    "10^10 test rows": (lambda s: s["rows"].update(test=broadcast(torch.int64)), ["80,000,000,000 bytes"]),
    "10^10 GBM nodes": (lambda s: s["hybrid"]["trees"].update(feature=broadcast(torch.int64)), ["80,000,000,000 bytes"]),
    "a negative row": (lambda s: s["rows"].update(test=torch.tensor([-1])), ["negative row position"]),
    "a row in two splits": (lambda s: s["rows"].update(test=s["rows"]["train"].clone()), ["one row twice"]),
    "a 0-dim weight": (lambda s: s["weights"].update(w_order=torch.tensor(1.0, dtype=torch.float64)),
                       ["w_order", "single number"]),
    "a class table with no column": (lambda s: s["task"].update(classes=files.table_bytes(pa.table({}))),
                                     ["class labels", "0 columns"]),
    "classes that are structs": (lambda s: s["task"].update(classes=files.table_bytes(pa.table({"value": [{"a": 1}]}))),
                                 ["class labels", "struct"]),
    "a blend reading another table": (lambda s: s["hybrid"]["features"].update(table="orders"),
                                      ["hybrid", "'orders'", "`customer`"]),
    "a blend with no keys": (lambda s: s["hybrid"]["features"].update(keys=[]), ["hybrid", "joins on []"]),
    "a blend join on no columns": (lambda s: s["hybrid"]["features"]["children"][0].update(columns=[], references=[]),
                                   ["hybrid", "names no columns"]),
    "a blend of 10^12 scores per row": (lambda s: s["hybrid"]["trees"].update(units=10**12),
                                        ["hybrid", "1,000,000,000,000 scores"]),
    "blend scores that are text": (lambda s: s["hybrid"].update(scores=[["a", "b"]]), ["hybrid", "pairs of numbers"]),
    "a 10 MB task kind": (lambda s: s["task"].update(kind="x" * 10_000_000), ["task must be one of"]),
    "a NULL flag that is a tensor": (lambda s: next(iter(s["feature_stats"].values())).update(nulls=torch.ones(8, 2)),
                                     ["feature statistics", "nulls is not true or false"]),
}


@pytest.mark.parametrize("case", CHANGES)
def test_a_crafted_model_file_is_refused_naming_the_file(saved, tmp_path, case):
    change, words = CHANGES[case]
    path = write(tmp_path, saved[1], change)
    with pytest.raises(RelsqlError) as err:
        relsql.Model.load(path, customers())
    text = str(err.value)
    assert str(path) in text and all(w in text for w in words) and len(text) <= 700, text[:1000]


def test_rows_and_blend_columns_are_checked_against_the_database(saved, tmp_path):
    """What only the database can confirm: row 10^9 of 218 labelled rows (a split that is not this
    database's: said, and not kept, so predict works and evaluate says the split is empty instead
    of indexing past the rows); a column the blend reads."""
    path = write(tmp_path, saved[1], lambda s: s["rows"].update(test=torch.tensor([10**9])))
    with pytest.warns(RuntimeWarning, match=r"names labelled row 1,000,000,000, but .* has 218 labelled rows") as caught:
        loaded = relsql.Model.load(path, customers())
    assert str(path) in str(caught[0].message)
    assert loaded.predict().height > 0
    with pytest.raises(RelsqlError, match="test split has no rows"):
        loaded.evaluate("test")
    parent = {"table": "orders", "columns": ["region"], "references": ["no_such_column"], "features": []}
    path = write(tmp_path, saved[1], lambda s: s["hybrid"]["features"]["parents"].append(parent))
    with pytest.raises(RelsqlError, match=r"GBM blend reads column\(s\) \['no_such_column'\] of `orders`"):
        relsql.Model.load(path, customers())


@pytest.mark.parametrize("call", ["nextval('seq')", "currval('seq')"])
def test_a_template_calling_a_sequence_is_refused_and_the_sequence_is_unchanged(saved, tmp_path, call):
    old = "features(o.amount, o.express)"
    path = write(tmp_path, saved[1],
                 lambda s: s.update(template=s["template"].replace(old, f"features(o.amount + 0 * {call}, o.express)")))
    db = customers()
    db.execute("CREATE SEQUENCE seq START 1")
    db.con.execute("SELECT nextval('seq')")  # currval needs a value
    with pytest.raises(TemplateError) as err:
        relsql.Model.load(path, db)
    assert str(path) in str(err.value) and "statement 1" in str(err.value) and call.split("(")[0] + "()" in str(err.value)
    assert db.con.execute("SELECT nextval('seq')").fetchone()[0] == 2  # the template advanced nothing


def test_not_a_regular_file_or_not_torch_zip(saved, tmp_path):
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    with pytest.raises(RelsqlError, match="not a regular file"):
        relsql.Model.load(fifo, customers())
    legacy = tmp_path / "legacy.pt"
    torch.save(saved[1], legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(RelsqlError, match="not torch's zip format"):
        relsql.Model.load(legacy, customers())


def test_a_deflated_record_is_refused_before_it_is_inflated(saved, tmp_path):
    """A file of under a megabyte whose storage record inflates to 256 MB (the review's: 1 GB):
    refused from the zip's directory, in a child process whose peak memory stays far below what
    inflating would take."""
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(saved[0]) as source, zipfile.ZipFile(path, "w") as bomb:
        for record in source.infolist():
            data = source.read(record)
            if not record.filename.endswith("/data/0"):
                bomb.writestr(record, data)
                continue
            deflated = zipfile.ZipInfo(record.filename)
            deflated.compress_type = zipfile.ZIP_DEFLATED
            with bomb.open(deflated, "w", force_zip64=True) as out:
                out.write(data)
                zeros = bytes(1 << 20)
                for _ in range(256):
                    out.write(zeros)
    assert path.stat().st_size < 1 << 20
    child = textwrap.dedent("""
        import resource, sys
        import relsql
        from tests.test_trainer import customers
        db = customers()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            relsql.Model.load(sys.argv[1], db)
            print("loaded")
        except relsql.RelsqlError as err:
            print(str(err).replace(chr(10), " "))
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    message, grown = out.stdout.strip().splitlines()[-2:]
    assert "is compressed" in message and "inflate to 268," in message and str(path) in message, out.stdout + out.stderr
    assert int(grown) < 100, f"peak memory grew by {grown} MB while refusing"
