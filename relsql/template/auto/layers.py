"""The message-passing statements over the computation tree: each inner tree node's rows per target
row (x_<node>, filled top-down), their values combined bottom-up per foreign key and direction
(p_<node>, with a self term, then h_<node>), and the prediction read out at the root. A leaf's rows
get no relation of their own: they are read, encoded (and aged), inside the one statement that
aggregates them for their parent (`_child_term`). Its x_ relation would hold one grounding per
(target row, leaf row), each the same value the aggregate reads: grounded, keyed and gathered
for nothing.

Child rows (one-to-many) are aggregated with the `aggregation` terms (mean, sum, max and a count by
default, as RelBench's RDL models combine them: a mean alone cannot count). The sum is scaled by 1 /
(the average number of child rows per parent row over the whole table), so it has the size of a mean
for a typical row yet still grows with the number of rows; the count enters as log(1 + count(*)).
`layer` "gat" and "hgt" replace the terms by attention over the child rows."""

from __future__ import annotations

import math
import re

from relsql.data.keys import Schema
from relsql.template.auto.draft import Draft
from relsql.template.auto.encoders import encoding
from relsql.template.auto.names import quoted
from relsql.template.auto.paths import Node, Step, keyed
from relsql.template.auto.times import Time, seconds

INLINE_LEAVES = True  # False: a leaf gets its x_ relation too (the form tests/test_auto_leaves.py compares with)
HELD_KEYS = True  # False: every statement over a node relation joins back to its table row (tests/test_auto_held_keys.py)


def read_in_place(schema: Schema, node: Node) -> bool:
    """Whether a keyed node's rows are read inside its parent's statement (a leaf) rather than
    through an x_ relation of their own (`node_rows`)."""
    return INLINE_LEAVES and keyed(schema, node) and not node.children


def not_itself(draft: Draft, alias: str) -> str:
    """The condition keeping the target row itself out of its siblings (rows of `alias`)."""
    return " AND NOT ({})".format(" AND ".join(f"{alias}.{quoted(k)} = p.{draft.r[k]}" for k in draft.target_keys))


def near_row(draft: Draft, node: Node, step: Step, far: str) -> tuple[str, str]:
    """How a statement over node relation `p` reaches the rows (alias `far`) `step` leads to from
    `node`'s row: the join back to its table row `q` and the step's condition from `q`, or, where
    `step` reads only key columns, which `p` already holds, the condition from `p`'s own columns and
    no join (simpler SQL to read and edit, an eighth fewer joins on hostile schemas; docs/performance.md)."""
    names = draft.n(node.table)
    if HELD_KEYS and all(c in names for c in step.near_columns):
        return "", step.condition("p", far, {c: f"p.{names[c]}" for c in step.near_columns})
    on = " AND ".join(f"q.{quoted(k)} = p.{name}" for k, name in names.items())
    return f"\nJOIN {quoted(node.table)} q ON {on}", step.condition("q", far)


def node_rows(draft: Draft, node: Node) -> None:
    """x_<node>: the node's rows for each target row (its encoding, once per row)."""
    pk = draft.schema.primary_keys[node.table]
    t = draft.labels[node.table]
    time_column = draft.time_column
    if node.parent.parent is None:  # depth 1: straight from the target table
        target_time = f"r.{quoted(time_column)}" if time_column else ""
        source, step = f"FROM {quoted(draft.target)} r", node.step.condition("r", "x")
        target_keys = [f"r.{quoted(k)}" for k in draft.target_keys] + ([target_time] if time_column else [])
    else:
        target_time = f"p.{draft.r_time}"
        back, step = near_row(draft, node.parent, node.step, "x")
        source = f"FROM x_{node.parent.name} p{back}"
        target_keys = [f"p.{draft.r[k]}" for k in draft.target_keys] + ([f"p.{draft.r_time}"] if time_column else [])
    time = draft.event_time(node.table, node.step)
    on_time, dimension = draft.time_join(node.table, "x", target_time, node.step)
    condition = step + on_time
    if own_siblings(draft, node):  # never the target row itself
        condition += not_itself(draft, "x")
    select = [f"{expr} AS {name}" for expr, name in zip(target_keys + [f"x.{quoted(k)}" for k in pk], draft.keys(node))]
    group = ", ".join(target_keys + [f"x.{quoted(k)}" for k in pk])
    draft.out.append(
        f"-- {node.name}: {describe(draft, node, time)}\nCREATE TABLE x_{node.name} AS\nSELECT {', '.join(select)}, "
        f"avg({row_value(draft, node, time)}) AS h\n{source}\n"
        f"JOIN {quoted(node.table)} x ON {condition}{dimension}\nJOIN enc_{t} e ON {encoded_row(draft, node.table, 'x')}"
        f"{lateral(draft, node, time, target_time)}\nGROUP BY {group};\n")


def describe(draft: Draft, node: Node, time: Time | None) -> str:
    """What a node's rows are, for a comment: which rows of which table, and how time cuts them."""
    direction = "child rows" if node.step.to_child else "parent row"
    inputs = [name for name, read in (("age", ages(draft, time)), ("label", sibling_labels(draft, node, time))) if read]
    layer = f", each through a layer with its {' and '.join(inputs)}" if inputs and not draft.ranking else ""
    return (f"the {direction} of {node.parent.table} in {node.table} (via {', '.join(node.step.fk.columns)})"
            + _cut(draft, node, time) + layer)


def encoded_row(draft: Draft, table: str, alias: str) -> str:
    """The ON condition joining enc_<table> (alias e) to the table's row `alias`."""
    own = draft.own(table)
    return " AND ".join(f"e.{quoted(own[k])} = {alias}.{quoted(k)}" for k in draft.schema.primary_keys[table])


def own_siblings(draft: Draft, node: Node) -> bool:
    """Whether `node` holds the target row's siblings: rows of the target table reached back over
    the key its parent was reached by (relsql.template.auto.cuts.Pruning.siblings), which would
    include the target row itself but for its key."""
    return node.table == draft.target and node.parent.parent is not None and node.step.reverses(node.parent.step)


def _cut(draft: Draft, node: Node, time: Time | None) -> str:
    """How time cuts a node's rows, for its statement's comment."""
    if time is not None and own_siblings(draft, node):
        labels = ""
        if sibling_labels(draft, node, time):
            labels = ", their labels where strictly earlier"
            if draft.label_scale is not None:
                mean, spread = draft.label_scale
                labels += f" (as (label - {mean:.6g}) / {spread:.6g}: the earliest half of the labelled rows' mean and spread)"
        return (f", siblings of the target row earlier than its time (by {time.describe(node.table)}), "
                "never the row itself" + labels)
    if time is not None:
        return f", earlier than the target row's time (by {time.describe(node.table)})"
    if draft.time_column and not node.step.to_child:
        return ", not cut by time: a parent row, reached by its key"
    if draft.time_column:
        return ", unfiltered: no time known" + (" (a parent row: an attribute, not an event)" if not node.step.to_child else "")
    return ""


def ages(draft: Draft, time: Time | None) -> bool:
    """Whether rows cut by `time` get their age at the target row's time: with the "ple" encoders,
    for times that give seconds (dates, years) or two plain numbers."""
    if time is None or draft.numbers != "ple":
        return False
    if time.kind == "number" == draft.target_kind:
        return True
    return seconds("t", draft.target_kind) is not None and seconds("t", time.kind) is not None


def row_value(draft: Draft, node: Node, time: Time | None) -> str:
    """A node row's value: its table's encoding and, in a temporal template, for event rows within
    `hops` of the target row, their age at the target row's time (with encoders), as RelBench's
    encoders add: how recent an event was often says more than its calendar date; for the target
    row's earlier siblings, their labels too (`lateral`). Those inputs change from one target row to
    the next, so they cannot join the table's encoder; they pass, with the row's encoding, through a
    layer of their own (`timed_layer`) before the row is aggregated. A sum of terms over aliases e and ag."""
    terms = []
    if ages(draft, time):
        terms.append(f"linear({LATERAL}.age, {draft.width}, '{draft.weight_name(f'age_{node.name}')}')")
    if sibling_labels(draft, node, time):
        name = draft.weight_name(f"label_{node.name}")
        terms.append(f"linear({LATERAL}.label, {draft.width}, '{name}')")
        terms.append(f"linear({LATERAL}.unknown, {draft.width}, '{draft.weight_name(f'{name}_unknown')}')")
    if not terms:
        return "e.h"
    if draft.ranking:  # a ranking target's towers add them as they are: the layer gained nothing there, at 1.17x the CPU
        return " + ".join(["e.h", *terms])
    return f"e.h + {timed_layer(draft, node, terms)}"


def timed_layer(draft: Draft, node: Node, terms: list[str]) -> str:
    """An event row's age (and an earlier sibling's label) with its encoding, through a layer with a
    bias: tanh(W e.h + `terms` + b), added to e.h. Read linearly, as before, an age could reach the
    network only as a mean, a sum or a max over the rows; through the layer, "a recent row like this
    one" is one input (its age and its columns together) and a threshold on the age is one unit. The
    network alone against the linear read on 41 outside targets (docs/quality.md, "Event rows through
    a layer of their own"): Lahman's salaries 4.5 % lower RMSE, PluRel's temporal targets 0.6 %, the
    flights even."""
    own = f"linear(e.h, {draft.width}, '{draft.weight_name(f'event_{node.name}')}'{draft.blocks})"
    shift = f"bias({draft.width}, '{draft.weight_name(f'event_{node.name}_bias')}')"
    return draft.activation(" + ".join([own, *terms, shift]))


LATERAL = "ag"  # the alias of the lateral row holding an event row's age (and an earlier sibling's label)


def sibling_labels(draft: Draft, node: Node, time: Time | None) -> bool:
    """Whether `node`'s rows, the target row's siblings, bring their labels: in a temporal template
    whose target is a number or a boolean (not a ranking target's references), under the time cut.
    Each label is read only where the sibling's time is strictly earlier than the target row's (even
    under RelBench's `<=` cut), which relsql.train.task.leakage accepts and no other read."""
    return time is not None and draft.label_kind is not None and own_siblings(draft, node)


TAIL = 4.0  # a scaled label further than this from 0 is read on a log scale beyond it


def label_value(draft: Draft, label: str) -> str:
    """An earlier sibling's label as the network reads it: a boolean as 0/1; a number y as
    sign(y) * ln(1 + |y|) (`label` reads NULL where y is not finite), or, where that squeezes the labels
    together (draft.label_scale: relsql/template/auto/labels.py), as z = (y - mean) / spread, the units
    of the network's output, kept as it is within TAIL of 0 and beyond it TAIL + ln(|z| - TAIL + 1) with
    z's sign, so that a rare huge label stays a finite, ordered input: NULL there where the label is
    NULL, NaN, infinite or beyond the doubles once scaled."""
    if draft.label_kind == "boolean":
        return f"CAST({label} AS DOUBLE)"
    if draft.label_scale is None:
        return f"sign({label}) * ln(1 + abs({label}))"
    mean, spread = draft.label_scale
    z = f"(CAST({label} AS DOUBLE) - {_real(mean)}) / {_real(spread)}"
    tail = f"sign({z}) * ({TAIL!r} + ln(abs({z}) - {TAIL - 1!r}))"
    return f"(CASE WHEN isfinite({z}) THEN (CASE WHEN abs({z}) <= {TAIL!r} THEN {z} ELSE {tail} END) END)"


def _real(value: float) -> str:
    """A float as SQL text that reads back exactly (repr: the shortest round trip), bracketed if negative."""
    return f"({value!r})" if value < 0 or math.copysign(1.0, value) < 0 else repr(value)


def lateral(draft: Draft, node: Node, time: Time | None, target_time: str, alias: str = "x") -> str:
    """The lateral row of an event row (`alias`, its date dimension's `alias`d) holding, on fixed scales,
    its age at `target_time`: sign(days) * ln(1 + |days|) (dates and years; of the difference for
    two plain numbers), read raw, never standardized: features() standardizes with statistics over
    every grounding, later target rows' included, so future rows would move earlier predictions
    through its mean and spread (issue 44). A day, a month, a year and a decade are 0.69, 3.4, 5.9
    and 8.2. For an earlier sibling of the target row, its label too: `label` (`label_value`; 0 where
    NULL, NaN or infinite) and `unknown` (1 there), each read only under CASE WHEN the sibling's time <
    the target row's (else 0 and 1)."""
    columns = []
    if ages(draft, time):
        at = f"{alias if time.via is None else alias + 'd'}.{quoted(time.column)}"
        if time.kind == "number" == draft.target_kind:
            span = f"CAST({target_time} AS DOUBLE) - CAST({at} AS DOUBLE)"
        else:
            span = f"({seconds(target_time, draft.target_kind)} - {seconds(at, time.kind)}) / 86400.0"
        columns.append(f"sign({span}) * ln(1 + abs({span})) AS age")
    if sibling_labels(draft, node, time):
        label = f"{alias}.{quoted(draft.column)}"
        if draft.label_kind == "float" and draft.label_scale is None:  # NaN or an infinity is no label: unknown, as NULL is
            label = f"(CASE WHEN isfinite({label}) THEN {label} END)"
        value = label_value(draft, label)
        known = label if draft.label_scale is None else value  # a scaled label is NULL where not finite (label_value)
        earlier = f"{alias}.{quoted(draft.time_column)} < {target_time}"
        columns.append(f"CASE WHEN {earlier} THEN coalesce({value}, 0) ELSE 0 END AS label")
        columns.append(f"CASE WHEN {earlier} THEN CAST({known} IS NULL AS DOUBLE) ELSE 1 END AS unknown")
    if not columns:
        return ""
    return f"\nCROSS JOIN LATERAL (SELECT {', '.join(columns)}) {LATERAL}"


def aggregate(draft: Draft, child: Node, node: Node, own: str) -> tuple[str, str]:
    """(comment, neural expression) combining `child`'s values over its rows for `node`
    (`own`: the node's own encoding, which attention scores read)."""
    base, w, name = f"w_{child.name}_to_{node.name}", draft.width, draft.weight_name
    if draft.layer == "hgt":
        return hgt(draft, child, node, own, base)
    if not child.step.to_child:
        return "its parent row in", f"avg(linear(c.h, {w}, '{name(base)}'{draft.blocks}))"
    if draft.layer == "gat":  # GAT's attention over the child rows, a score from both ends
        score = f"leaky_relu(linear(c.h, 1, '{name(base + '_att_child')}') + linear({own}, 1, '{name(base + '_att_node')}'), 0.2)"
        return "attention over its child rows in", f"attention({score},\n            linear(c.h, {w}, '{name(base)}'))"
    if len(draft.aggregation) == 1 and draft.aggregation[0] != "count":
        kind = draft.aggregation[0]
        return f"{kind} over its child rows in", f"{kind}(linear(c.h, {w}, '{name(base)}'{draft.blocks}))"
    terms = []
    for kind in draft.aggregation:
        weight = name(f"{base}_{'mean' if kind == 'avg' else kind}")
        if kind == "count":
            value = "log(1 + count(*))"
        elif kind == "sum":
            scale = 1 / max(draft.sizes.fan_out(child.step), 1.0)
            value = "sum(c.h)" + (f" * {scale:.3g}" if f"{scale:.3g}" != "1" else "")
        else:
            value = f"{kind}(c.h)"
        terms.append(f"linear({value}, {w}, '{weight}'{'' if kind == 'count' else draft.blocks})")
    return f"{', '.join(draft.aggregation)} over its child rows in", "\n  + ".join(terms)


def typed(draft: Draft, base: str) -> str:
    """The weight `base` of a table, one name however many statements use it."""
    if base not in draft.per_table:
        draft.per_table[base] = draft.weight_name(base)
    return draft.per_table[base]


def hgt(draft: Draft, child: Node, node: Node, own: str, base: str) -> tuple[str, str]:
    """HGT's message passing for one key and direction: keys, queries and values by table
    (node type), the attention and message matrices by key and direction (edge type), heads
    of width/2, then the node table's output matrix after gelu. The softmax runs over this
    key's rows only (each key is its own statement here)."""
    w = draft.width
    k_table, n_table = draft.labels[child.table], draft.labels[node.table]
    value = f"linear(c.h, {w}, '{typed(draft, f'hgt_v_{k_table}')}')"
    message = f"linear({value}, {w}, '{draft.weight_name(base + '_msg')}')"
    out = f"'{typed(draft, f'hgt_a_{n_table}')}'"
    if not child.step.to_child:
        return "HGT's message from its parent row in", f"linear(gelu(avg({message})), {w}, {out})"
    heads = 2 if w % 2 == 0 else 1
    key = f"linear(c.h, {w}, '{typed(draft, f'hgt_k_{k_table}')}')"
    query = f"linear({own}, {w}, '{typed(draft, f'hgt_q_{n_table}')}')"
    score = (f"sum_per_head({query} * linear({key}, {w}, '{draft.weight_name(base + '_att')}'), {heads}) "
             f"* {1 / math.sqrt(w // heads):.9g}")
    return (f"HGT attention ({heads} heads) over its child rows in",
            f"linear(gelu(attention({score},\n            {message})), {w}, {out})")


def head(draft: Draft, root: Node, value: str, units: int, encoded: str, ranking: bool = False) -> None:
    """The prediction: a linear read-out of the root's value, plus one of the target row's own
    encoding (`encoded`: own_<target>, wider than the relations', or enc_<target>), so
    its own columns reach the output in one step rather than through every layer; without children,
    the target row's encoding alone (enc_<target>, all of its columns).
    `ranking`: it is the query tower, a `units`-wide vector scored against the candidates'."""
    own = draft.own(draft.target)
    keys = ", ".join(f"v.{quoted(own[k])}" for k in draft.target_keys)
    comment = (f"-- the prediction for each {draft.target} row ({units} output{'s' if units > 1 else ''}; "
               "relsql.Model adds the loss)")
    if ranking:
        comment = (f"-- the query tower: a {units}-wide vector for each {draft.target} row; its score for a candidate is the "
                   "dot product with the candidate's vector (relsql.Model ranks them)")
    if not root.children:
        draft.out.append(f"{comment}\nCREATE TABLE predict AS\nSELECT {keys}, linear(v.h, {units * draft.members}, "
                         f"'{draft.weight_name('w_out')}'{draft.blocks}) AS h\nFROM enc_{draft.labels[draft.target]} v;\n")
        return
    on = " AND ".join(f"e.{quoted(own[k])} = v.{quoted(own[k])}" for k in draft.target_keys)
    draft.out.append(f"{comment}: its relational context and, directly, its own encoding\n"
                     f"CREATE TABLE predict AS\nSELECT {keys}, linear(v.h, {units * draft.members}, "
                     f"'{draft.weight_name('w_out')}'{draft.blocks}) + linear(e.h, {units * draft.members}, "
                     f"'{draft.weight_name('w_out_own')}'{draft.blocks}) AS h\n"
                     f"FROM {value} v\nJOIN {encoded} e ON {on};\n")


def node_value(draft: Draft, node: Node) -> str:
    """Statements computing node's value bottom-up; returns the relation holding it."""
    if not node.children:
        return f"x_{node.name}"  # where INLINE_LEAVES, a name never read: `_child_term` reads the leaf's rows
    child_values = {child.name: node_value(draft, child) for child in node.children}
    is_root = node.parent is None
    relation, self_weight = f"p_{node.name}", draft.weight_name('w_' + node.name + '_self')
    if is_root:
        keys = list(draft.own(draft.target).values())
        draft.out.append(f"-- {node.table}: the target row's own encoding (self term)\nCREATE TABLE {relation} AS\n"
                         f"SELECT {', '.join('e.' + quoted(k) for k in keys)}, "
                         f"linear(e.h, {draft.width}, '{self_weight}'{draft.blocks}) AS h\n"
                         f"FROM enc_{draft.labels[node.table]} e;\n")
    else:
        keys = draft.keys(node)
        draft.out.append(f"-- {node.name}: self term\nCREATE TABLE {relation} AS\n"
                         f"SELECT {', '.join('x.' + k for k in keys)}, "
                         f"linear(x.h, {draft.width}, '{self_weight}'{draft.blocks}) AS h\n"
                         f"FROM x_{node.name} x;\n")
    for child in node.children:
        draft.out.append(_child_term(draft, node, child, child_values[child.name], keys))
    value = f"h_{node.name}"
    key_list = ", ".join(f"p.{quoted(k)}" if is_root else f"p.{k}" for k in keys)
    draft.out.append(f"CREATE TABLE {value} AS\nSELECT {key_list}, {draft.activation('p.h')} AS h\nFROM {relation} p;\n")
    return value


def _child_term(draft: Draft, node: Node, child: Node, child_value: str, keys: list[str]) -> str:
    """The statement adding to p_<node> what `child`'s rows (their values in `child_value`) say."""
    is_root = node.parent is None
    if is_root:
        source, step = f"FROM {quoted(draft.target)} p", child.step.condition("p", "y")
        head_keys = [f"p.{quoted(k)}" for k in draft.target_keys]
        target_match = [f"c.{draft.r[k]} = p.{quoted(k)}" for k in draft.target_keys]
        target_time = f"p.{quoted(draft.time_column)}" if draft.time_column else ""
    else:
        back, step = near_row(draft, node, child.step, "y")
        source = f"FROM x_{node.name} p{back}"
        head_keys = [f"p.{k}" for k in draft.keys(node)]
        target_match = [f"c.{draft.r[k]} = p.{draft.r[k]}" for k in draft.target_keys]
        target_time = f"p.{draft.r_time}"
    if draft.time_column:
        target_match.append(f"c.{draft.r_time} = {target_time}")
    on_time, dimension = draft.time_join(child.table, "y", target_time, child.step)
    condition = step + on_time
    leaf = read_in_place(draft.schema, child)
    if leaf and own_siblings(draft, child):  # never the target row itself
        condition += not_itself(draft, "y")
    own, own_join = "p.h", ""
    if is_root:  # the target row's own encoding, for attention scores
        own = "s.h"
        own_join = "\nJOIN enc_{} s ON {}".format(
            draft.labels[node.table],
            " AND ".join(f"s.{quoted(name)} = p.{quoted(k)}" for k, name in draft.own(draft.target).items()))
    kind, value = aggregate(draft, child, node, own)
    if "attention(" not in value:
        own_join = ""
    scaled = " (the sum scaled by 1 / the table's average child rows per parent)" if "sum(c.h) * " in value else ""
    comment = f"-- {node.name} <- {child.name}: {kind} {child.table}, own weights for this key and direction{scaled}\n"
    rows, reads = quoted(child.table), ""
    if leaf:  # its rows encoded (and aged) where they are read: no x_ relation of their own
        time = draft.event_time(child.table, child.step)
        encoded = row_value(draft, child, time)
        value = re.sub(r"\bc\.h\b", lambda _: encoded, value)
        comment = f"-- {child.name}: {describe(draft, child, time)}\n{comment}"
        reads = (f"\nJOIN enc_{draft.labels[child.table]} e ON {encoded_row(draft, child.table, 'y')}"
                 f"{lateral(draft, child, time, target_time, 'y')}")
    elif keyed(draft.schema, child):
        match = " AND ".join(target_match + [f"c.{name} = y.{quoted(k)}" for k, name in draft.n(child.table).items()])
        reads = f"\nJOIN {child_value} c ON {match}"
    else:  # its rows have no key to name them by: each is encoded where it is read, inside the aggregates
        first = child.table not in draft.inline
        if first:
            draft.inline[child.table] = encoding(draft, child.table, "y")
        encoded, lines, rows = draft.inline[child.table]
        value = re.sub(r"\bc\.h\b", lambda _: encoded, value)
        comment = "\n".join(lines) + "\n" + comment if first else comment  # what it reads: said once
    return (f"{comment}CREATE TABLE p_{node.name} AS\n"
            f"SELECT {', '.join(f'{h} AS {quoted(k) if is_root else k}' for h, k in zip(head_keys, keys))}, "
            f"{value} AS h\n"
            f"{source}{own_join}\nJOIN {rows} y ON {condition}{dimension}{reads}\n"
            f"GROUP BY {', '.join(head_keys)};\n")
