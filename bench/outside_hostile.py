"""Hostile but valid relational databases, seeded (issue: "an outside corpus, in the loop").

    python -m bench.outside_hostile --out /tmp/outside/hostile --seeds 0-79

Each seed writes one DuckDB file `hostile_<seed>.duckdb` and a manifest `hostile_<seed>.json`
(bench/outside.py's format: source, path, keys file, targets with their time column, what the
database holds). Every database is VALID: its labels are not all NULL, every declared key holds,
the target is learnable from other columns. What makes it hostile, each switched on by the seed
(`FEATURES`; `features_of(seed)` cycles them so that every feature appears in many seeds):

- `few`: columns with 1, 2 or 3 distinct values; `const`: a constant column; `null`: an all-NULL
  column (typed DOUBLE and VARCHAR);
- `huge`: values of ±1e308 among ordinary ones; `subnormal`: 5e-324 and other subnormals; `ties`:
  a column where most rows tie;
- `word`: one-word text (a handful of single words); `list`: INTEGER[] and VARCHAR[] columns;
- `composite`: the target table keyed by two columns (children reference both);
- `selfref`: a self-referencing foreign key (item.parent_item_id -> item.item_id), NULL at roots;
- `bridge`: a many-to-many bridge item_tag(item_id, tag_id) to a tag table;
- `hub`: one item with 10,000 child events;
- `empty`: an empty child table (declared keys, zero rows);
- `rare`: a multiclass target with a class of exactly 2 rows (in addition to the other targets);
- `parent_time`: the parent (grp) table has its own time column;
- `year`: integer (year) time columns instead of DATE, on the target table and the events;
- `mixed_year`: the target table's time and the events' (and the parent's) of different kinds,
  one an integer year, the other a DATE;
- `keyless`: an event log `visit` with no key of its own (a foreign key to item, exact duplicate
  rows, NULLs, one-word pages, its own time where the items have one);
- `orphan`: event rows whose item_id is in no item row (that foreign key is then not declared in
  DuckDB; it is given in a keys file, or left to inference);
- keys: `declared` (PRIMARY/FOREIGN KEY in the catalog), `keysfile` (nothing declared; a keys file
  passed with connect(keys=)), `inferred` (nothing declared, no file).

Schema features (`SCHEMA_FEATURES`, added 2026-12-02, chosen by their own seeded draw so that the
features above stay as they were for every seed; databases of earlier dates lacked them):

- `types`: a one-to-one extension table item_extra with DECIMAL, UBIGINT, HUGEINT, STRUCT, MAP,
  UNION, fixed-size ARRAY, UUID, ENUM, BLOB, TIME and TIMESTAMPTZ columns (type names that hold
  "INT" without being numbers among them);
- `nonfinite`: NaN and ±infinity in DOUBLE columns of the parent, the target and the events, and
  NaN on some item.score labels (rows a model predicts but cannot learn from);
- `names`: a parent table named like a file ("lookup.v") keyed by a column named h (every template
  relation's value column), with columns named e, age and we"ird; item columns named h and r_time.

Targets (the label depends on a parent column, a child aggregate and an own column): item.label
(binary), item.score (regression), with `rare` item.klass (multiclass); half of the seeds with a
time column on item (`created`, a DATE or an integer year), the events cut before it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

FEATURES = ["few", "const", "null", "huge", "subnormal", "ties", "word", "list", "composite", "selfref", "bridge", "hub",
            "empty", "rare", "parent_time", "year", "orphan", "timed", "mixed_year", "keyless"]
SCHEMA_FEATURES = ["types", "nonfinite", "names"]
KEY_MODES = ["declared", "keysfile", "inferred"]
WORDS = ["alpha", "beta", "gamma", "delta", "omega"]


def features_of(seed: int) -> set[str]:
    """The hostile features of a seed: each one on with probability 1/2, plus two chosen by cycling
    so that consecutive seeds cover all of them."""
    rng = np.random.default_rng(10_000 + seed)
    on = {f for f in FEATURES if rng.random() < 0.5}
    on |= {FEATURES[seed % len(FEATURES)], FEATURES[(seed * 7 + 3) % len(FEATURES)]}
    schema = np.random.default_rng(20_000 + seed)  # its own draw: the features above are as they were
    on |= {g for g in SCHEMA_FEATURES if schema.random() < 0.5} | {SCHEMA_FEATURES[seed % len(SCHEMA_FEATURES)]}
    if "selfref" in on and "composite" in on:  # a self reference to a composite key: keep it, both columns
        pass
    return on


def key_mode(seed: int) -> str:
    return KEY_MODES[seed % len(KEY_MODES)]


def _q(name: str) -> str:
    """A quoted DuckDB identifier (a name with a dot or a quote in it stays one name)."""
    return '"' + name.replace('"', '""') + '"'


def _nonfinite(rng, values: np.ndarray) -> np.ndarray:
    """`values` with ~5 % NaN and ~3 % each of +inf and -inf."""
    out = np.asarray(values, dtype=np.float64).copy()
    draw = rng.random(len(out))
    out[draw < 0.05] = np.nan
    out[(draw >= 0.05) & (draw < 0.08)] = np.inf
    out[(draw >= 0.08) & (draw < 0.11)] = -np.inf
    return out


def _dates(rng, n: int, start: str = "2015-01-01", days: int = 3000) -> np.ndarray:
    return np.datetime64(start) + rng.integers(0, days, n).astype("timedelta64[D]")


def _year(v: np.ndarray) -> np.ndarray:
    return v if v.dtype.kind in "iu" else v.astype("datetime64[Y]").astype(int) + 1970


# C901: one branch per hostile feature the seed turns on (a dispatch; split, one table of cases would scatter)
def generate(seed: int, out: Path, *, small: bool = False) -> dict:  # noqa: C901
    """Write hostile_<seed>.duckdb (+ keys file) into `out`; return its manifest."""
    rng = np.random.default_rng(seed)
    f = features_of(seed)
    mode = key_mode(seed)
    name = f"hostile_{seed}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.duckdb"
    path.unlink(missing_ok=True)
    n_grp = int(rng.integers(3, 12))
    n_item = int(rng.integers(150, 400 if small else 900))
    n_event = int(rng.integers(2 * n_item, 5 * n_item))
    timed = "timed" in f or "year" in f or "mixed_year" in f
    year = "year" in f
    other_year = year != ("mixed_year" in f)  # the events' and the parent's time: the other kind with mixed_year

    # -- grp: the parent table ---------------------------------------------------------------------
    grp = {"grp_id": np.arange(1, n_grp + 1), "grp_rate": rng.normal(0, 1, n_grp).round(3),
           "grp_kind": np.array([WORDS[i % 2] for i in range(n_grp)])}
    if "nonfinite" in f:
        grp["grp_score"] = _nonfinite(rng, rng.normal(0, 1, n_grp).round(3))
    if "parent_time" in f:
        grp["opened"] = (rng.integers(2000, 2015, n_grp) if other_year else _dates(rng, n_grp, "2000-01-01", 5000))

    # -- item: the target table ----------------------------------------------------------------------
    item: dict[str, object] = {}
    if "composite" in f:
        item["shop_id"] = (np.arange(n_item) // 50 + 1).astype(np.int64)
        item["item_no"] = (np.arange(n_item) % 50 + 1).astype(np.int64)
        item_keys = ["shop_id", "item_no"]
    else:
        item["item_id"] = np.arange(1, n_item + 1).astype(np.int64)
        item_keys = ["item_id"]
    gid = rng.integers(1, n_grp + 1, n_item)
    item["grp_id"] = gid
    x = rng.normal(0, 1, n_item)
    item["x"] = x.round(4)
    lookup = None
    if "names" in f:  # a parent named like a file, keyed by h; columns named like the template's own
        n_lookup = 7
        lookup = {"h": np.array([f"clé-{i}" for i in range(n_lookup)]), "e": rng.normal(0, 1, n_lookup).round(3),
                  "age": rng.integers(0, 90, n_lookup), 'we"ird': rng.normal(0, 1, n_lookup).round(3)}
        item["lookup_h"] = lookup["h"][rng.integers(0, n_lookup, n_item)]
        item["h"] = rng.normal(0, 1, n_item).round(3)
        item["r_time"] = rng.normal(0, 1, n_item).round(3)
    if "nonfinite" in f:
        item["ratio"] = _nonfinite(rng, rng.normal(0, 1, n_item).round(3))
    if "few" in f:
        item["few1"] = np.full(n_item, 3)
        item["few2"] = rng.integers(0, 2, n_item)
        item["few3"] = rng.choice([-1.5, 0.0, 2.25], n_item)
    if "const" in f:
        item["const_num"] = np.full(n_item, 42.0)
        item["const_txt"] = np.array(["same"] * n_item)
    if "null" in f:
        item["null_num"] = pa.nulls(n_item, pa.float64())
        item["null_txt"] = pa.nulls(n_item, pa.string())
    if "huge" in f:
        huge = rng.normal(0, 1, n_item)
        huge[rng.random(n_item) < 0.05] = 1e308
        huge[rng.random(n_item) < 0.05] = -1e308
        item["huge"] = huge
    if "subnormal" in f:
        item["tiny"] = rng.choice([5e-324, 1e-310, 2.5e-320, 0.0], n_item)
    if "ties" in f:
        ties = np.where(rng.random(n_item) < 0.9, 1.0, rng.normal(0, 1, n_item))
        item["ties"] = ties
    if "word" in f:
        item["word"] = rng.choice(WORDS[:3], n_item)
    if "list" in f:
        item["codes"] = pa.array([list(rng.integers(0, 6, int(rng.integers(0, 4)))) for _ in range(n_item)], pa.list_(pa.int64()))
        item["labels"] = pa.array([[str(w) for w in rng.choice(WORDS, int(rng.integers(0, 3)))] if rng.random() > 0.1 else None
                                   for _ in range(n_item)], pa.list_(pa.string()))
    if timed:
        item["created"] = rng.integers(2016, 2024, n_item) if year else _dates(rng, n_item, "2016-01-01", 2500)
    if "selfref" in f:
        if "composite" in f:
            has = rng.random(n_item) < 0.6
            ref = rng.integers(0, n_item, n_item)
            item["parent_shop_id"] = pa.array(np.where(has, item["shop_id"][ref], 0), mask=~has)
            item["parent_item_no"] = pa.array(np.where(has, item["item_no"][ref], 0), mask=~has)
        else:
            has = (rng.random(n_item) < 0.6) & (np.arange(n_item) > 0)
            ref = np.array([int(rng.integers(1, i + 1)) if i > 0 else 1 for i in range(n_item)])  # an earlier item
            item["parent_item_id"] = pa.array(ref, mask=~has)

    # -- event: child rows (hub, orphans, time) -----------------------------------------------------
    owner = rng.integers(0, n_item, n_event)
    if "hub" in f:
        owner = np.concatenate([owner, np.zeros(10_000, dtype=np.int64)])  # item 0 gets 10^4 children
    n_ev = len(owner)
    amount = rng.gamma(2.0, 10.0, n_ev).round(2)
    event: dict[str, object] = {"event_id": np.arange(1, n_ev + 1)}
    for k in item_keys:
        event[k] = np.asarray(item[k])[owner]
    orphans = np.zeros(n_ev, bool)
    if "orphan" in f:
        orphans = rng.random(n_ev) < 0.03
        event[item_keys[0]] = np.where(orphans, 10_000_000 + np.arange(n_ev), event[item_keys[0]])
    event["amount"] = amount
    event["kind"] = rng.choice(WORDS[:2], n_ev) if "word" in f else rng.choice(["buy", "view", "return"], n_ev)
    if "few" in f:
        event["flag"] = rng.integers(0, 2, n_ev).astype(bool)
    if "huge" in f:
        big = amount.copy()
        big[rng.random(n_ev) < 0.02] = 1e308
        big[rng.random(n_ev) < 0.02] = -1e308
        event["big"] = big
    if "subnormal" in f:
        event["tiny"] = rng.choice([5e-324, 4e-320, 0.0], n_ev)
    if "null" in f:
        event["null_num"] = pa.nulls(n_ev, pa.int64())
    if "nonfinite" in f:
        event["rate"] = _nonfinite(rng, rng.normal(0, 1, n_ev).round(3))
    if timed or "hub" in f:
        created = np.asarray(item["created"]) if timed else None
        if other_year:
            ts = rng.integers(2014, 2025, n_ev)
        else:
            ts = _dates(rng, n_ev, "2014-01-01", 3600)
        event["ts"] = ts
        if created is not None:  # events before the item's time: those a prediction may see (by year if mixed)
            if year == other_year:
                before = ts < created[owner]
            else:
                before = _year(ts) < _year(created[owner])
        else:
            before = np.ones(n_ev, bool)
    else:
        before = np.ones(n_ev, bool)

    # -- labels: parent rate + children's amount (before the time) + own x -----------------------------
    counted = before & ~orphans
    total = np.bincount(owner[counted], weights=amount[counted], minlength=n_item)
    count = np.bincount(owner[counted], minlength=n_item)
    mean_amount = np.where(count > 0, total / np.maximum(count, 1), 0.0)
    signal = 1.2 * grp["grp_rate"][gid - 1] + 0.06 * (mean_amount - 20) + 0.8 * x
    if "few" in f:
        signal = signal + 0.7 * item["few2"]
    noise = rng.normal(0, 0.5, n_item)
    item["label"] = (signal + noise > np.median(signal)).astype(bool)
    item["score"] = (3.0 * signal + noise).round(4)
    if "nonfinite" in f:  # NaN labels: predicted, never learnt from
        item["score"][rng.random(n_item) < 0.05] = np.nan
    targets = [{"target": "item.label", "kind": "binary"}, {"target": "item.score", "kind": "regression"}]
    if "rare" in f:
        klass = np.where(signal + noise > np.quantile(signal, 0.6), "high", "low").astype(object)
        two = rng.choice(n_item, 2, replace=False)
        klass[two] = "rare"  # a class with exactly 2 rows
        item["klass"] = klass.astype(str)
        targets.append({"target": "item.klass", "kind": "multiclass"})
    if timed:
        for t in targets:
            t["time_column"] = "created"

    # -- bridge, empty table ------------------------------------------------------------------------------
    tables = {"grp": grp, "item": item, "event": event}
    if lookup is not None:
        tables["lookup.v"] = lookup
    if "bridge" in f:
        n_tag = 12
        tables["tag"] = {"tag_id": np.arange(1, n_tag + 1), "tag_weight": rng.normal(0, 1, n_tag).round(3),
                         "tag_name": np.array([f"t{i}" for i in range(n_tag)])}
        pairs = {(int(i), int(t)) for i, t in zip(rng.integers(0, n_item, 3 * n_item), rng.integers(1, n_tag + 1, 3 * n_item))}
        pairs = sorted(pairs)
        bridge = {k: np.asarray(item[k])[[p[0] for p in pairs]] for k in item_keys}
        bridge["tag_id"] = np.array([p[1] for p in pairs])
        tables["item_tag"] = bridge
    if "empty" in f:
        empty = {k: np.zeros(0, np.int64) for k in item_keys}
        tables["note"] = {"note_id": np.zeros(0, np.int64), **empty, "text": np.zeros(0, str), "stars": np.zeros(0, float)}

    if "keyless" in f:  # an event log: no key of its own, exact duplicate rows
        n_visit = int(rng.integers(n_item, 3 * n_item))
        who = rng.integers(0, n_item, n_visit)
        twice = np.concatenate([np.arange(n_visit), np.flatnonzero(rng.random(n_visit) < 0.2)])
        visit: dict[str, object] = {k: np.asarray(item[k])[who][twice] for k in item_keys}
        visit["page"] = rng.choice(WORDS[:3], n_visit)[twice]
        visit["dwell"] = pa.array(rng.gamma(2.0, 30.0, n_visit).round(1)[twice], mask=(rng.random(n_visit) < 0.1)[twice])
        if timed:
            visit["seen"] = (rng.integers(2014, 2025, n_visit) if other_year else _dates(rng, n_visit, "2014-01-01", 3600))[twice]
        tables["visit"] = visit

    # -- keys -------------------------------------------------------------------------------------------
    pks = {"grp": ["grp_id"], "item": item_keys, "event": ["event_id"]}
    fks = [("item", ["grp_id"], "grp", ["grp_id"], True), ("event", list(item_keys), "item", item_keys, "orphan" not in f)]
    if "selfref" in f:
        cols = ["parent_shop_id", "parent_item_no"] if "composite" in f else ["parent_item_id"]
        fks.append(("item", cols, "item", item_keys, True))
    if "bridge" in f:
        pks["tag"] = ["tag_id"]
        pks["item_tag"] = [*item_keys, "tag_id"]
        fks += [("item_tag", list(item_keys), "item", item_keys, True), ("item_tag", ["tag_id"], "tag", ["tag_id"], True)]
    if "empty" in f:
        pks["note"] = ["note_id"]
        fks.append(("note", list(item_keys), "item", item_keys, True))
    if "keyless" in f:
        fks.append(("visit", list(item_keys), "item", item_keys, True))
    if lookup is not None:
        pks["lookup.v"] = ["h"]
        fks.append(("item", ["lookup_h"], "lookup.v", ["h"], True))
    if "types" in f:
        pks["item_extra"] = list(item_keys)
        fks.append(("item_extra", list(item_keys), "item", item_keys, True))

    con = duckdb.connect(str(path))
    declared = mode == "declared"
    for table in ["grp", "lookup.v", "item", "tag", "event", "item_tag", "note", "visit"]:
        if table not in tables:
            continue
        frame = pa.table({k: (v if isinstance(v, pa.Array) else pa.array(v)) for k, v in tables[table].items()})
        con.register("frame", frame)
        con.execute(f'CREATE TABLE {_q(table)} AS SELECT * FROM frame LIMIT 0')
        con.unregister("frame")
        if declared:
            _declare(con, table, pks, fks)
        con.register("frame", frame)
        con.execute(f'INSERT INTO {_q(table)} SELECT * FROM frame')
        con.unregister("frame")
    if "types" in f:
        _typed_extension(con, item_keys, declared, pks, fks)
    con.close()

    keys_file = None
    lines = []
    if mode == "keysfile":
        lines += [f"PRIMARY KEY {_q(t)}({', '.join(k)})" for t, k in pks.items()]
        lines += [f"FOREIGN KEY {_q(c)}({', '.join(cs)}) REFERENCES {_q(p)}({', '.join(rs)})" for c, cs, p, rs, _ in fks]
    elif mode == "declared":  # what DuckDB could not declare: self references and orphaned keys
        lines += [f"FOREIGN KEY {c}({', '.join(cs)}) REFERENCES {p}({', '.join(rs)})" for c, cs, p, rs, valid in fks
                  if not valid or c == p]
    if lines:
        keys_file = out / f"{name}.keys.sql"
        keys_file.write_text("\n".join(lines) + "\n")
    manifest = {"name": name, "source": "hostile", "path": str(path), "keys": None if keys_file is None else str(keys_file),
                "key_mode": mode, "features": sorted(f), "valid": True, "targets": targets,
                "rows": {t: int(len(next(iter(v.values())))) for t, v in tables.items()}}
    (out / f"{name}.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _declare(con, table: str, pks: dict, fks: list) -> None:
    """Recreate the empty `table` with its keys as constraints (DuckDB cannot add them afterwards)."""
    cols = con.execute(f"DESCRIBE {_q(table)}").fetchall()
    con.execute(f"DROP TABLE {_q(table)}")
    parts = [f"{_q(c[0])} {c[1]}" for c in cols]
    if table in pks:
        parts.append("PRIMARY KEY (" + ", ".join(_q(k) for k in pks[table]) + ")")
    for child, cols_, parent, refs, valid in fks:
        if child == table and valid and parent != table:  # self references: DuckDB refuses them; see keys file
            parts.append(f"FOREIGN KEY ({', '.join(map(_q, cols_))}) REFERENCES {_q(parent)} ({', '.join(map(_q, refs))})")
    con.execute(f"CREATE TABLE {_q(table)} ({', '.join(parts)})")


def _typed_extension(con, item_keys: list[str], declared: bool, pks: dict, fks: list) -> None:
    """item_extra: one row per item, of the column types whose names fool a substring test."""
    keys = ", ".join(f"i.{_q(k)}" for k in item_keys)
    n = f"i.{_q(item_keys[-1])}"
    con.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    select = (f"SELECT {keys}, CAST(i.x * 100 AS DECIMAL(18,4)) AS amount, CAST(abs({n}) % 7 AS UBIGINT) AS qty, "
              f"CAST({n} AS HUGEINT) * 1000000000000 AS big, {{'a': CAST({n} % 5 AS INTEGER), 'b': 'w'}} AS s, "
              f"MAP {{'k': CAST({n} % 3 AS INTEGER)}} AS m, union_value(n := CAST({n} % 4 AS INTEGER)) AS u, "
              f"[CAST({n} % 2 AS INTEGER), 1, 2]::INTEGER[3] AS fixed, "
              f"CAST('00000000-0000-0000-0000-' || lpad(CAST({n} % 1000 AS VARCHAR), 12, '0') AS UUID) AS uid, "
              f"CAST(['sad', 'ok', 'happy'][1 + CAST({n} % 3 AS INTEGER)] AS mood) AS feeling, "
              f"encode(CAST({n} AS VARCHAR)) AS raw, TIME '08:00:00' + to_minutes(CAST({n} % 600 AS BIGINT)) AS clock, "
              f"TIMESTAMPTZ '2020-01-01 00:00:00+00' + to_days(CAST({n} % 900 AS INTEGER)) AS stamped "
              "FROM item i")
    con.execute(f"CREATE TABLE item_extra AS {select} LIMIT 0")
    if declared:
        _declare(con, "item_extra", pks, fks)
    con.execute(f"INSERT INTO item_extra {select}")


def invalid(out: Path) -> dict:
    """A deliberately INVALID database: the target column holds no label at all (every value
    NULL). relsql must refuse it with a RelsqlError; the runner must not report it as ok."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "invalid_nolabels.duckdb"
    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE grp (grp_id INTEGER PRIMARY KEY, rate DOUBLE)")
    con.execute("INSERT INTO grp SELECT i, i / 10 FROM range(1, 6) t(i)")
    con.execute("CREATE TABLE item (item_id INTEGER PRIMARY KEY, grp_id INTEGER REFERENCES grp (grp_id), "
                "x DOUBLE, label BOOLEAN)")
    con.execute("INSERT INTO item SELECT i, 1 + i % 5, i / 7, NULL FROM range(1, 201) t(i)")
    con.close()
    manifest = {"name": "invalid_nolabels", "source": "hostile", "path": str(path), "keys": None, "valid": False,
                "why_invalid": "every label is NULL", "targets": [{"target": "item.label", "kind": "binary"}]}
    (out / "invalid_nolabels.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/outside/hostile")
    parser.add_argument("--seeds", default="0-79")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--invalid", action="store_true", help="also write the invalid database")
    args = parser.parse_args(argv)
    out = Path(args.out)
    for s in seeds(args.seeds):
        m = generate(s, out, small=args.small)
        print(f"{m['name']}: {m['key_mode']}, {','.join(m['features'])}", file=sys.stderr)
    if args.invalid:
        invalid(out)


if __name__ == "__main__":
    main()
