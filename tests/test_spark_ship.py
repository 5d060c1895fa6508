"""relsql.data.spark_ship without a cluster: the zip it ships, the digest that decides whether to
ship, and the fix it names (tests/test_spark_cluster.py runs it on a standalone cluster)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import relsql
from relsql.data import spark_ship

PACKAGE = Path(relsql.__file__).resolve().parent


def _naive_digest(files: dict[str, bytes]) -> str:
    """The digest as documented: sha256 over sorted (relative path, sha256 of the bytes)."""
    total = hashlib.sha256()
    for name in sorted(files):
        total.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return total.hexdigest()


def test_the_zip_holds_every_python_file_of_relsql_and_nothing_else():
    on_disk = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    with zipfile.ZipFile(spark_ship.package_zip()) as archive:
        names = archive.namelist()
        assert {n.removeprefix("relsql/") for n in names} == on_disk
        assert all(n.startswith("relsql/") and n.endswith(".py") for n in names)
        assert archive.read("relsql/__init__.py") == (PACKAGE / "__init__.py").read_bytes()


def test_the_digest_is_the_same_for_the_folder_and_the_zip_and_follows_the_content(tmp_path):
    files = {p.relative_to(PACKAGE).as_posix(): p.read_bytes() for p in PACKAGE.rglob("*.py")
             if "__pycache__" not in p.parts}
    assert spark_ship.digest() == _naive_digest(files)
    digest_of = spark_ship._digester()
    assert digest_of(f"{spark_ship.package_zip()}/relsql") == spark_ship.digest()
    copy = tmp_path / "relsql"
    for name, content in files.items():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes(content)
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "stale.py").write_text("x = 1\n")  # not part of the package
    (copy / "notes.txt").write_text("not Python")
    assert digest_of(str(copy)) == spark_ship.digest()
    (copy / "errors.py").write_bytes(files["errors.py"] + b"\n# another version\n")
    assert digest_of(str(copy)) != spark_ship.digest()


def test_a_missing_dependency_is_named_with_the_pip_command():
    probe = spark_ship.Probe(python="/opt/py/bin/python", missing=("torch (ModuleNotFoundError: No module named 'torch')",
                                                                    "yaml (ModuleNotFoundError: No module named 'yaml')"),
                             digest=None, where=None)
    message = spark_ship._install_fix(probe, "train")
    import torch

    assert "/opt/py/bin/python cannot import torch, yaml" in message
    assert f"/opt/py/bin/python -m pip install 'torch=={torch.__version__.split('+')[0]}' 'pyyaml" in message
    assert "spark.relsql.ranksOn=driver" in message


def test_a_session_without_a_spark_context_is_left_alone():
    class Connect:  # a Spark Connect session: its module names it, and it has no SparkContext here
        __module__ = "pyspark.sql.connect.session"

    session = Connect()
    spark_ship.ensure(session, spark_ship.TRAIN)  # no job, no error: nothing can be shipped over Connect
    assert not spark_ship.shipped(session)
    assert spark_ship.rank_entry(session, print, 1, 2) == (print, (1, 2))
