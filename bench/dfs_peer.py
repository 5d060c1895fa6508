"""An accuracy anchor from outside relsql: featuretools' Deep Feature Synthesis (depth 2) + LightGBM,
on a relsql model's own split (issue #44 item 1; used by bench/outside.py and bench/quality.py).

    peer(learner) -> {"dfs_s", "dfs_features", "dfs_score", "dfs_scores", "dfs_capped", ...}

Built generically from the target's database through relsql's data layer: its tables (Engine verbs:
`catalog`, `arrow`), their declared or inferred keys (relsql.data.keys.schema) as featuretools
relationships (a composite key becomes one text column of its parts), each table's feature columns
as the one-hop GBM picks them (relsql/train/gbm/flat.py: numbers, dates, text with few values; no
keys, identifiers, the label or copies of it). Then `featuretools.dfs(max_depth=2)` with its default
primitives, LightGBM on the training rows stopped early on the validation rows
(relsql.train.gbm.baselines.fit_trees, as the one-hop GBM), scored on the test rows like the model.

With a time column the future stays out, as relsql's time cut (relsql/template/auto/times.py):
every table's time (its own column, a year, or a date dimension's date) becomes a featuretools time
index on one scale (microseconds; a year y counts from the first day of y+1, "known once over"),
each event nudged up to the next float so that featuretools' `time <= cutoff` means relsql's
strict `time < target time`. Tables whose time is unknown are left out when they reference another
table (events that may lie after the target row's time), kept when they are pure dimensions. The
target rows form their own dataframe without a time index (their own columns are known at their
time) and the target table stays as a timed dataframe of sibling events (a plane's earlier
flights), so that a row's later siblings never count. Aggregations over the target dataframe
itself are dropped (they would see every target row). Bounds: at most MAX_FEATURES features, and
at most CUTOFFS distinct cutoff times (featuretools recomputes per distinct time): past that, each
row's cutoff is rounded DOWN to one of CUTOFFS quantiles of the cutoffs -- less history, never
more; `dfs_capped` says which bound applied.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pandas as pd
import sqlglot.expressions as exp

from relsql import sql as q

MAX_FEATURES = 300
CUTOFFS = 128
TARGET = "__target__"  # the target rows' dataframe (time column case)
KEY, TIME = "__k", "__t"  # synthetic index and time index columns
_SEP = exp.Literal.string("\x1f")


def _us(ref: exp.Expression, kind: str, event: bool) -> exp.Expression:
    """A time as DOUBLE microseconds since 1970 (a year: its first day; an event's year: the next one's)."""
    if kind == "number":
        return exp.cast(ref, "DOUBLE")
    if kind == "year":
        year = exp.cast(ref, "INTEGER")
        ref = exp.Anonymous(this="make_date", expressions=[exp.Add(this=year, expression=q.integer(1)) if event else year,
                                                           q.integer(1), q.integer(1)])
    return exp.cast(exp.Anonymous(this="epoch_us", expressions=[exp.cast(ref, "TIMESTAMP")]), "DOUBLE")


def _key(columns: list[str], table: str) -> exp.Expression:
    """Key columns as one text value (parts joined by U+001F)."""
    parts = [exp.cast(q.col(c, table), "VARCHAR") for c in columns]
    return parts[0] if len(parts) == 1 else exp.Anonymous(this="concat_ws", expressions=[_SEP.copy(), *parts])


def _read(db, name: str, key: list[str] | None, fks: list, features: list, tm=None) -> pd.DataFrame:
    """A table's key, foreign keys, features and time (`tm`: relsql's Time) as a frame."""
    t = "t"
    select = exp.select(*[q.alias(q.col(f.name, t), f.name) for f in features]) if features else exp.select()
    if key:
        select = select.select(q.alias(_key(key, t), KEY), copy=False)
    for i, fk in enumerate(fks):
        select = select.select(q.alias(_key(list(fk.columns), t), f"__f{i}"), copy=False)
    select = select.from_(exp.alias_(exp.Table(this=q.ident(name)), q.ident(t), table=True))
    if tm is not None:
        ref = q.col(tm.column, t)
        if tm.via is not None:
            via = tm.via
            on = exp.and_(*[exp.EQ(this=q.col(a, t), expression=q.col(b, "d")) for a, b in zip(via.columns, via.references)])
            dimension = exp.alias_(exp.Table(this=q.ident(via.table)), q.ident("d"), table=True)
            select = select.join(dimension, on=on, join_type="left")
            ref = q.col(tm.column, "d")
        select = select.select(q.alias(_us(ref, tm.kind, event=True), TIME), copy=False)
    frame = db.arrow(select).to_pandas()
    if tm is not None:
        frame = frame[frame[TIME].notna()].copy()  # no time: never earlier than anything (SQL's NULL comparison)
        stamps = frame[TIME].to_numpy(np.float64)
        frame[TIME] = stamps if tm.kind == "year" else np.nextafter(stamps, np.inf)
    return frame


def _types(features: list, frame: pd.DataFrame) -> dict[str, str]:
    """Woodwork logical types, stated: keys stay text (inferred, "1" would become the integer 1)."""
    keys = {c: "Unknown" for c in frame.columns if c == KEY or c.startswith("__f")}
    return keys | {f.name: {"number": "Double", "time": "Datetime", "code": "Categorical"}[f.kind] for f in features}


def entityset(learner):
    """(EntitySet, target dataframe name, target frame with KEY and cutoff TIME (None without a time
    column), the target table's primary key): the learner's database as featuretools sees it."""
    import featuretools as ft

    from relsql.data.keys import schema
    from relsql.predictive.terms import is_task_table
    from relsql.template.auto import table_times
    from relsql.train.gbm import flat
    from relsql.train.task.leakage import copies_of

    db, table, column, tcol = learner.db, learner.table, learner.column, learner.time_column
    catalog = db.catalog()
    found = schema(db, catalog)
    keyed = flat.key_columns(found)
    tables = {n for n, info in found.tables.items() if n == table or not is_task_table(info.columns)}
    times = table_times(db, catalog, found, table, tcol, {}) if tcol else {}
    fks_of = {n: [fk for c, fk in found.foreign_keys if c == n and fk.table != n] for n in tables}
    if tcol:  # tables without a time that reference another table may hold future events
        tables = {n for n in tables if n in times or not fks_of[n]}
    primary = {n: list(found.primary_keys.get(n) or ()) for n in tables}
    for n in tables:  # a reference counts only to a kept table's whole primary key
        fks_of[n] = [fk for fk in fks_of[n] if fk.table in tables and list(fk.references) == primary[fk.table]]
    skip = {column.casefold(), *copies_of(db, table, column)}
    es = ft.EntitySet("relsql")
    frames = {}
    for n in sorted(tables):
        features = flat._features(db, found.tables[n], keyed.get(n, set()) | (skip if n == table else set()),
                                  found.values.get(n, set()))
        frame = _read(db, n, primary[n] or None, fks_of[n], features, times.get(n) if tcol else None)
        if not len(frame.columns):
            continue
        frames[n] = frame
        types = _types(features, frame) | ({TIME: "Double"} if TIME in frame else {})
        es.add_dataframe(dataframe_name=n, dataframe=frame, index=KEY if primary[n] else "__row",
                         make_index=not primary[n], time_index=TIME if TIME in frame else None, logical_types=types)
    target_name, target_frame = table, None
    if tcol:  # the target rows apart: no time index, their children and parents linked to them
        features = flat._features(db, found.tables[table], keyed.get(table, set()) | skip, found.values.get(table, set()))
        target_frame = _read(db, table, primary[table], fks_of[table], features)
        cut = _us(q.col(tcol, "t"), times[table].kind, event=False)
        stamps = db.arrow(exp.select(q.alias(_key(primary[table], "t"), KEY), q.alias(cut, TIME))
                          .from_(exp.alias_(exp.Table(this=q.ident(table)), q.ident("t"), table=True))).to_pandas()
        target_frame = target_frame.merge(stamps, on=KEY, how="left", suffixes=("", "_cut"))
        cutoffs = target_frame.pop(TIME)
        types = _types(features, target_frame)
        es.add_dataframe(dataframe_name=TARGET, dataframe=target_frame.copy(), index=KEY, logical_types=types)
        target_frame[TIME] = cutoffs
        target_name = TARGET
    for n in frames:
        for i, fk in enumerate(fks_of[n]):
            if fk.table not in frames:
                continue
            parent = TARGET if tcol and fk.table == table else fk.table
            _relate(es, parent, n, f"__f{i}")
            if tcol and n == table:  # the target rows reference the same parents
                _relate(es, fk.table, TARGET, f"__f{i}")
    return es, target_name, target_frame, primary[table]


def _relate(es, parent: str, child: str, column: str) -> None:
    try:
        es.add_relationship(parent, KEY, child, column)
    except Exception as err:  # noqa: BLE001 - featuretools refuses some (a second path between two frames): skip it
        warnings.warn(f"dfs_peer: relationship {child}.{column} -> {parent} skipped: {err}", stacklevel=2)


def _grid(cutoffs: np.ndarray, size: int) -> tuple[np.ndarray, bool]:
    """Cutoffs rounded down to at most `size` distinct values (quantiles of them); whether it rounded."""
    known = cutoffs[~np.isnan(cutoffs)]
    if len(np.unique(known)) <= size:
        return cutoffs, False
    grid = np.unique(np.quantile(known, np.linspace(0, 1, size), method="lower"))
    at = np.searchsorted(grid, cutoffs, side="right") - 1  # the largest grid value <= cutoff
    out = np.where(at >= 0, grid[np.clip(at, 0, None)], -np.inf)
    return np.where(np.isnan(cutoffs), np.nan, out), True


def matrix(learner, max_features: int = MAX_FEATURES, cutoffs: int = CUTOFFS) -> tuple[np.ndarray, list[str], list[str]]:
    """(DFS features of every labelled row in the learner's order, feature names, caps that applied)."""
    import featuretools as ft

    es, target_name, target_frame, pk = entityset(learner)
    keys = learner.template.relations[learner.output].keys
    k, t = "k", "t"
    on = exp.and_(*[exp.NullSafeEQ(this=q.col(c, k), expression=q.col(c, t)) for c in keys])
    rows = learner.db.arrow(exp.select(q.col("_rid", k), q.alias(_key(pk, t), KEY))
                            .from_(exp.alias_(learner.db.temp_table("k", learner.output), q.ident(k), table=True))
                            .join(exp.alias_(exp.Table(this=q.ident(learner.table)), q.ident(t), table=True), on=on)
                            .where(exp.Not(this=exp.Is(this=q.col(learner.column, t), expression=exp.Null())))).to_pandas()
    caps = []
    options = dict(entityset=es, target_dataframe_name=target_name, max_depth=2, max_features=max_features,
                   drop_contains=[f"({TARGET}"], n_jobs=1, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if target_frame is not None:
            wanted = target_frame[target_frame[KEY].isin(set(rows[KEY]))]
            stamps = wanted[TIME].to_numpy(np.float64)
            floor = np.nanmin(stamps) - 1 if np.isfinite(stamps).any() else 0.0
            stamps, rounded = _grid(np.where(np.isnan(stamps), floor, stamps), cutoffs)
            if rounded:
                caps.append(f"cutoffs rounded down to {cutoffs}")
            cut = pd.DataFrame({KEY: wanted[KEY].to_numpy(), "time": stamps})
            fm, defs = ft.dfs(cutoff_time=cut, **options)
        else:
            fm, defs = ft.dfs(instance_ids=list(rows[KEY]), **options)
    if len(defs) >= max_features:
        caps.append(f"features capped at {max_features}")
    fm.index = fm.index.astype(str)
    fm = fm.reindex(rows[KEY].astype(str).to_numpy())
    x = np.stack([_numeric(fm[c]) for c in fm.columns], axis=1) if len(fm.columns) else np.zeros((len(fm), 0))
    out = np.full((int(learner.output_rows), x.shape[1]), np.nan)
    rid = rows["_rid"].to_numpy(np.int64)
    inside = (rid >= 0) & (rid < len(out))
    out[rid[inside]] = x[inside]
    return out[learner.labelled], list(fm.columns), caps


def _numeric(values: pd.Series) -> np.ndarray:
    """A feature column as float64: numbers and booleans as they are, dates as epoch seconds, other
    values as category codes over all rows (NaN for missing)."""
    if pd.api.types.is_bool_dtype(values) or pd.api.types.is_numeric_dtype(values):
        return values.astype("Float64").to_numpy(np.float64, na_value=np.nan)
    if pd.api.types.is_datetime64_any_dtype(values):
        stamps = values.astype("datetime64[ns]")
        return np.where(stamps.isna(), np.nan, stamps.astype("int64").to_numpy() / 1e9)
    codes = values.astype("category").cat.codes.to_numpy().astype(np.float64)
    return np.where(codes < 0, np.nan, codes)


def peer(learner, max_features: int = MAX_FEATURES, cutoffs: int = CUTOFFS) -> dict:
    """DFS + LightGBM on the learner's split, timed (features + fit); an error is recorded, not raised."""
    from relsql.train.gbm import baselines

    try:
        started = time.perf_counter()
        cpu = time.process_time()
        x, names, caps = matrix(learner, max_features, cutoffs)
        features_s = time.perf_counter() - started
        if not x.shape[1]:
            return {"dfs_s": features_s, "dfs_features": 0, "dfs_score": None, "dfs_capped": caps}
        trees = baselines.fit_trees(learner, x)
        test = learner.rows["test"]
        scores = learner.task.scores(trees.raw(x[test]), baselines._labels(learner, "test"))
        return {"dfs_s": time.perf_counter() - started, "dfs_cpu_s": time.process_time() - cpu, "dfs_features_s": features_s,
                "dfs_features": int(x.shape[1]), "dfs_capped": caps, "dfs_scores": {k: float(v) for k, v in scores.items()},
                "dfs_score": float(scores.get(learner.task.metric, float("nan")))}
    except Exception as err:  # noqa: BLE001 - the peer's failure is recorded, not the model's
        return {"dfs_error": f"{type(err).__name__}: {str(err)[:500]}"}
