"""Temporary re-export (issue #28): key inference moved to relsql/keys.py, beside the catalog.
relsql/cli and tests still import it from here; remove this module once they import relsql.keys."""

from relsql.keys import Schema, schema

__all__ = ["Schema", "schema"]
