"""Template.auto's ranges per number (relsql/template/auto/encoders.py: ple_bins): fine ranges on
small tables, fewer where a table's encoded numbers would take much memory, never fewer than 8."""

from __future__ import annotations

import re

import duckdb
import pytest

import relsql
from relsql.ground.encoders import ple_values
from relsql.template.auto.encoders import PLE_CELLS, ple_bins


@pytest.mark.parametrize("rows", [0, 1, 100, 2_500, 48_000, 300_000, 600_000, 10**6, 10**8])
@pytest.mark.parametrize("numbers", [1, 3, 20])
def test_the_encoding_stays_within_its_memory_unless_at_eight_ranges(rows, numbers):
    bins = ple_bins(rows, numbers)
    assert bins in (8, 16, 32)
    cells = rows * numbers * (bins + 1)  # the encoding's float64 values: a range each and a NULL flag
    assert cells <= PLE_CELLS or bins == 8
    if bins < 32:  # the next finer choice would have passed the bound
        assert rows * numbers * (2 * bins + 1) > PLE_CELLS


def test_the_width_counted_is_the_encoders_width():
    edges = [float(e) for e in range(33)]  # 32 ranges
    assert ple_values([0.5, 70.0], None, edges).shape == (2, 33)  # what the bound above counts per number


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """small(1,000 rows, 2 numbers) and big(600,000 rows, 1 number), each with a label."""
    path = str(tmp_path_factory.mktemp("ple_bins") / "sizes.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TABLE small(id BIGINT PRIMARY KEY, a DOUBLE, b DOUBLE, y DOUBLE)")
    con.execute("INSERT INTO small SELECT range, random(), random() * 7, random() FROM range(1000)")
    con.execute("CREATE TABLE big(id BIGINT PRIMARY KEY, x DOUBLE, y DOUBLE)")
    con.execute("INSERT INTO big SELECT range, random(), random() FROM range(600000)")
    con.close()
    return relsql.connect(path)


@pytest.mark.parametrize("table, expected", [("small", 32), ("big", 16)])
def test_the_template_names_the_ranges_of_each_tables_size(db, table, expected):
    source = relsql.Template.auto(db, target=f"{table}.y").source
    found = re.findall(r"ple\([^()]*, (\d+)\)", source)
    assert found == [str(expected)], found  # 600,000 x 1 x 33 values pass 2^24; x 17 do not
