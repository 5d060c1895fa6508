"""Template frontends (SQL, NeuraLogic Datalog) and the IR they share."""

from relsql.template.ir import Template

__all__ = ["Template"]
