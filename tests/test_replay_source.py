"""The generated replay of a recorded batch plan (relsql/compile/reuse.py's `_straight`) against a
plain loop over the same recorded steps, written here as the naive reference: for batches of one
padded shape both give the same batch tensors, bit for bit, and both refuse a batch whose guard
differs."""

from __future__ import annotations

import torch

import relsql
from relsql.compile.planning import make_plan
from relsql.compile.reuse import Trace, _live, _Recorder, _Ref, needs, pad_to, raw_tensors
from relsql.train.feed.batched import PASSES
from tests.test_plan_reuse import SHOP, quiet, random_batches, shop_db


def loop_replay(steps: list[tuple], raw: list[torch.Tensor], nodes: list[int], shapes: list[tuple]) -> list | None:
    """Each recorded step run in order on an environment of nodes: arguments filled from it,
    python results compared with the recorded ones, tensor results stored into it."""
    env: dict[int, object] = dict(enumerate(raw))

    def fill(t):
        if type(t) is _Ref:
            return env.get(t.node)
        if type(t) in (list, tuple):
            return type(t)(fill(v) for v in t)
        if type(t) is dict:
            return {k: fill(v) for k, v in t.items()}
        return t

    def same(expected, found) -> bool:
        if isinstance(expected, torch.Tensor):
            return isinstance(found, torch.Tensor)
        if isinstance(expected, list | tuple) and not isinstance(expected, torch.Size):
            return len(found) == len(expected) and all(same(e, f) for e, f in zip(expected, found))
        return type(found) is type(expected) and found == expected

    def bind(t, value) -> None:
        if type(t) is _Ref:
            env[t.node] = value
        elif type(t) is tuple:
            for part, v in zip(t, value):
                bind(part, v)

    for func, args, kwargs, out, expected in steps:
        value = func(*fill(args), **fill(kwargs))
        if expected is not None and not same(expected, value):
            return None
        bind(out, value)
    if any(tuple(env[node].shape) != shape for node, shape in shapes):
        return None
    return [env[node] for node in nodes]


def recorded(model, grounding):
    """A trace of the padded grounding, with the recorder's live steps (what the generated code runs)."""
    batched = model.batched
    recorder = _Recorder(raw_tensors(grounding))
    with recorder:
        plan = make_plan(batched.template, grounding, batched.dtype, PASSES, outputs=[batched.output], device="cpu")
    trace = Trace(plan, recorder)
    inputs = {slot: recorder.nodes.get(id(t)) for slot, t in plan.inputs.items()}
    shapes = [(node, tuple(plan.inputs[slot].shape)) for slot, node in inputs.items() if node is not None]
    attrs = [recorder.nodes[id(plan.ops[i].attrs[k])] for i, k in trace.frame.attrs]
    nodes = [inputs[slot] for slot in trace.frame.inputs] + attrs
    return trace, _live(recorder, plan), nodes, shapes


def test_generated_replay_equals_a_loop_over_the_recorded_steps():
    db = shop_db()
    tpl = relsql.Template.from_sql(SHOP.format(embed="embed(i.kind, 4, 'kind')"))
    model = quiet(relsql.Model, db, tpl, target="item.y", seed=0, dtype=torch.float64, progress=False, batch_size=64)
    batched = model.batched
    for rids in random_batches(model.output_rows, [64], 8, seed=4):  # shapes recorded by the model's cache
        batched.prepare(rids)
    groups: dict[tuple, list] = {}  # a recorded shape -> the batches padded to it
    for rids in random_batches(model.output_rows, [64, 60], 24, seed=5):
        g = batched.source.ground(rids, 0)
        key = batched.plans._shape(needs(g))
        if key in batched.plans.traces:
            groups.setdefault(key, []).append(pad_to(g, key))
    compared = refused = 0
    for padded in groups.values():
        trace, steps, nodes, shapes = recorded(model, padded[0])
        for g in padded[1:]:
            raw = raw_tensors(g)
            want, got = loop_replay(steps, raw, nodes, shapes), trace.run(raw)
            assert (want is None) == (got is None)
            if want is None:
                refused += 1
                continue
            compared += 1
            assert len(got) == len(want) == len(nodes)
            for a, b in zip(got, want):
                assert a.layout == b.layout and a.dtype == b.dtype and a.shape == b.shape
                if a.layout == torch.sparse_csr:
                    assert all(torch.equal(p, q) for p, q in ((a.crow_indices(), b.crow_indices()),
                                                               (a.col_indices(), b.col_indices()), (a.values(), b.values())))
                else:
                    assert torch.equal(a, b)
    assert compared >= 10, (compared, refused)
    # a batch whose guarded value differs: a head index made not the identity where it was
    raw = [t.clone() for t in raw_tensors(padded[-1])]
    changed = next(i for i, t in enumerate(raw) if t.dtype == torch.int64 and t.dim() == 1 and len(t) > 2
                   and torch.equal(t, torch.arange(len(t))))
    raw[changed] = raw[changed].flip(0)
    assert loop_replay(steps, raw, nodes, shapes) is None and trace.run(raw) is None
    assert trace.run(list(raw[:-1])) is None  # not this trace's inputs at all
