"""relsql.sql_templates: the shipped templates are reached through the package, not the checkout."""

from __future__ import annotations

import pytest

import relsql
from relsql import sql_templates

# The README's list: "GCN, GraphSAGE, GIN, RGCN, GAT, RGAT, HGT and Mutagenesis templates".
README_LIST = {"gcn", "sage", "gin", "rgcn", "gat", "rgat", "hgt", "mutagenesis"}


def test_the_shipped_templates_are_the_readmes_and_live_in_the_package():
    assert set(sql_templates.names()) == README_LIST
    for name in README_LIST:
        path = sql_templates.path(name)
        assert path == sql_templates.path(f"{name}.sql")
        assert path.is_file() and path.parent.parent.name == "relsql"
        assert relsql.Template.from_file(path).relations  # parses as a template


@pytest.mark.parametrize("name", ["nope", "../pyproject", "", "mutagenesis.SQL"])
def test_an_unknown_template_is_an_error_that_lists_the_shipped_ones(name):
    with pytest.raises(relsql.RelsqlError, match="no such shipped template.*gcn"):
        sql_templates.path(name)
