"""Find and LOAD DuckDB extensions offline, from the `duckdb-extension-*` wheels, only where a source needs one.

relsql's core (DuckDB files, Parquet/CSV folders, frames, in-memory) needs no extension beyond those
built into duckdb's wheel (parquet, json, icu), on duckdb 1.5.5 and 2.x alike. Four sources need one:
PostgreSQL (`postgres_scanner`), SQLite (`sqlite_scanner`), TPC-H and TPC-DS generation (`tpch`,
`tpcds`). Their wheels `duckdb-extension-<name>` ship the file as
`<site-packages>/duckdb_extension_<name>/extensions/v<version>/<name>.duckdb_extension` and must match
duckdb's version exactly; the registry has them for duckdb 1.5.5 only, so they live in the extra
`relsql[sources]`, which pins duckdb to 1.5.5. No network is used: without the file, `LOAD <name>`
still finds an extension the user installed into DuckDB's own folder; otherwise a SourceError says
what is missing and how to get it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import duckdb
import sqlglot.expressions as exp

from relsql.errors import SourceError
from relsql.sql import bound

__all__ = ["SOURCES_EXTRA", "WHEEL_VERSION", "extension_file", "is_loaded", "load", "missing_message", "wheel_name"]

WHEEL_VERSION = "1.5.5"  # the duckdb version the extra `sources` in pyproject.toml pins (tests check they agree)
SOURCES_EXTRA = ("postgres_scanner", "sqlite_scanner", "tpch", "tpcds")  # the wheels that extra installs


def wheel_name(name: str) -> str:
    return f"duckdb-extension-{name.replace('_', '-')}"


def extension_file(name: str, version: str | None = None) -> Path | None:
    """The `.duckdb_extension` file of `name` (e.g. "sqlite_scanner") for `version` (this duckdb's by default)."""
    version = version or duckdb.__version__
    try:
        spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for root in spec.submodule_search_locations or ():
        candidate = Path(root) / "extensions" / f"v{version}" / f"{name}.duckdb_extension"
        if candidate.is_file():
            return candidate
    return None


def is_loaded(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    row = con.execute(bound("SELECT bool_or(loaded) FROM duckdb_extensions() WHERE extension_name = :name", name=name)).fetchone()
    return bool(row and row[0])


def load(con: duckdb.DuckDBPyConnection, name: str, *, purpose: str = "") -> None:
    """LOAD extension `name` into `con` from its wheel (or DuckDB's own extension folder)."""
    if is_loaded(con, name):
        return
    path = extension_file(name)
    target = exp.Literal.string(str(path)) if path else exp.to_identifier(name, quoted=True)
    try:
        con.execute(exp.Command(this="LOAD", expression=target.sql("duckdb")).sql("duckdb"))
    except duckdb.Error as err:
        if path:  # a wheel of the right version whose file DuckDB refuses: say so, with DuckDB's reason
            why = f" (needed to {purpose})" if purpose else ""
            raise SourceError(f"DuckDB extension `{name}`{why} is unavailable: the file {path} did not load: "
                              f"{str(err).splitlines()[0]}. Reinstall it with `pip install --force-reinstall "
                              f"{wheel_name(name)}=={duckdb.__version__}`") from None
        raise SourceError(missing_message(name, purpose, duckdb.__version__)) from None


def missing_message(name: str, purpose: str, version: str) -> str:
    """What to install when extension `name` is in neither a wheel nor DuckDB's folder, under duckdb `version`."""
    needed = f"to {purpose} " if purpose else ""
    head = f"relsql needs DuckDB's `{name}` extension {needed}and it is not installed"
    if name in SOURCES_EXTRA and version == WHEEL_VERSION:
        return f"{head}: install the offline extension wheels with `pip install 'relsql[sources]'`"
    if name in SOURCES_EXTRA:
        return (f"{head}. Its offline wheel ({wheel_name(name)}) exists for duckdb {WHEEL_VERSION} only and this is "
                f"duckdb {version}: `pip install 'relsql[sources]'` installs duckdb {WHEEL_VERSION} with the wheels "
                f"(relsql's core runs on both), or, with network access, run `INSTALL {name}` once in this duckdb")
    return (f"{head}: install it with `pip install {wheel_name(name)}=={version}` if the registry has that version, "
            f"or, with network access, run `INSTALL {name}` once in this duckdb")
