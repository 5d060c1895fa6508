"""`pip install relsql; relsql demo` works without a checkout (issue 43, item 4).

The checkout is built into a wheel (no build isolation, no index: nothing is downloaded), the
wheel is installed into a fresh venv whose only other packages are this environment's (by a
plain path entry, so the checkout's editable install is not on its path), and that venv's
`relsql demo` runs in a folder outside the checkout. The oracles are the wheel's file list and
the Mutagenesis figures published with the data (188 molecules, 4,893 atoms, 5,243 bonds),
plus the predictions table read back with DuckDB against the molecule ids of the Parquet file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = {"molecule": 188, "atom": 4893, "bond": 5243}  # README and docs/evidence.md


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _wheel(tmp: Path, env: dict[str, str]) -> Path:
    """The checkout's working tree built into a wheel, from a copy (the build writes build/ and egg-info)."""
    source = tmp / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "relsql", source / "relsql", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          str(source), "-w", str(tmp / "dist")], cwd=tmp, env=env)
    [wheel] = (tmp / "dist").glob("relsql-*.whl")
    return wheel


def _venv(tmp: Path, wheel: Path, env: dict[str, str]) -> Path:
    """A fresh venv holding the wheel; this environment's packages are reached through a .pth path
    line (not processed as a site dir, so the checkout's editable-install hook never runs)."""
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp, env=env)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp,
                   env=env).stdout.strip()
    (Path(purelib) / "zz_outer_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
         cwd=tmp, env=env)
    return venv


def test_an_installed_wheel_runs_the_demo_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env |= {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"}
    wheel = _wheel(tmp_path, env)
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {"relsql/sql_templates/mutagenesis.sql", "relsql/datasets/mutagenesis/data/schema.sql"}
    shipped |= {f"relsql/datasets/mutagenesis/data/{t}.parquet" for t in PUBLISHED}
    assert shipped <= names, shipped - names
    assert not any(n.startswith(("sql/", "demos/")) for n in names)
    assert {n.split("/")[0] for n in names} == {"relsql", wheel.name.split("-py3")[0] + ".dist-info"}  # one package
    assert {"relsql/connectors/files.py", "relsql/datasets/neuralogic_files.py"} <= names

    venv = _venv(tmp_path, wheel, env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([str(venv / "bin" / "python"), "-c",
                  "import sys, relsql.cli.demo as d; print(d.__file__); print(*sys.path, sep='\\n')"],
                 cwd=elsewhere, env=env).stdout.splitlines()
    assert Path(where[0]).is_relative_to(venv), where[0]  # the installed package, not the checkout's
    assert not any(p and Path(p).resolve() == ROOT for p in where[1:]), where

    # the source connectors and the dataset loaders come from the wheel too: a folder of Parquet files opens
    folder = elsewhere / "files"
    folder.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3]}), folder / "points.parquet")
    opened = _run([str(venv / "bin" / "python"), "-c",
                   "import sys, relsql, relsql.connectors.files as f, relsql.datasets.tpch as t\n"
                   "db = relsql.connect(sys.argv[1])\n"
                   "print(f.__file__, t.__file__, db.tables(), db.con.execute('SELECT count(*) FROM points').fetchone()[0])",
                   str(folder)], cwd=elsewhere, env=env).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in opened[:2]), opened
    assert opened[2:] == ["['points']", "3"], opened

    db = tmp_path / "demo.duckdb"
    out = _run([str(venv / "bin" / "relsql"), "demo", "--db", str(db), "--epochs", "2", "--patience", "1"],
               cwd=elsewhere, env=env).stdout
    counts = dict((t, int(n.replace(",", ""))) for t, n in re.findall(r"(molecule|atom|bond) ([\d,]+) rows", out))
    assert counts == PUBLISHED, out
    metrics = re.search(r"test accuracy ([\d.]+) \(majority class ([\d.]+)\), ROC-AUC ([\d.]+)", out)
    assert metrics, out
    assert all(0.0 <= float(v) <= 1.0 for v in metrics.groups()), metrics.groups()
    assert "mutagenesis.sql" in out and "wrote 188 predictions" in out, out

    data = Path(where[0]).parents[1] / "datasets" / "mutagenesis" / "data"
    molecules = set(pq.read_table(data / "molecule.parquet", columns=["molecule_id"]).column(0).to_pylist())
    with duckdb.connect(str(db), read_only=True) as con:
        predicted = [r[0] for r in con.execute('SELECT molecule_id FROM "mutagenesis_predictions"').fetchall()]
    assert len(predicted) == len(molecules) == PUBLISHED["molecule"]
    assert set(predicted) == molecules
