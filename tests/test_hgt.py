"""relsql/sql_templates/hgt.sql against torch_geometric's HGTConv (two layers, 2 heads, float64): a seeded graph
of 3 node types and 5 edge types in DuckDB tables, PyG's weights copied into the template's
typed linears and type embeddings, node values of both layers and the gradients of every PyG
parameter compared (to 1e-10)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import relsql
from tests.tables import insert_rows

torch_geometric = pytest.importorskip("torch_geometric")
from torch_geometric.nn import HGTConv  # noqa: E402

pytestmark = pytest.mark.oracle  # PyTorch Geometric as the reference

ROOT = Path(__file__).resolve().parent.parent
NODE_TYPES = ["author", "paper", "venue"]
EDGE_TYPES = [("author", "writes", "paper"), ("paper", "written_by", "author"), ("paper", "published_in", "venue"),
              ("venue", "publishes", "paper"), ("paper", "cites", "paper")]
WIDTH, HEADS = 16, 2


def hetero_graph():
    """Nodes numbered globally by type; every node has in-edges (HGTConv's types all receive)."""
    rng = random.Random(7)
    counts = {"author": 30, "paper": 40, "venue": 6}
    ids, start = {}, 0
    for t in NODE_TYPES:
        ids[t] = list(range(start, start + counts[t]))
        start += counts[t]
    edges = set()
    for p in ids["paper"]:
        for a in rng.sample(ids["author"], rng.randint(1, 3)):
            edges |= {(a, p, "writes"), (p, a, "written_by")}
        v = rng.choice(ids["venue"])
        edges |= {(p, v, "published_in"), (v, p, "publishes")}
    for a in ids["author"]:  # every author writes something
        p = rng.choice(ids["paper"])
        edges |= {(a, p, "writes"), (p, a, "written_by")}
    for v in ids["venue"]:
        p = rng.choice(ids["paper"])
        edges |= {(p, v, "published_in"), (v, p, "publishes")}
    for _ in range(60):
        edges.add((rng.choice(ids["paper"]), rng.choice(ids["paper"]), "cites"))
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(start, WIDTH, dtype=torch.float64, generator=generator)
    return ids, sorted(edges), x


@pytest.fixture(scope="module")
def graph():
    return hetero_db()


def hetero_db():
    """The hetero graph as tables node(node_id, type, x) and edge(src, dst, type) of a new DuckDB."""
    ids, edges, x = hetero_graph()
    db = relsql.connect()
    types = {n: t for t in NODE_TYPES for n in ids[t]}
    db.con.execute("CREATE TABLE node (node_id BIGINT, type VARCHAR, x DOUBLE[])")
    insert_rows(db, "node", [(n, types[n], x[n].tolist()) for n in range(len(x))])
    db.con.execute("CREATE TABLE edge (src BIGINT, dst BIGINT, type VARCHAR)")
    insert_rows(db, "edge", edges)
    return db, ids, edges, x


def codes(net, weight: str) -> dict[str, int]:
    table = net.grounding.dictionaries[weight]
    return dict(zip(table.column("value").to_pylist(), table.column("code").to_pylist()))


def test_hgt_template_equals_pyg_hgtconv(graph):
    db, ids, edges, x = graph
    net = relsql.compile(relsql.Template.from_file(relsql.sql_templates.path("hgt")), db, dtype=torch.float64, seed=0)
    convs = [HGTConv(WIDTH, WIDTH, (NODE_TYPES, EDGE_TYPES), heads=HEADS).double() for _ in range(2)]
    generator = torch.Generator().manual_seed(11)
    ours = net.weights_by_name()  # whole parameters: their gradients are compared per type code
    d = WIDTH // HEADS
    relation_of = {r: i for i, (_, r, _) in enumerate(EDGE_TYPES)}

    def blocks(layer: int, kind: str):
        """(relsql weight, edge type name, head, PyG block index) of W_att / W_msg."""
        name = f"hgt{layer}_{'att' if kind == 'k_rel' else 'msg'}"
        for r, code in codes(net, name).items():
            for h in range(HEADS):
                yield name, code, h, h * len(EDGE_TYPES) + relation_of[r]

    with torch.no_grad():
        for p in ours.values():
            p.zero_()
        for layer, conv in enumerate(convs, start=1):
            for p in conv.parameters():
                p.copy_(torch.randn(p.shape, dtype=torch.float64, generator=generator) * 0.4)
            for t in NODE_TYPES:
                kqv = conv.kqv_lin.lins[t]
                for part, letter in enumerate("kqv"):
                    ours[f"hgt{layer}_{letter}"][codes(net, f"hgt{layer}_{letter}")[t]] = \
                        kqv.weight[part * WIDTH:(part + 1) * WIDTH]
                    ours[f"hgt{layer}_{letter}b"][codes(net, f"hgt{layer}_{letter}b")[t]] = \
                        kqv.bias[part * WIDTH:(part + 1) * WIDTH]
                ours[f"hgt{layer}_a"][codes(net, f"hgt{layer}_a")[t]] = conv.out_lin.lins[t].weight
                ours[f"hgt{layer}_ab"][codes(net, f"hgt{layer}_ab")[t]] = conv.out_lin.lins[t].bias
                ours[f"hgt{layer}_skip"][codes(net, f"hgt{layer}_skip")[t]] = conv.skip[t]
            for kind in ("k_rel", "v_rel"):
                for name, code, h, block in blocks(layer, kind):
                    ours[name][code, h * d:(h + 1) * d, h * d:(h + 1) * d] = getattr(conv, kind).weight[block].t()
            for (s, r, t), code in ((e, codes(net, f"hgt{layer}_p")[e[1]]) for e in EDGE_TYPES):
                ours[f"hgt{layer}_p"][code] = conv.p_rel[f"{s}__{r}__{t}"][0]

    local = {n: (t, i) for t in NODE_TYPES for i, n in enumerate(ids[t])}
    x_dict = {t: x[ids[t]] for t in NODE_TYPES}
    edge_index = {}
    for s, r, t in EDGE_TYPES:
        pairs = [(local[a][1], local[b][1]) for a, b, kind in edges if kind == r]
        edge_index[(s, r, t)] = torch.tensor(pairs).t().contiguous()
    h1 = convs[0](x_dict, edge_index)
    h2 = convs[1](h1, edge_index)

    values = net()
    rows = net.values("hgt2", values).get_column("node_id").to_list()
    assert rows == list(range(len(x)))  # every node has in-edges, so every node has a value
    for relation, expected in (("hgt1", h1), ("hgt2", h2)):
        for t in NODE_TYPES:
            assert torch.allclose(values[relation][ids[t]], expected[t], atol=1e-10, rtol=0), (relation, t)
    assert values["hgt2"].std() > 0.1  # not a vacuous comparison

    target = torch.randn(len(x), WIDTH, dtype=torch.float64, generator=generator)
    (values["hgt2"] * target).sum().backward()
    sum((h2[t] * target[ids[t]]).sum() for t in NODE_TYPES).backward()
    for layer, conv in enumerate(convs, start=1):
        for t in NODE_TYPES:
            kqv = conv.kqv_lin.lins[t]
            ours_w = torch.cat([ours[f"hgt{layer}_{c}"].grad[codes(net, f"hgt{layer}_{c}")[t]] for c in "kqv"])
            ours_b = torch.cat([ours[f"hgt{layer}_{c}b"].grad[codes(net, f"hgt{layer}_{c}b")[t]] for c in "kqv"])
            assert torch.allclose(ours_w, kqv.weight.grad, atol=1e-10, rtol=0)
            assert torch.allclose(ours_b, kqv.bias.grad, atol=1e-10, rtol=0)
            assert torch.allclose(ours[f"hgt{layer}_a"].grad[codes(net, f"hgt{layer}_a")[t]], conv.out_lin.lins[t].weight.grad,
                                  atol=1e-10)
            assert torch.allclose(ours[f"hgt{layer}_skip"].grad[codes(net, f"hgt{layer}_skip")[t]], conv.skip[t].grad, atol=1e-10)
        for kind in ("k_rel", "v_rel"):
            for name, code, h, block in blocks(layer, kind):
                grad = ours[name].grad[code, h * d:(h + 1) * d, h * d:(h + 1) * d].t()
                assert torch.allclose(grad, getattr(conv, kind).weight.grad[block], atol=1e-10, rtol=0), (name, h)
        for s, r, t in EDGE_TYPES:
            grad = ours[f"hgt{layer}_p"].grad[codes(net, f"hgt{layer}_p")[r]]
            assert torch.allclose(grad, conv.p_rel[f"{s}__{r}__{t}"].grad[0], atol=1e-10, rtol=0), r
            assert conv.p_rel[f"{s}__{r}__{t}"].grad.abs().max() > 0
    plan = net.explain()
    assert "one matrix per type" in plan and "sum_per_head" in plan and "attention(" in plan
