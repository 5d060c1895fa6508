"""Without a terminal, the Python API says where a long build or fit is, in lines on stderr:
each stage once, a few epochs per fit; progress=False silences them."""

from __future__ import annotations

import subprocess
import sys

import duckdb
import pytest

pytestmark = pytest.mark.slow  # two fresh processes (torch imports)

SCRIPT = """
import sys, relsql
db = relsql.connect(sys.argv[1])
quiet = sys.argv[2] == "quiet"
model = relsql.Model(db, relsql.Template.auto(db, target="item.y"), target="item.y", seed=0,
                     **({"progress": False} if quiet else {}))
model.fit(epochs=6, hybrid=False)
print("done")
"""


def _run(path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", "-c", SCRIPT, str(path), mode], capture_output=True, text=True,
                          timeout=300)


def test_stages_and_epochs_reach_stderr_unless_progress_is_false(tmp_path):
    path = tmp_path / "items.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE item AS SELECT range AS item_id, (range % 13) * 0.7 AS x, (range % 13) * 0.7 + (range % 3) AS y "
                "FROM range(300)")
    con.execute("ALTER TABLE item ADD PRIMARY KEY (item_id)")
    con.close()
    told = _run(path, "told")
    assert told.returncode == 0 and told.stdout.strip() == "done", told.stderr
    lines = [line for line in told.stderr.splitlines() if line.startswith("relsql: ")]
    assert any(line.startswith("relsql: grounded ") for line in lines)
    assert any(line.startswith("relsql: planned ") for line in lines)
    assert any(line.startswith("relsql: epoch 1 of 6") for line in lines)
    assert any(line.startswith("relsql: trained to epoch 6 of 6") for line in lines)
    assert len(lines) < 20  # once per stage, a few epochs: not a line per step
    quiet = _run(path, "quiet")
    assert quiet.returncode == 0 and "relsql: " not in quiet.stderr, quiet.stderr
