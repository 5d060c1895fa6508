"""PluRel databases for bench/outside.py: an outside generator of relational databases from
structural causal models (PluRel 1.1.0), in its OWN virtual environment.

    bash scripts/plurel-venv                                   # once: /work/plurel-venv
    /work/plurel-venv/bin/python -m bench.outside_plurel generate --out /tmp/outside/plurel-parquet --seeds 0-119
    python -m bench.outside_plurel load --parquet /tmp/outside/plurel-parquet --out /tmp/outside/plurel

`generate` runs in the PluRel venv (relbench 1.x, pandas 3, duckdb 2.0.1) and writes one folder
per seed: a Parquet file per table plus `meta.json` (each table's primary key, foreign keys, time
column, rows; the chosen targets; the layout). The two environments exchange Parquet only: a
DuckDB 2 file cannot be opened by duckdb 1.5.5.

Per seed: the table layout cycles BarabasiAlbert / ReverseRandomTree / WattsStrogatz; sizes
(`SIZES`, `--sizes`, recorded in meta.json): 3-4 tables, entity tables 500-1,000 rows, activity
tables 1,000-2,500 (PluRel's row-by-row sources take ~10 s per database on a loaded 2-core
machine at these sizes). Seeds 0-19 of the first corpus were made with 3-6 tables, entity
500-1,500 and activity 1,000-5,000 rows (`--sizes '{"tables": [3, 6], "entity_rows": [500, 1500],
"activity_rows": [1000, 5000]}'`). Targets are chosen among
columns WITH CAUSAL PARENTS IN OTHER TABLES: PluRel feeds every non-source node of a table's
SCM with the embeddings of the rows its foreign keys reference, so a column whose SCM node is
not a source node, in a table with a foreign key, depends on other tables. One regression target
(a float column) and one binary target (a boolean column; where there is none, a float column
binarized at its median, in place: the float itself is dropped) per database, when it has them.

`load` (in relsql's .venv) writes each folder as a DuckDB file and a manifest for
bench/outside.py, with keys by seed: `declared` (PRIMARY/FOREIGN KEY in the catalog), `keysfile`
(nothing declared; a keys file given to relsql.connect(keys=)), or `inferred` (nothing declared,
no file: relsql infers what it can from PluRel's names `row_idx`/`foreign_row_0`, likely nothing).
A target in a table with a time column (`date`) gets time_column="date" on even seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LAYOUTS = ["BarabasiAlbert", "ReverseRandomTree", "WattsStrogatz"]
KEY_MODES = ["declared", "keysfile", "inferred"]
_MADE: dict = {}  # table name -> its SCM, while PluRel makes one database


# --------------------------------------------------------------------------- in the PluRel venv
SIZES = {"tables": (3, 4), "entity_rows": (500, 1000), "activity_rows": (1000, 2500), "columns": (3, 12)}


def generate_one(seed: int, out: Path, sizes: dict | None = None) -> dict:
    """One PluRel database as Parquet + meta.json in out/plurel_<seed>."""
    import numpy as np
    import plurel.dataset as plurel_dataset
    from plurel import Choices, Config, DatabaseParams, SyntheticDataset

    made = _MADE
    made.clear()
    if not getattr(plurel_dataset.SCM, "_records", False):
        class Recorded(plurel_dataset.SCM):  # remember each table's SCM: its DAG says which columns have parents
            _records = True

            def generate_df(self, *args, **kwargs):
                _MADE[self.table_name] = self
                return super().generate_df(*args, **kwargs)
        plurel_dataset.SCM = Recorded
    layout = LAYOUTS[seed % len(LAYOUTS)]
    sizes = {**SIZES, **(sizes or {})}
    params = DatabaseParams(table_layout_choices=Choices(kind="set", value=[layout]),
                            num_tables_choices=Choices(kind="range", value=list(sizes["tables"])),
                            num_rows_entity_table_choices=Choices(kind="range", value=list(sizes["entity_rows"])),
                            num_rows_activity_table_choices=Choices(kind="range", value=list(sizes["activity_rows"])),
                            num_cols_choices=Choices(kind="range", value=list(sizes["columns"])))
    dataset = SyntheticDataset(seed=seed, config=Config(database_params=params))
    db = dataset.make_db()
    folder = out / f"plurel_{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tables, candidates = {}, []
    for name, table in db.table_dict.items():
        df = table.df
        fkeys = dict(table.fkey_col_to_pkey_table)
        tables[name] = {"pkey": table.pkey_col, "fkeys": fkeys, "time_col": table.time_col, "rows": len(df)}
        scm = made.get(name)
        if not fkeys or scm is None:
            continue
        graph = scm.dag.graph
        caused = [graph.nodes[n]["col_name"] for n in scm.col_nodes if n not in scm.source_nodes]
        for column in caused:
            if column in df.columns and df[column].nunique(dropna=True) >= 2:
                kind = "binary" if df[column].dtype == bool else "regression" if df[column].dtype.kind == "f" else None
                if kind:
                    candidates.append((name, column, kind))
    targets = []
    regression = [c for c in candidates if c[2] == "regression"]
    binary = [c for c in candidates if c[2] == "binary"]
    if regression:
        t = regression[int(rng.integers(len(regression)))]
        targets.append({"target": f"{t[0]}.{t[1]}", "kind": "regression"})
        regression = [c for c in regression if c != t]
    if binary:
        t = binary[int(rng.integers(len(binary)))]
        targets.append({"target": f"{t[0]}.{t[1]}", "kind": "binary"})
    elif regression:  # binarize another caused float column at its median, in place
        t = regression[int(rng.integers(len(regression)))]
        df = db.table_dict[t[0]].df
        values = df[t[1]]
        df[f"{t[1]}_high"] = (values > values.median()).where(values.notna())
        db.table_dict[t[0]].df = df.drop(columns=[t[1]])
        targets.append({"target": f"{t[0]}.{t[1]}_high", "kind": "binary", "binarized": t[1]})
    for name, table in db.table_dict.items():
        table.df.to_parquet(folder / f"{name}.parquet", index=False)
    meta = {"seed": seed, "layout": layout, "tables": tables, "targets": targets, "generator": "plurel 1.1.0",
            "sizes": {k: list(v) for k, v in sizes.items()}}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return meta


def generate(seeds: list[int], out: Path, sizes: dict | None = None) -> None:
    import os
    import time

    os.environ.setdefault("TQDM_DISABLE", "1")
    for seed in seeds:
        if (out / f"plurel_{seed}" / "meta.json").exists():
            continue
        started = time.perf_counter()
        try:
            meta = generate_one(seed, out, sizes)
        except Exception as err:  # PluRel's own failure: skip the seed, say so
            print(f"plurel_{seed}: PluRel failed: {type(err).__name__}: {err}", file=sys.stderr)
            continue
        print(f"plurel_{seed}: {meta['layout']}, {len(meta['tables'])} tables, "
              f"{sum(t['rows'] for t in meta['tables'].values())} rows, targets {[t['target'] for t in meta['targets']]} "
              f"({time.perf_counter() - started:.1f} s)", file=sys.stderr)


# --------------------------------------------------------------------------- in relsql's venv
def _order(tables: dict) -> list[str]:
    """Parents before children (for declared foreign keys)."""
    done: list[str] = []
    while len(done) < len(tables):
        progressed = False
        for name, t in tables.items():
            if name not in done and all(p in done or p == name for p in t["fkeys"].values()):
                done.append(name)
                progressed = True
        if not progressed:  # a cycle: the rest in any order
            done += [n for n in tables if n not in done]
    return done


def load(folder: Path, out: Path, mode: str | None = None) -> dict:
    """A PluRel Parquet folder as out/<name>.duckdb plus a manifest (bench/outside.py's format)."""
    import duckdb

    meta = json.loads((folder / "meta.json").read_text())
    seed = int(meta["seed"])
    mode = mode or KEY_MODES[seed % len(KEY_MODES)]
    name = folder.name if mode == KEY_MODES[seed % len(KEY_MODES)] else f"{folder.name}_{mode}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.duckdb"
    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    tables = meta["tables"]
    for table in _order(tables):
        t = tables[table]
        parquet = str(folder / f"{table}.parquet").replace("'", "''")
        con.execute(f"CREATE TABLE \"{table}\" AS SELECT * FROM read_parquet('{parquet}') LIMIT 0")
        if mode == "declared":
            cols = con.execute(f'DESCRIBE "{table}"').fetchall()
            con.execute(f'DROP TABLE "{table}"')
            parts = [f'"{c[0]}" {c[1]}' for c in cols]
            if t["pkey"]:
                parts.append(f'PRIMARY KEY ("{t["pkey"]}")')
            for column, parent in t["fkeys"].items():
                if tables[parent]["pkey"] and parent != table:
                    parts.append(f'FOREIGN KEY ("{column}") REFERENCES "{parent}" ("{tables[parent]["pkey"]}")')
            con.execute(f'CREATE TABLE "{table}" ({", ".join(parts)})')
        con.execute(f"INSERT INTO \"{table}\" SELECT * FROM read_parquet('{parquet}')")
    con.close()
    keys = None
    if mode == "keysfile":
        lines = [f"PRIMARY KEY {n}({t['pkey']})" for n, t in tables.items() if t["pkey"]]
        lines += [f"FOREIGN KEY {n}({c}) REFERENCES {p}({tables[p]['pkey']})" for n, t in tables.items()
                  for c, p in t["fkeys"].items() if tables[p]["pkey"]]
        keys = out / f"{name}.keys.sql"
        keys.write_text("\n".join(lines) + "\n")
    targets = []
    for entry in meta["targets"]:
        table = entry["target"].split(".")[0]
        entry = dict(entry)
        if tables[table]["time_col"] and seed % 2 == 0:
            entry["time_column"] = tables[table]["time_col"]
        targets.append(entry)
    manifest = {"name": name, "source": "plurel", "path": str(path), "keys": None if keys is None else str(keys),
                "key_mode": mode, "layout": meta["layout"], "valid": True, "targets": targets,
                "rows": {n: t["rows"] for n, t in tables.items()}, "parquet": str(folder)}
    (out / f"{name}.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def load_all(parquet: Path, out: Path, limit: int | None = None) -> list[dict]:
    folders = sorted((p for p in Path(parquet).glob("plurel_*") if (p / "meta.json").exists()),
                     key=lambda p: int(p.name.split("_")[1]))
    manifests = []
    for folder in folders[:limit]:
        existing = out / f"{folder.name}.json"
        if existing.exists() and Path(json.loads(existing.read_text())["path"]).exists():
            manifest = json.loads(existing.read_text())
        else:
            manifest = load(folder, out)
        if manifest["targets"]:
            manifests.append(manifest)
    return manifests


def main(argv: list[str] | None = None) -> None:
    from bench.outside_hostile import seeds as parse_seeds

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="in the PluRel venv: Parquet folders")
    g.add_argument("--out", default="/tmp/outside/plurel-parquet")
    g.add_argument("--seeds", default="0-119")
    g.add_argument("--sizes", default=None, help='JSON, e.g. \'{"tables": [3, 6], "activity_rows": [1000, 5000]}\' '
                   f"(default {SIZES})")
    g_load = sub.add_parser("load", help="in relsql's venv: DuckDB files and manifests")
    g_load.add_argument("--parquet", default="/tmp/outside/plurel-parquet")
    g_load.add_argument("--out", default="/tmp/outside/corpus/plurel")
    args = parser.parse_args(argv)
    if args.command == "generate":
        generate(parse_seeds(args.seeds), Path(args.out), json.loads(args.sizes) if args.sizes else None)
    else:
        for m in load_all(Path(args.parquet), Path(args.out)):
            print(f"{m['name']}: {m['key_mode']}, {[t['target'] for t in m['targets']]}", file=sys.stderr)


if __name__ == "__main__":
    main()
