"""The SQL-declared templates that ship with relsql, installed with the package.

``mutagenesis.sql`` (the thesis's relational architecture, the demo's) and the graph models over
node/edge tables: ``gcn``, ``sage``, ``gin``, ``rgcn``, ``gat``, ``rgat``, ``hgt``. They live inside
the package so that an installed relsql (not only a checkout) can read them::

    relsql.Model(db, relsql.sql_templates.path("mutagenesis"), target="molecule.mutagenic")
"""

from __future__ import annotations

from pathlib import Path

from relsql.errors import RelsqlError

__all__ = ["FOLDER", "names", "path"]

FOLDER = Path(__file__).resolve().parent


def names() -> tuple[str, ...]:
    """The shipped templates, by name (the file name without ``.sql``)."""
    return tuple(sorted(p.stem for p in FOLDER.glob("*.sql")))


def path(name: str) -> Path:
    """The file of the shipped template `name` (``"gcn"`` or ``"gcn.sql"``)."""
    stem = name.removesuffix(".sql")
    found = FOLDER / f"{stem}.sql"
    if stem not in names():
        raise RelsqlError(f"relsql.sql_templates.path({name!r}): no such shipped template; "
                          f"choose one of {', '.join(names())}")
    return found
