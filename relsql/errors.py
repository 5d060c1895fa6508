"""Errors a user can cause.

Every message names the place (statement, line, table, column) and the fix, so that a user
never has to read a stack trace from DuckDB, sqlglot or torch to learn what went wrong.
"""

from __future__ import annotations


class RelsqlError(Exception):
    """Base class of every error relsql raises for bad input."""


class TemplateError(RelsqlError):
    """A template that cannot be parsed or does not make sense."""


class SchemaError(RelsqlError):
    """A table or column the template or target refers to is missing or unusable."""


class GroundingError(RelsqlError):
    """The database could not enumerate a rule's groundings."""


class ShapeError(RelsqlError):
    """Dimensions of weights and values do not fit together."""


class SourceError(RelsqlError):
    """A data source that cannot be opened or read."""
