"""relsql.export.to_heterodata against outside oracles: RelBench's make_pkey_fkey_graph builds the
foreign-key graph of the same tables (node counts and edge sets must match up to node numbering),
and torch_geometric's scatter, run on an exported grounding, must compute the model's own output."""

from __future__ import annotations

import importlib

import duckdb
import numpy as np
import pytest
import torch

import relsql
from relsql.export import to_heterodata

torch_geometric = importlib.import_module("torch_geometric")
from torch_geometric.utils import scatter  # noqa: E402

pytestmark = pytest.mark.oracle


def shop() -> relsql.Database:
    """Keys out of order, a NULL and a dangling-free child without a primary key, a composite-free schema."""
    con = duckdb.connect()
    con.execute("CREATE TABLE customer (cid INTEGER PRIMARY KEY, age DOUBLE, vip BOOLEAN)")
    con.execute("CREATE TABLE product (sku VARCHAR PRIMARY KEY, price DOUBLE)")
    con.execute("CREATE TABLE orders (oid INTEGER PRIMARY KEY, cid INTEGER REFERENCES customer (cid), "
                "sku VARCHAR REFERENCES product (sku), amount DOUBLE)")
    con.execute("CREATE TABLE review (cid INTEGER REFERENCES customer (cid), sku VARCHAR REFERENCES product (sku), "
                "stars INTEGER)")
    con.execute("INSERT INTO customer SELECT (i * 7) % 31, i % 5, i % 3 = 0 FROM range(31) t(i)")
    con.execute("INSERT INTO product SELECT 'p' || ((i * 5) % 13), i * 1.5 FROM range(13) t(i)")
    con.execute("INSERT INTO orders SELECT 1000 - i, CASE WHEN i % 9 = 0 THEN NULL ELSE (i * 11) % 31 END, "
                "'p' || (i % 13), i * 0.25 FROM range(120) t(i)")
    con.execute("INSERT INTO review SELECT i % 31, 'p' || ((i * 3) % 13), i FROM range(50) t(i)")
    return relsql.connect(con)


def relbench_graph(db: relsql.Database):
    """RelBench's graph of the same tables: primary keys renumbered 0..n-1 as RelBench requires."""
    importlib.import_module("relbench")
    from relbench.base import Database, Table
    from relbench.modeling.graph import make_pkey_fkey_graph
    from torch_frame import stype

    frames = {t: db.con.execute(f'SELECT * FROM "{t}"').df() for t in ("customer", "product", "orders", "review")}
    position = {}
    for table, key in (("customer", "cid"), ("product", "sku"), ("orders", "oid")):
        frame = frames[table].sort_values(key).reset_index(drop=True)
        position[table] = {k: i for i, k in enumerate(frame[key])}
        frame["_key"] = frame[key]
        frame[key] = np.arange(len(frame))
        frames[table] = frame
    for table in ("orders", "review"):
        frames[table]["cid"] = frames[table]["cid"].map(position["customer"]).astype("float")
        frames[table]["sku"] = frames[table]["sku"].map(position["product"]).astype("float")
    fkeys = {"orders": {"cid": "customer", "sku": "product"}, "review": {"cid": "customer", "sku": "product"}}
    pkeys = {"customer": "cid", "product": "sku", "orders": "oid"}
    tables = {t: Table(f.drop(columns=["_key"], errors="ignore"), fkeys.get(t, {}), pkeys.get(t)) for t, f in frames.items()}
    stypes = {"customer": {"age": stype.numerical, "vip": stype.categorical}, "product": {"price": stype.numerical},
              "orders": {"amount": stype.numerical}, "review": {"stars": stype.numerical}}
    data, _ = make_pkey_fkey_graph(Database(tables),
                                   {t: {**{c: stype.numerical for c in ("cid", "sku", "oid") if c in frames[t]}, **s}
                                    for t, s in stypes.items()})
    keys = {t: frames[t]["_key"].tolist() for t in pkeys}
    keys["review"] = list(zip(frames["review"]["stars"]))
    return data, keys


def ours_keys(data, db) -> dict[str, list]:
    keys = {t: data[t].node_keys.to_series(0).to_list() for t in ("customer", "product", "orders")}
    stars = data["review"].x[:, data["review"].feature_names.index("stars")]
    keys["review"] = [(int(s),) for s in stars]
    return keys


def edge_set(data, edge_type, keys) -> set:
    src, dst = data[edge_type].edge_index.tolist()
    return {(keys[edge_type[0]][s], keys[edge_type[2]][d]) for s, d in zip(src, dst)}


def test_the_foreign_key_graph_matches_relbench():
    db = shop()
    ours = to_heterodata(db)
    theirs, their_keys = relbench_graph(db)
    our_keys = ours_keys(ours, db)
    assert set(ours.node_types) == set(theirs.node_types)
    for table in ours.node_types:
        assert ours[table].num_nodes == theirs[table].num_nodes, table
    assert set(ours.edge_types) == set(theirs.edge_types)
    for edge_type in ours.edge_types:
        mine, reference = edge_set(ours, edge_type, our_keys), edge_set(theirs, edge_type, their_keys)
        assert mine == reference and len(mine) == ours[edge_type].edge_index.shape[1], edge_type
    assert ours["orders", "f2p_cid", "customer"].edge_index.shape[1] == 120 - 14  # the NULL references left out
    assert torch.equal(ours["orders", "f2p_cid", "customer"].edge_index,
                       ours["customer", "rev_f2p_cid", "orders"].edge_index.flip(0)[:, torch.argsort(
                           ours["customer", "rev_f2p_cid", "orders"].edge_index[1])])


def test_database_features_and_times_are_the_rows_values():
    con = duckdb.connect()
    con.execute("CREATE TABLE visit (vid INTEGER PRIMARY KEY, seen TIMESTAMP, minutes DOUBLE, note VARCHAR)")
    con.execute("INSERT INTO visit VALUES (2, '2024-01-02 00:00:00', NULL, 'b'), (1, '1970-01-01 00:01:00', 3.5, 'a')")
    data = to_heterodata(relsql.connect(con), time_columns={"visit": "seen"})
    assert data["visit"].feature_names == ["minutes"]
    assert data["visit"].x[0, 0].item() == 3.5 and torch.isnan(data["visit"].x[1, 0])
    assert data["visit"].time.tolist() == [60, 1704153600]
    with pytest.raises(relsql.RelsqlError, match="time_columns"):
        to_heterodata(relsql.connect(con), time_columns={"visit": "note"})


def test_a_relbench_database_brought_in_gives_relbenchs_graph_exactly():
    importlib.import_module("relbench")
    import pandas as pd
    from relbench.base import Database, Table
    from relbench.modeling.graph import make_pkey_fkey_graph
    from torch_frame import stype

    from relsql.relbench import from_relbench

    rng = np.random.default_rng(5)
    users = pd.DataFrame({"user_id": np.arange(20), "age": rng.integers(18, 80, 20).astype(float),
                          "joined": pd.date_range("2020-01-01", periods=20, freq="7D")})
    posts = pd.DataFrame({"post_id": np.arange(70), "user_id": rng.integers(0, 20, 70).astype(float),
                          "length": rng.uniform(1, 500, 70), "at": pd.date_range("2021-01-01", periods=70, freq="1D")})
    posts.loc[[3, 17], "user_id"] = np.nan
    likes = pd.DataFrame({"user_id": rng.integers(0, 20, 90), "post_id": rng.integers(0, 70, 90),
                          "weight": rng.normal(size=90)})
    database = Database({"users": Table(users, {}, "user_id", "joined"),
                         "posts": Table(posts, {"user_id": "users"}, "post_id", "at"),
                         "likes": Table(likes, {"user_id": "users", "post_id": "posts"}, None, None)})
    stypes = {"users": {"user_id": stype.numerical, "age": stype.numerical, "joined": stype.timestamp},
              "posts": {"post_id": stype.numerical, "user_id": stype.numerical, "length": stype.numerical,
                        "at": stype.timestamp},
              "likes": {"user_id": stype.numerical, "post_id": stype.numerical, "weight": stype.numerical}}
    theirs, _ = make_pkey_fkey_graph(database, stypes)
    ours = to_heterodata(from_relbench(database))  # keys and time columns come with the database
    assert set(ours.node_types) == set(theirs.node_types) and set(ours.edge_types) == set(theirs.edge_types)
    for table in theirs.node_types:
        assert ours[table].num_nodes == theirs[table].num_nodes
    for edge_type in theirs.edge_types:
        assert torch.equal(ours[edge_type].edge_index, theirs[edge_type].edge_index), edge_type
    for table in ("users", "posts"):
        assert torch.equal(ours[table].time, theirs[table].time), table


TEMPLATE = """
CREATE TABLE atom_h AS SELECT a.atom_id, linear(features(a.charge, a.mass), 4, 'w_in') AS h FROM atom a;
CREATE TABLE nb AS SELECT b.src AS atom_id, avg(linear(x.h, 4, 'w_nb')) AS h
FROM bond b JOIN atom_h x ON x.atom_id = b.dst GROUP BY b.src;
CREATE TABLE predict AS SELECT n.atom_id, linear(n.h, 1, 'w_out') AS h FROM nb n;
"""


def molecules() -> relsql.Database:
    con = duckdb.connect()
    rng = np.random.default_rng(3)
    con.execute("CREATE TABLE atom (atom_id INTEGER, charge DOUBLE, mass DOUBLE, label DOUBLE)")
    con.executemany("INSERT INTO atom VALUES (?, ?, ?, ?)",
                    [(int(i), float(c), float(m), float(y)) for i, c, m, y in
                     zip(rng.permutation(60) * 3, rng.normal(size=60), rng.uniform(1, 9, size=60), rng.normal(size=60))])
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, 60, size=(200, 2))}
    con.execute("CREATE TABLE bond (src INTEGER, dst INTEGER)")
    con.executemany("INSERT INTO bond VALUES (?, ?)", [(a * 3, b * 3) for a, b in sorted(pairs)])
    return relsql.connect(con)


def test_pyg_scatter_on_the_exported_grounding_computes_the_model():
    db = molecules()
    model = relsql.Model(db, relsql.Template.from_sql(TEMPLATE), "atom.label", dtype=torch.float64)
    data = to_heterodata(model)
    w = model.named_weights()
    edges = data["atom_h", "rule0_body0", "nb"].edge_index
    h = data["atom_h"].x @ w["w_in"].detach().T
    nb = scatter((h @ w["w_nb"].detach().T)[edges[0]], edges[1], dim=0, dim_size=data["nb"].num_nodes, reduce="mean")
    out = (nb @ w["w_out"].detach().T).squeeze(1)
    with torch.no_grad():
        expected = model.net()["predict"].reshape(-1)
    assert torch.allclose(out, expected, atol=1e-12)
    assert data["atom_h"].x.shape == (60, 2)  # features(charge, mass), as the model's SQL encoded them
    atoms, heads = data["atom_h"].node_keys["atom_id"].to_list(), data["nb"].node_keys["atom_id"].to_list()
    bonds = set(db.con.execute("SELECT src, dst FROM bond").fetchall())
    assert {(heads[d], atoms[s]) for s, d in edges.T.tolist()} == bonds
    labelled = data["predict"].train_mask | data["predict"].val_mask | data["predict"].test_mask
    assert int(labelled.sum()) == len(model.labelled) and not bool((data["predict"].train_mask & data["predict"].val_mask).any())


def test_a_mini_batch_model_exports_the_whole_grounding_as_full_batch_does():
    full = to_heterodata(relsql.Model(molecules(), relsql.Template.from_sql(TEMPLATE), "atom.label", dtype=torch.float64))
    batched = to_heterodata(relsql.Model(molecules(), relsql.Template.from_sql(TEMPLATE), "atom.label", dtype=torch.float64,
                                         batch_size=7))
    assert set(full.edge_types) == set(batched.edge_types)
    for edge_type in full.edge_types:
        assert torch.equal(full[edge_type].edge_index, batched[edge_type].edge_index)
    assert torch.equal(full["atom_h"].x, batched["atom_h"].x)


def test_to_hetero_converts_a_gnn_on_the_exported_grounding_as_it_is():
    from torch_geometric.nn import SAGEConv, to_hetero

    data = to_heterodata(relsql.Model(molecules(), relsql.Template.from_sql(TEMPLATE), "atom.label"))
    forward = data["atom_h", "rule0_body0", "nb"]
    assert torch.equal(data["nb", "rev_rule0_body0", "atom_h"].edge_index, forward.edge_index.flip(0))
    assert torch.equal(data["nb", "rev_rule0_body0", "atom_h"].edge_attr, forward.edge_attr) if "edge_attr" in forward \
        else "edge_attr" not in data["nb", "rev_rule0_body0", "atom_h"]

    class Sage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = SAGEConv((-1, -1), 8), SAGEConv((-1, -1), 1)

        def forward(self, x, edge_index):
            return self.second(self.first(x, edge_index).relu(), edge_index)

    net = to_hetero(Sage(), data.metadata())  # every relation receives messages: no ToUndirected needed
    x = {t: data[t].x.float() if "x" in data[t] else torch.ones(data[t].num_nodes, 1) for t in data.node_types}
    out = net(x, data.edge_index_dict)
    assert {t: tuple(v.shape) for t, v in out.items()} == {t: (data[t].num_nodes, 1) for t in data.node_types}


def test_anything_else_is_refused():
    with pytest.raises(relsql.RelsqlError, match="to_heterodata takes"):
        to_heterodata(42)
    with pytest.raises(relsql.RelsqlError, match="keys=, time_columns=, tables=, stypes= and text_embedder="):
        to_heterodata(relsql.Model(molecules(), relsql.Template.from_sql(TEMPLATE), "atom.label"), time_columns={"atom": "x"})
