"""Temporary re-export (issue #28): the sqlglot builders moved to relsql/sql.py, a leaf module, so
that relsql.db and relsql.spark do not import the grounding package. relsql/train/* and tests
still import them from here; remove this module once they import relsql.sql."""

from relsql.sql import (
    alias,
    col,
    create_temp,
    dictionary_insert,
    distinct_keys,
    ident,
    integer,
    keyless_table,
    new_dictionary_values,
    numbered_keys,
    real,
    relation_groundings,
    relation_index_query,
    rule_column,
    rule_index_query,
    rule_slice,
    substitute_relations,
)

__all__ = [
    "alias",
    "col",
    "create_temp",
    "dictionary_insert",
    "distinct_keys",
    "ident",
    "integer",
    "keyless_table",
    "new_dictionary_values",
    "numbered_keys",
    "real",
    "relation_groundings",
    "relation_index_query",
    "rule_column",
    "rule_index_query",
    "rule_slice",
    "substitute_relations",
]
