"""Find and LOAD DuckDB extensions offline, from the `duckdb-extension-*` wheels.

DuckDB 1.5.x loads an extension from a file: the wheels `duckdb-extension-sqlite-scanner`,
`duckdb-extension-postgres-scanner`, `duckdb-extension-tpch`, ... (pinned to DuckDB's version)
ship it as `<site-packages>/duckdb_extension_<name>/extensions/v<version>/<name>.duckdb_extension`.
No network is used; a missing wheel is a clear SourceError that names the package to install.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import duckdb
import sqlglot.expressions as exp

from relsql.errors import SourceError

__all__ = ["extension_file", "is_loaded", "load", "wheel_name"]


def wheel_name(name: str) -> str:
    return f"duckdb-extension-{name.replace('_', '-')}"


def extension_file(name: str) -> Path | None:
    """The `.duckdb_extension` file of `name` (e.g. "sqlite_scanner") for this DuckDB version."""
    try:
        spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for root in spec.submodule_search_locations or ():
        candidate = Path(root) / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        if candidate.is_file():
            return candidate
    return None


def is_loaded(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    row = con.execute("SELECT bool_or(loaded) FROM duckdb_extensions() WHERE extension_name = ?", [name]).fetchone()
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
        why = f" (needed to {purpose})" if purpose else ""
        found = f"the file {path} did not load: {str(err).splitlines()[0]}" if path else "it is not installed"
        raise SourceError(f"DuckDB extension `{name}`{why} is unavailable: {found}. Install it offline-capable with "
                          f"`pip install {wheel_name(name)}=={duckdb.__version__}` (it must match duckdb {duckdb.__version__})") from None
