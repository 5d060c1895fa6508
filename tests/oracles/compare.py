"""Runs a Datalog template through relsql and PyNeuraLogic with identical weights and compares.

Used by the oracle tests: outputs of every query, values of chosen intermediate relations and
the gradient of Σ(o − t)² over the queries must agree within `TOL` in float64.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import torch

import relsql
from tests.oracles import neuralogic_oracle as oracle

TOL = 1e-6


def oracle_text(text: str) -> str:
    """0.9.2's parser rejects the combined `activation=crosssum-tanh` form; spell it out."""
    names = {"crosssum": "crosssum", "elementproduct": "elproduct", "product": "product"}

    def split(m: re.Match) -> str:
        return f"combination={names[m.group(1).lower()]}, transformation={m.group(2)}"

    return re.sub(r"activation=(crosssum|elementproduct|product)-(\w+)", split, text, flags=re.IGNORECASE)


def relsql_weights(tpl: relsql.Template, net) -> dict[int, np.ndarray]:
    """Our weights by NeuraLogic index: template declaration order is NeuraLogic's index order."""
    ours = net.named_weights()
    return {i: ours[name].detach().numpy() for i, name in enumerate(tpl.weights)
            if name in ours and ours[name].requires_grad}


def keyed_values(net, relation: str) -> dict[tuple, np.ndarray]:
    frame = net.values(relation)
    keys = [c for c in frame.columns if c != "value"]
    return {tuple(str(v) if k != "sample" else int(v) for k, v in zip(keys, row[:-1])): np.array(row[-1])
            for row in frame.iter_rows()}


def facts_db(examples: list[str], queries: list[str]) -> relsql.Database:
    """An in-memory database of NeuraLogic example and query lines (one sample per line)."""
    from relsql.datasets.neuralogic_files import import_text

    db = relsql.connect()
    import_text(db.con, "\n".join(examples), "\n".join(queries))
    return db


def compare_template(text: str, template_dir: str, db, examples, queries, query_table: str,
                     intermediates: tuple[str, ...] = (), check_gradients: bool = True) -> dict[str, float]:
    tpl = relsql.Template.from_datalog(text, base_dir=template_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = relsql.compile(tpl, db, dtype=torch.float64, seed=7)
    weights = relsql_weights(tpl, net)
    result = oracle.evaluate(oracle_text(text), examples, queries, weights=weights, template_dir=template_dir)
    for i, w in weights.items():
        assert result.weight_shapes[i] == () or np.prod(result.weight_shapes[i]) == w.size, (i, result.weight_shapes[i], w.shape)
    outputs = net()
    head = query_table.removeprefix("query_")
    ours = keyed_values(net, head)
    deviations = {}
    worst = 0.0
    for out in result.outputs:
        args = tuple(a.strip() for a in out.query[out.query.index("(") + 1:-1].split(",")) if "(" in out.query else ()
        key = (out.sample, *args)
        assert key in ours, f"{out.query} of sample {out.sample} has no value in relsql"
        assert ours[key].size == out.value.size, f"{out.query}: relsql value size {ours[key].size}, NeuraLogic {out.value.size}"
        worst = max(worst, float(np.abs(ours[key].reshape(-1) - out.value.reshape(-1)).max()))
    deviations["outputs"] = worst
    assert worst < TOL
    for relation in intermediates:
        expected = oracle.atom_values(oracle_text(text), examples, relation, weights=weights, template_dir=template_dir)
        got = keyed_values(net, relation)
        assert len(expected) == len(got), f"{relation}: NeuraLogic has {len(expected)} atoms, relsql {len(got)}"
        for (s, args), v in expected.items():
            assert got[(s, *args)].size == v.size, (f"{relation}{args}: relsql value size {got[(s, *args)].size}, "
                                                    f"NeuraLogic {v.size}")
        worst = max(float(np.abs(got[(s, *args)].reshape(-1) - v.reshape(-1)).max()) for (s, args), v in expected.items())
        deviations[relation] = worst
        assert worst < TOL, relation
    if check_gradients:
        targets = db.arrow(f'SELECT * FROM "{query_table}" ORDER BY ordinal').to_pylist()
        rows = {k: i for i, k in enumerate(keyed_values(net, head))}
        loss = 0
        for t in targets:
            key = (t["sample"], *[t[f"a{i}"] for i in range(len(t) - 3)])
            loss = loss + ((outputs[head][rows[key]] - torch.as_tensor(t["target"], dtype=torch.float64)) ** 2).sum()
        loss.backward()
        expected = result.gradients()
        ours_named = net.weights_by_name()  # whole parameters: they hold the gradients
        worst = 0.0
        for i, name in enumerate(tpl.weights):
            if i in weights:
                grad = ours_named[name].grad
                grad = np.zeros(weights[i].shape) if grad is None else grad.numpy()
                worst = max(worst, float(np.abs(grad.reshape(-1) - expected[i].reshape(-1)).max()))
        deviations["gradients"] = worst
        assert worst < TOL
    return deviations
