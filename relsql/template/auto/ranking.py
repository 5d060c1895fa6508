"""A ranking template's two towers (see `generate`): the candidate relation, one vector per row of
the referenced table R, and the query tower's statements of the output relation (the target row's
context, the ID embeddings of its foreign keys, its entity's history), with the timed relation of
popularity as of each target time."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot

from relsql.data.catalog import ForeignKey
from relsql.data.coltypes import is_time_type
from relsql.data.keys import Schema
from relsql.data.references import Reference
from relsql.targets import MAX_TIMES
from relsql.template.auto.draft import Draft
from relsql.template.auto.encoders import RARE
from relsql.template.auto.names import quoted, safe

TIMED_GROUNDINGS = 2 * 10**7  # the timed relation joins every time with every earlier event: written up to this


@dataclass(frozen=True)
class Interaction:
    """Rows of `table` that link an entity of the target row to a candidate: e.g. purchase(customer_id,
    item_id) for a target row with a customer_id, ranking items."""

    table: str
    candidate: ForeignKey  # the interaction table's key to the candidate table
    on: tuple[tuple[str, str], ...]  # (interaction column, target table column) pairs: the same entity
    itself: bool  # the interaction table is the target table: leave the target row itself out


def interactions(keys: Schema, target: str, column: str, reference: Reference) -> list[Interaction]:
    """Tables with a foreign key to the candidate table and one to an entity the target row has
    (the target row's own key, or a foreign key of the target table, never the target column's,
    to the same table and columns)."""
    found = []
    target_pk = tuple(keys.primary_keys[target])
    target_fks = [fk for child, fk in keys.foreign_keys if child == target and fk.columns != (column,)]
    for table, to_candidate in keys.foreign_keys:
        if to_candidate.table != reference.table or to_candidate.references != (reference.key,):
            continue  # (an interaction table needs no key of its own: it is only aggregated)
        for child, to_entity in keys.foreign_keys:
            if child != table or to_entity == to_candidate:
                continue
            links = [dict(zip(fk.references, fk.columns)) for fk in target_fks  # parent column -> target column
                     if fk.table == to_entity.table and set(fk.references) == set(to_entity.references)]
            if to_entity.table == target and set(to_entity.references) == set(target_pk):
                links.append({k: k for k in target_pk})
            for by_parent in links:
                on = tuple((c, by_parent[r]) for c, r in zip(to_entity.columns, to_entity.references))
                found.append(Interaction(table, to_candidate, on, table == target))
    return list(dict.fromkeys(found))


class Ranking:
    """The two towers of a ranking template (see `generate`): the candidate relation keyed by the
    candidate table's key, and the query tower's statements of the output relation."""

    def __init__(self, draft: Draft, reference: Reference, dimension: int, history: bool, timeless: str):
        self.draft, self.reference, self.dimension = draft, reference, dimension
        self.history, self.timeless = history, timeless
        self.name = f"candidate_{draft.labels[reference.table]}"
        self.notes: list[str] = []  # header lines: what each tower reads and why

    def embed(self, column: str, weight: str, min_count: int | None = None) -> str:
        """An ID embedding scaled by 1/sqrt(dimension): its rows start as N(0, 1), and the dot product
        of two unscaled ones would start with a spread of sqrt(dimension) (about 6), saturating the
        loss before anything is learnt. On bench.recommend_data's shop (400 customers, 200 items,
        seed 0, 60 epochs) MAP@10 went from 0.158 unscaled to 0.196."""
        rare = f", min_count={min_count}" if min_count else ""
        return f"embed({column}, {self.dimension}, '{self.draft.weight_name(weight)}'{rare}) * {self.dimension ** -0.5:.4g}"

    def timed(self, table: str) -> bool:
        """Whether rows of `table` may be read: always without a time column, else if their time is known."""
        w = self.draft
        return not w.time_column or table in w.time_columns or self.timeless == "include"

    def candidate(self, interactions: list[Interaction]) -> None:
        """The candidate tower: an ID embedding of each candidate row (what it is, learnt from the
        positives), its own columns' encoding and, where time allows, how many interaction rows
        reference it (popularity)."""
        w, ref, d = self.draft, self.reference, self.dimension
        key = quoted(ref.key)
        t = w.labels[ref.table]
        codes = [fk.columns[0] for child, fk in w.schema.foreign_keys if child == ref.table and len(fk.columns) == 1]
        terms = [self.embed(f"t.{key}", f"id_{t}"), f"linear(e.h, {d}, '{w.weight_name(f'w_{self.name}_own')}')"]
        terms += [self.embed(f"t.{quoted(c)}", f"{self.name}_{safe(c)}", RARE) for c in dict.fromkeys(codes)]
        w.out.append(
            f"-- {self.name}: the candidate tower, one {d}-wide vector per {ref.table} row (relsql.Model scores a target "
            f"row's vector against it): an ID embedding of {ref.table}.{ref.key} (its own row for every key, no rare "
            f"bucket: each key is on one row here; ID embeddings are scaled by 1/sqrt({d})), its own columns' encoding"
            + (f" and its foreign keys as codes ({', '.join(dict.fromkeys(codes))}: candidates sharing one are alike)"
               if codes else "") + "\n"
            f"CREATE TABLE {self.name} AS\n"
            f"SELECT t.{key}, {' + '.join(terms)} AS h\n"
            f"FROM {quoted(ref.table)} t\nJOIN enc_{t} e ON e.{key} = t.{key};\n")
        for table in dict.fromkeys(i.table for i in interactions if not i.itself):
            for fk in dict.fromkeys(i.candidate for i in interactions if i.table == table):
                self.popularity(table, fk)

    def popularity(self, table: str, fk: ForeignKey) -> None:
        """log(1 + rows of `table` referencing the candidate), before the target table's earliest
        time in a temporal template: the candidate tower is shared by every target row, so it may
        only read what precedes them all."""
        w, ref = self.draft, self.reference
        if w.time_column and table not in w.time_columns:
            self.notes.append(f"-- no popularity from {table} in the candidate tower: its rows' time is unknown")
            return
        earliest = f"(SELECT min(s.{quoted(w.time_column)}) FROM {quoted(w.target)} s)" if w.time_column else ""
        on_time, dimension = w.time_join(table, "y", earliest) if earliest else ("", "")
        source = (f"FROM {quoted(ref.table)} t\nJOIN {quoted(table)} y ON y.{quoted(fk.columns[0])} = t.{quoted(ref.key)}"
                  f"{on_time}{dimension}")
        if not w.db.arrow(sqlglot.parse_one(f"SELECT 1 {source} LIMIT 1", read="duckdb")).num_rows:
            self.notes.append(f"-- no popularity from {table} in the candidate tower: no rows"
                              + (f" before the earliest {w.target}.{w.time_column}" if earliest else ""))
            return
        when = f", counting only rows before the earliest {w.target}.{w.time_column} (no label window's rows)" if earliest else ""
        w.out.append(
            f"-- {self.name} <- {table}: how many {table} rows reference each {ref.table} row by {fk.columns[0]} "
            f"(popularity){when}\n"
            f"CREATE TABLE {self.name} AS\n"
            f"SELECT t.{quoted(ref.key)}, linear(log(1 + count(*)), {self.dimension}, "
            f"'{w.weight_name(f'w_{self.name}_{safe(table)}_count')}') AS h\n{source}\nGROUP BY t.{quoted(ref.key)};\n")

    def timed_counts(self, interactions: list[Interaction]) -> None:
        """The timed relation (relsql/train/ranking/timed.py), keyed by the target's time and the
        candidate key, 1 wide, added to the score of every target row of that time: log(1 + rows of
        each interaction table referencing the candidate before each distinct time) and, for a date
        time, the same count over one and over three usual gaps between times. Popularity as of each
        snapshot: the candidate tower may only count rows before the earliest one, and what sells
        moves (TPC-DS replaces its items over the years: counts of the last 30 or 90 days alone rank
        its test rows at MAP@10 0.085 and 0.105). bench.recommend's TPC-DS, test MAP@10: 0.033 without
        this relation (seeds 0-2), 0.058 with the counts before and in one gap (seeds 0-1), 0.062
        adding three gaps (seeds 0-2); the shop is unchanged (seed 0: 0.1197, 0.1189).
        One row per time and candidate, not per target row and candidate. The distinct times come
        as one row's list unnested: the database's estimate of the join then sees the few times, not
        one per target row (which would refuse the shop's 11 times x 40,000 purchases as 5 x 10^8)."""
        w, ref = self.draft, self.reference
        if not w.time_column:
            return
        name, t = f"recent_{w.labels[ref.table]}", quoted(w.time_column)
        days = self.gap_days()
        times = w.db.arrow(sqlglot.parse_one(f"SELECT count(DISTINCT {t}) FROM {quoted(w.target)}",
                                             read="duckdb")).column(0)[0].as_py()
        for table in dict.fromkeys(i.table for i in interactions if not i.itself and i.table in w.time_columns):
            events = w.db.arrow(sqlglot.parse_one(f"SELECT count(*) FROM {quoted(table)}", read="duckdb")).column(0)[0].as_py()
            if not times or times * events > TIMED_GROUNDINGS or times > MAX_TIMES:
                self.notes.append(f"-- no timed popularity from {table}: {times} distinct {w.time_column} values x {events} "
                                  f"rows is over {TIMED_GROUNDINGS:,} groundings (or {MAX_TIMES} times)")
                continue
            for fk in dict.fromkeys(i.candidate for i in interactions if i.table == table):
                for window in ([None, days, 3 * days] if days else [None]):
                    w.out.append(self.timed_statement(name, table, fk, window))
        if any(f"CREATE TABLE {name} AS" in statement for statement in w.out):
            self.notes.append(f"-- relsql: blend (validation picks how much of the towers' dot product joins {name}'s value: "
                              "1, 1/2, 1/4 or none; without this line it joins whole. TPC-DS, seeds 0-2: none)")

    def gap_days(self) -> int | None:
        """The median gap in whole days between the target's distinct times (None unless they are
        dates or timestamps with at least two distinct values): the recent window's length."""
        w = self.draft
        kind = next((c.type for c in w.schema.tables[w.target].columns if c.name == w.time_column), "")
        if not is_time_type(kind):
            return None
        t = quoted(w.time_column)
        query = f"SELECT DISTINCT epoch({t}) AS e FROM {quoted(w.target)} WHERE {t} IS NOT NULL ORDER BY e"
        times = w.db.arrow(sqlglot.parse_one(query, read="duckdb")).column(0).to_pylist()
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        return max(1, round(gaps[len(gaps) // 2] / 86400)) if gaps else None

    def timed_statement(self, name: str, table: str, fk: ForeignKey, window: int | None) -> str:
        """One rule of the timed relation: the counts before each time (within `window` days of it), weighted
        by 1 + a learnt bias that starts at 0. A linear(..., 1) weight starts at a random sign: TPC-DS makes
        one step an epoch (fewer training rows than a step takes) and stops within ~15 epochs, so the weight
        stays near its start (seed 0, the towers' share held at 0: weights -0.17, -0.28, -0.10 learnt, test
        MAP@10 0.0)."""
        w, ref = self.draft, self.reference
        key, t, time = quoted(ref.key), quoted(w.time_column), w.time_columns[table]
        alias = "y" if time.via is None else "yd"
        recent = f" AND {alias}.{quoted(time.column)} >= s.{t} - INTERVAL {window} DAY" if window else ""
        if time.via is None:
            rows = f"JOIN {quoted(table)} y ON y.{quoted(time.column)} < s.{t}{recent}"
        else:
            on = " AND ".join(f"y.{quoted(c)} = yd.{quoted(r)}" for c, r in zip(time.via.columns, time.via.references))
            rows = f"JOIN {quoted(time.via.table)} yd ON yd.{quoted(time.column)} < s.{t}{recent}\nJOIN {quoted(table)} y ON {on}"
        span = f"in the {window} days" if window else "at any time"
        weight = w.weight_name(f"w_{name}_{safe(table)}_{window or 'all'}")
        return (f"-- {name} <- {table}: per {w.target}.{w.time_column} and {ref.table} row, log(1 + the {table} rows "
                f"referencing it by {fk.columns[0]} {span} before that time): what sells as of each time, added to the "
                f"score of every {w.target} row of that time (a timed relation: keyed by the time and {ref.key})\n"
                f"CREATE TABLE {name} AS\n"
                f"SELECT s.{t}, c.{key}, log(1 + count(*)) * (1 + bias(1, '{weight}')) AS h\n"
                f"FROM (SELECT unnest(list_distinct(list({t}))) AS {t} FROM {quoted(w.target)}) s\n{rows}\n"
                f"JOIN {quoted(ref.table)} c ON c.{key} = y.{quoted(fk.columns[0])}\n"
                f"GROUP BY s.{t}, c.{key};\n")

    def identities(self) -> None:
        """The query tower's ID embeddings of the target row's one-column foreign keys (not the
        target column): a vector per customer, learnt from the training rows, as matrix
        factorization has; a key on fewer than RARE target rows shares the rare vector."""
        w = self.draft
        codes = [fk.columns[0] for child, fk in w.schema.foreign_keys
                 if child == w.target and len(fk.columns) == 1 and fk.columns[0] != w.column]
        keys = ", ".join(f"r.{quoted(k)}" for k in w.target_keys)
        for column in dict.fromkeys(codes):
            w.out.append(
                f"-- identity: an ID embedding of the target row's {column} (learnt from the training rows; a key on "
                f"fewer than {RARE} {w.target} rows shares one vector)\n"
                f"CREATE TABLE predict AS\nSELECT {keys}, "
                f"{self.embed(f'r.{quoted(column)}', f'query_{safe(column)}', RARE)} AS h\n"
                f"FROM {quoted(w.target)} r;\n")

    def past(self, interactions: list[Interaction], itself: bool) -> None:
        """The query tower's history term: the average candidate vector of the candidates the target
        row's entity interacted with before its time (the same relation the candidates are scored
        by, so the weights are shared exactly): items like those bought before score higher.
        `itself`: the terms over the target table's own rows, written commented out (they read the
        target column); they go before the output's first statement, as a file's last statement
        cannot be a comment."""
        if not self.history:
            return
        w = self.draft
        keys = ", ".join(f"r.{quoted(k)}" for k in w.target_keys)
        target_time = f"r.{quoted(w.time_column)}" if w.time_column else ""
        for inter in [i for i in interactions if i.itself == itself]:
            if not self.timed(inter.table):
                self.notes.append(f"-- no history from {inter.table} in the query tower: its rows' time is unknown")
                continue
            on = " AND ".join(f"y.{quoted(a)} = r.{quoted(b)}" for a, b in inter.on)
            if inter.itself:
                pk = w.target_keys
                on += (f" AND y.{quoted(pk[0])} <> r.{quoted(pk[0])}" if len(pk) == 1 else
                       " AND NOT (" + " AND ".join(f"y.{quoted(k)} = r.{quoted(k)}" for k in pk) + ")")
            on_time, dimension = w.time_join(inter.table, "y", target_time) if target_time else ("", "")
            when = "" if not target_time else f", strictly before the target row's {w.time_column}" \
                if inter.table in w.time_columns else ", unfiltered: its time is unknown (timeless='include')"
            comment = (f"-- history: the average {self.name} vector of the {self.reference.table} rows the target row's "
                       f"{', '.join(b for _, b in inter.on)} met in {inter.table} (its {', '.join(a for a, _ in inter.on)} "
                       f"-> {inter.candidate.columns[0]}){when}" + (" (the target row itself left out)" if inter.itself else ""))
            statement = (f"CREATE TABLE predict AS\nSELECT {keys}, avg(c.h) AS h\nFROM {quoted(w.target)} r\n"
                         f"JOIN {quoted(inter.table)} y ON {on}{on_time}{dimension}\n"
                         f"JOIN {self.name} c ON c.{quoted(self.reference.key)} = y.{quoted(inter.candidate.columns[0])}\n"
                         f"GROUP BY {keys};")
            if inter.itself:  # other rows' values of the target column: relsql.Model refuses a template reading it
                statement = "\n".join("-- " + line for line in statement.splitlines())
                comment += (f"\n-- written as a comment: it reads other rows' {w.column}, the target column, which "
                            f"relsql.Model refuses unless told those values are known before prediction time; "
                            f"uncomment it and pass allow_target_inputs=True if they are"
                            + (f" (each row reads only rows before its {w.time_column})" if target_time else ""))
                self.notes.append(f"-- history from {inter.table} itself is written commented out (it reads the target column)")
            w.out.append(f"{comment}\n{statement}\n")


def ranking_header(ranking: Ranking, target: str, interactions: list[Interaction]) -> list[str]:
    """The header's account of a ranking template: the towers, and what each reads under time."""
    ref, w = ranking.reference, ranking.draft
    lines = [f"-- ranking: {target} references {ref.table}({ref.key}){' (a list: several per row)' if ref.many else ''}; "
             f"score(row, candidate) = the dot product of predict's and {ranking.name}'s {ranking.dimension}-wide vectors",
             f"-- the candidate tower {ranking.name} is shared by every target row" + (
                 f": it reads interaction rows only from before the earliest {w.target}.{w.time_column}"
                 if w.time_column else "")]
    if not interactions:
        lines.append(f"-- no history: no table links a {w.target} row's entity to {ref.table}")
    elif not ranking.history:
        lines.append("-- no history (history=False)")
    return lines + ranking.notes
