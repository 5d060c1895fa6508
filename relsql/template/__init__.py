"""Templates: the package face. `Template.from_sql`, `from_datalog`, `from_file` and `auto` run
the frontends (sqlrule, datalog, auto), which build the IR (relsql/template/ir.py, plain
dataclasses that know no frontend). Layers: ir < recursion < sqlrule, datalog < keys < auto < here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from relsql.template import ir
from relsql.template.datalog import parse_datalog_template
from relsql.template.sqlrule import parse_sql_template


class Template(ir.Template):
    """A template: relations computed by rules over the database's tables (the IR's
    `ir.Template`), made from SQL, NeuraLogic Datalog, a file, or the schema."""

    @classmethod
    def _of(cls, template: ir.Template) -> Template:
        """The frontend's IR as this class (same fields, shared, not copied)."""
        return cls(**{f.name: getattr(template, f.name) for f in dataclasses.fields(ir.Template)})

    @classmethod
    def from_sql(cls, text: str, *, depth: int | None = None) -> Template:
        """A template of `CREATE TABLE name AS SELECT ...` statements (DuckDB dialect). A
        relation that reads itself (or a cycle of them) is unrolled to `depth` levels, or to a
        `-- relsql: depth N` line's (relsql/template/recursion.py)."""
        return cls._of(parse_sql_template(text, depth=depth))

    @classmethod
    def from_datalog(cls, text: str, base_dir: str | None = None, *, depth: int | None = None) -> Template:
        """A NeuraLogic text template; `import ./file` is resolved against `base_dir`; recursive
        rules are unrolled to `depth` (or a `% relsql: depth N` line's)."""
        return cls._of(parse_datalog_template(text, base_dir=base_dir, depth=depth))

    @classmethod
    def auto(cls, db, target: str, **options) -> Template:
        """A template generated from the schema's keys; `.source` is its editable SQL text.

        Options: hops (2), width (16), aggregation ("all": mean, sum, max and count of child
        rows; or "avg" | "sum" | "max" | a comma list), time_column, time_columns ({table:
        column}), timeless ("exclude" | "include" child tables whose time is unknown), keys (a
        keys file, its text or tuples, see relsql/data/keyfile.py), infer_keys (True), layer ("sage",
        today's terms; "rgcn", a mean per key and direction; "gat", attention over child rows;
        "hgt", typed attention). For a ranking target (a foreign key or a list of keys, see
        relsql/data/references.py): dimension (32), the towers' width, and history (True), the
        average candidate vector of the entity's earlier interactions (docs/recommendation.md).
        members (1): independent networks side by side whose outputs are averaged (1 for gat, hgt
        and ranking targets). See relsql/template/auto/ (its __init__ maps the modules).
        """
        from relsql.template.auto import generate  # the database layer, loaded only here (Spark's workers read IR)

        return cls.from_sql(generate(db, target, **options))

    @classmethod
    def from_file(cls, path, *, depth: int | None = None) -> Template:
        """`.sql` files are SQL templates; anything else is read as NeuraLogic Datalog."""
        path = Path(path)
        text = ir.read_text(path, "template file")
        if path.suffix.lower() == ".sql":
            return cls.from_sql(text, depth=depth)
        return cls.from_datalog(text, base_dir=str(path.parent), depth=depth)


__all__ = ["Template"]
