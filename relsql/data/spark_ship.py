"""relsql on Spark's executors without an install there: the package travels with the job.

Spark runs relsql's own code on the executors twice: the grounding store's writer (a job whose
function is pickled from relsql.data.spark and imports relsql.ground.parts) and the training ranks
(TorchDistributor's barrier tasks start torchrun, whose processes unpickle relsql's rank function).
A data cluster's executors rarely have relsql, or have another version of it. So once per
SparkSession, before the first such job, a one-task job asks an executor's Python:
- which of the modules the job needs it cannot import (STORE for the writer; TRAIN for the ranks),
- which relsql it would import, as a digest of its .py files (no import: a reused Python worker
  keeps the modules it once imported).
Missing dependencies are named with the pip command that installs them (they are compiled
wheels: no zip carries them). A missing or different relsql is shipped: a zip of this process's
relsql (its .py files; built once per process into a temporary folder) goes to
`SparkContext.addPyFile`, which puts it first on every Python worker's sys.path, and the probe
is asked again. Torchrun's processes do not read addPyFile's files: a shipped session's ranks
start through `rank_entry`, a function sent by value that carries the zip's bytes, writes them to
the node's temporary folder and puts the zip first on sys.path before unpickling the rank.

The same job serves relsql.data.spark's check before the first store is written (`ensure(session,
STORE, modules)`): an executor's Python that cannot run it, or lacks a module, is named with the
fix. Spark Connect sessions have no SparkContext on this side: nothing is shipped there, so the
store's check asks the executors (through a DataFrame job) for relsql's modules themselves."""

from __future__ import annotations

import atexit
import functools
import shutil
import sys
import tempfile
import weakref
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from relsql.data.engine import first_line
from relsql.errors import RelsqlError, SourceError

STORE = ("numpy", "pyarrow", "sqlglot")  # relsql.ground.parts, the store writer: no torch (a data cluster rarely has it)
TRAIN = ("numpy", "pyarrow", "torch", "pandas", "duckdb", "sqlglot", "polars", "tqdm")  # a rank: relsql's training
# code, and pandas for TorchDistributor's result (measured: what importing the ranks' modules loads)
_DISTRIBUTION = {"yaml": "pyyaml"}  # module -> pip name, where they differ
_checked: dict[tuple[str, ...], weakref.WeakSet] = {STORE: weakref.WeakSet(), TRAIN: weakref.WeakSet()}
_shipped: weakref.WeakSet = weakref.WeakSet()  # sessions whose executors run the shipped zip
_added: weakref.WeakSet = weakref.WeakSet()  # SparkContexts the zip was added to


@dataclass(frozen=True)
class Probe:
    """What one executor's Python said: itself, what it failed to import, its relsql."""

    python: str
    missing: tuple[str, ...]  # "module (Error: message)"
    digest: str | None  # of the relsql it would import; None when it finds none
    where: str | None  # that relsql's folder (or zip)
    failure: str | None = None  # why the job itself failed (the worker's Python did not start); then nothing else is known


def ensure(session, needs: tuple[str, ...], modules: tuple[str | None, ...] = ()) -> None:
    """Once per session and purpose (STORE or TRAIN), in one job: the executors import relsql, this
    very version (shipped when they lack it or have another), the modules in `needs` that this
    process has, and relsql's own `modules` (the store writer's: imported there only once that
    relsql is this one, so a reused Python worker never keeps another version); else a RelsqlError
    (for STORE a SourceError) naming the executors' Python and the fix. Spark Connect: TRAIN is
    not asked here (nothing can be shipped); STORE asks for relsql's modules whatever its version."""
    context = _context(session)
    if session in _checked[needs] or (context is None and needs is not STORE):
        return
    wanted = [m for m in needs if _importable(m)]
    own = [m for m in dict.fromkeys(modules) if m and _importable(m)]
    probe = _probe(session, wanted, own, None if context is None else digest())
    if probe.failure is not None and needs is STORE:
        raise SourceError(f"Spark's Python workers could not run a job of relsql ({probe.failure}); "
                          f"{python_fix(session, None)}")
    if probe.failure is not None:
        raise RelsqlError("Spark's Python workers could not run relsql's probe job: give the executors a Python "
                          "(PYSPARK_PYTHON) with numpy, pyarrow, torch and pandas")
    if not probe.missing and context is not None and probe.digest != digest():
        ship(session)
        probe = _probe(session, wanted, own, digest())
        if probe.failure is not None or probe.digest != digest():
            raise RelsqlError(
                f"Spark's executors import relsql from {probe.where} even with this process's relsql shipped "
                f"({package_zip().name}): a Python worker that imported it before keeps it. Restart the "
                f"application (a new SparkSession), or install this relsql version there ({probe.python} -m pip install ...)")
    if probe.missing and needs is STORE:
        raise SourceError(f"Spark's Python workers run {probe.python}, which cannot import {'; '.join(probe.missing)}: "
                          f"relsql's grounding store is written there. {python_fix(session, probe.python)}")
    if probe.missing:
        raise RelsqlError(_install_fix(probe, "train a model with fit(workers=...) on Spark's executors"))
    _checked[needs].add(session)


def python_fix(session, executable: str | None) -> str:
    """What to set so that the store writer's executors run a Python that can (this one, say)."""
    context = _context(session)
    used = "" if executable else f"The workers' Python is {getattr(context, 'pythonExec', None) or 'python3 from PATH'}; "
    needs = ", ".join(STORE)
    if context is None:  # Spark Connect: this process is a client; nothing goes from here to the executors
        return (f"{used}over Spark Connect nothing is shipped from this process: install relsql (this version) and "
                f"{needs} in the Python the server's executors run (its PYSPARK_PYTHON or spark.pyspark.python; "
                f"this process runs {sys.executable})")
    return (f"{used}Give the workers a Python with {needs} (relsql itself is shipped with the job; this process runs "
            f"{sys.executable}): set the PYSPARK_PYTHON environment variable before the SparkSession starts (in-process "
            "PySpark reads only that variable; spark-submit also reads the spark.pyspark.python setting), or install "
            f"them in the workers' Python ({executable or 'python3'} -m pip install {' '.join(STORE)})")


def ship(session) -> None:
    """This process's relsql to the session's executors (addPyFile, once per SparkContext)."""
    context = _context(session)
    if context is None:
        raise RelsqlError("relsql is shipped to a classic SparkSession's executors only: install relsql on the Spark "
                          "Connect server's cluster")
    if context not in _added:
        context.addPyFile(str(package_zip()))
        _added.add(context)
    _shipped.add(session)


def shipped(session) -> bool:
    """Whether this session's executors run relsql from the zip sent by `ship`."""
    return session in _shipped


def rank_entry(session, function: Callable, *args) -> tuple[Callable, tuple]:
    """(function, args) for TorchDistributor: as given when the executors have relsql; for a
    shipped session, a function sent by value that puts the zip on torchrun's processes'
    sys.path and then unpickles and calls `function(*args)` (pickled here, read there)."""
    if not shipped(session):
        return function, args
    from pyspark import cloudpickle

    payload = cloudpickle.dumps((function, args))
    name, blob = package_zip().name, package_zip().read_bytes()

    def shipped_rank(call: bytes):  # nested: cloudpickle sends it, and the zip's bytes, by value
        import os
        import pickle
        import sys
        import tempfile as temporary

        path = os.path.join(temporary.gettempdir(), name)
        if not os.path.exists(path):  # each node's first rank writes it; a rename, so no rank reads half a file
            partial = f"{path}.{os.getpid()}"
            with open(partial, "wb") as out:
                out.write(blob)
            os.replace(partial, path)
        if path not in sys.path:
            sys.path.insert(0, path)
        target, target_args = pickle.loads(call)
        return target(*target_args)

    return shipped_rank, (payload,)


# -- the package ----------------------------------------------------------------------------------
def _sources() -> Path:
    return Path(__file__).resolve().parents[1]  # the relsql folder this module is in


@functools.cache
def digest() -> str:
    """This process's relsql: the digest of its .py files (the executors' is compared with it)."""
    return _digester()(str(_sources()))


@functools.cache
def package_zip() -> Path:
    """A zip of this process's relsql (.py files only: data files stay on the driver), written once
    per process into a temporary folder removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="relsql-ship-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / f"relsql-{digest()[:16]}.zip"
    root = _sources()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(root.rglob("*.py")):
            if "__pycache__" not in file.parts:
                archive.write(file, f"relsql/{file.relative_to(root).as_posix()}")
    return path


def _digester() -> Callable[[str], str]:
    """The digest of the relsql package at a folder, or inside a zip (`.../x.zip/relsql`). Built
    by a factory, so that the executors' probe carries it by value (they may have no relsql)."""

    def digest_of(location: str) -> str:
        import hashlib
        import os
        import zipfile as zips

        files: dict[str, bytes] = {}
        archive = next((location[:i + 4] for i in range(len(location)) if location[i:i + 4] == ".zip"
                        and os.path.isfile(location[:i + 4])), None)
        if archive is not None:
            prefix = location[len(archive) + 1:].replace(os.sep, "/").rstrip("/") + "/"
            with zips.ZipFile(archive) as opened:
                for name in opened.namelist():
                    if name.startswith(prefix) and name.endswith(".py") and "__pycache__" not in name:
                        files[name[len(prefix):]] = opened.read(name)
        else:
            for folder, subfolders, names in os.walk(location):
                subfolders[:] = [s for s in subfolders if s != "__pycache__"]
                for name in names:
                    if name.endswith(".py"):
                        path = os.path.join(folder, name)
                        with open(path, "rb") as source:
                            files[os.path.relpath(path, location).replace(os.sep, "/")] = source.read()
        total = hashlib.sha256()
        for name in sorted(files):
            total.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        return total.hexdigest()

    return digest_of


# -- the executors ---------------------------------------------------------------------------------
def _context(session):
    """The session's SparkContext; None for Spark Connect (no SparkContext on this side)."""
    if type(session).__module__.startswith("pyspark.sql.connect"):
        return None
    return getattr(session, "sparkContext", None)


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _probe(session, modules: list[str], own: list[str], expected: str | None) -> Probe:
    """One task's answer (a Probe with `failure` when the job failed: the worker's Python did not
    start). `own` (relsql's modules) are imported only where the relsql found has the digest
    `expected` (None: whatever it is). The probe is built here, so cloudpickle sends it by value:
    the worker needs no relsql to run it. Classic sessions run it as an RDD job (it needs nothing
    but pyspark there), Spark Connect sessions as a DataFrame's mapInArrow (pyarrow: STORE's)."""
    digest_of = _digester()

    def probe(_rows):
        import importlib
        import importlib.util
        import sys

        failed = []
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as err:  # noqa: BLE001 (reported to the driver)
                failed.append(f"{name} ({type(err).__name__}: {err})")
        spec = importlib.util.find_spec("relsql")
        where = list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None
        found = digest_of(where) if where else None
        for name in own if not failed and (expected is None or found == expected) else ():
            try:
                importlib.import_module(name)
            except Exception as err:  # noqa: BLE001 (reported to the driver)
                failed.append(f"{name} ({type(err).__name__}: {err})")
        yield sys.executable, tuple(failed), found, where

    context = _context(session)
    try:
        if context is not None:
            return Probe(*context.parallelize([0], 1).mapPartitions(probe).collect()[0])
        import json

        import pyarrow as arrow

        def batches(rows):
            for python, failed, found, where in probe(rows):
                yield arrow.RecordBatch.from_pydict({"answer": [json.dumps([python, failed, found, where])]})

        python, failed, found, where = json.loads(session.range(1).mapInArrow(batches, "answer STRING").collect()[0][0])
        return Probe(python, tuple(failed), found, where)
    except Exception as err:  # noqa: BLE001 (the caller names the fix)
        text = " ".join(first_line(err).split())
        return Probe("", (), None, None, failure=text[:300] + ("..." if len(text) > 300 else ""))


def _install_fix(probe: Probe, purpose: str) -> str:
    """Which modules the executors' Python lacks, and the pip command that installs this process's versions."""
    from importlib import metadata

    names = [entry.split(" ")[0] for entry in probe.missing]
    pins = []
    for name in names:
        distribution = _DISTRIBUTION.get(name, name)
        try:
            pins.append(f"'{distribution}=={metadata.version(distribution).split('+')[0]}'")
        except metadata.PackageNotFoundError:
            pins.append(f"'{distribution}'")
    return (f"Spark's executors cannot {purpose}: their Python {probe.python} cannot import {', '.join(names)} "
            f"({'; '.join(probe.missing)}). Install them on every executor: {probe.python} -m pip install "
            f"{' '.join(pins)} (relsql itself is shipped with the job), or set spark.relsql.ranksOn=driver to train "
            "on the driver")


__all__ = ["STORE", "TRAIN", "Probe", "digest", "ensure", "package_zip", "python_fix", "rank_entry", "ship", "shipped"]
