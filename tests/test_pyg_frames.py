"""to_heterodata(db) for RelBench's own modules: its TensorFrames equal those RelBench's
make_pkey_fkey_graph builds from the same tables, RelBench's HeteroEncoder + HeteroGraphSAGE
train on the export unchanged, and a task table's labels never become node features."""

from __future__ import annotations

import importlib

import numpy as np
import pandas as pd
import pytest
import torch

import relsql
from relsql.export import to_heterodata

relbench_base = importlib.import_module("relbench.base")
relbench_graph = importlib.import_module("relbench.modeling.graph")
relbench_nn = importlib.import_module("relbench.modeling.nn")
torch_frame = importlib.import_module("torch_frame")

pytestmark = pytest.mark.oracle


class Churn(relbench_base.EntityTask):
    """Does a user stay silent in the next 7 days?"""

    task_type = relbench_base.TaskType.BINARY_CLASSIFICATION
    entity_col, entity_table, time_col, target_col = "user_id", "users", "at", "churn"
    timedelta = pd.Timedelta(days=7)
    metrics = []

    def make_table(self, db, timestamps):
        posts, users = db.table_dict["posts"].df, db.table_dict["users"].df
        frames = []
        for t in timestamps:
            window = posts[(posts["at"] > t) & (posts["at"] <= t + self.timedelta)]
            active = set(window["user_id"].dropna().astype(int))
            frames.append(pd.DataFrame({"at": t, "user_id": users["user_id"],
                                        "churn": (~users["user_id"].isin(active)).astype(int)}))
        return relbench_base.Table(pd.concat(frames, ignore_index=True), {"user_id": "users"}, None, "at")


class Forum(relbench_base.Dataset):
    val_timestamp, test_timestamp = pd.Timestamp("2021-03-01"), pd.Timestamp("2021-04-01")

    def make_db(self):
        rng = np.random.default_rng(3)
        users = pd.DataFrame({"user_id": np.arange(40), "age": rng.integers(18, 80, 40).astype(float),
                              "country": rng.choice(["fr", "de", "it"], 40),
                              "bio": [f"user number {i} likes {w}" for i, w in enumerate(rng.choice(["a", "b"], 40))],
                              "joined": pd.date_range("2020-01-01", periods=40, freq="5D")})
        posts = pd.DataFrame({"post_id": np.arange(300), "user_id": rng.integers(0, 40, 300).astype(float),
                              "length": rng.uniform(1, 500, 300), "pinned": rng.uniform(0, 1, 300) < 0.2,
                              "at": pd.Timestamp("2021-01-01") + pd.to_timedelta(rng.integers(0, 150, 300), "D")})
        return relbench_base.Database({"users": relbench_base.Table(users, {}, "user_id", None),
                                       "posts": relbench_base.Table(posts.sort_values("at", ignore_index=True)
                                                                    .assign(post_id=np.arange(300)),
                                                                    {"user_id": "users"}, "post_id", "at")})


@pytest.fixture(scope="module")
def forum():
    dataset = Forum()
    database = dataset.get_db()
    return database, relsql.relbench.from_relbench(database, tasks={"user_churn": Churn(dataset)})


def test_a_task_tables_labels_are_never_node_features(forum):
    _, db = forum
    data = to_heterodata(db)
    task = data["user_churn"]
    assert "x" not in task and "feature_names" not in task
    assert task.tf.col_names_dict == {torch_frame.stype.numerical: ["__const__"]}
    assert task.time.shape[0] == task.num_nodes  # time kept
    assert ("user_churn", "f2p_user_id", "users") in data.edge_types  # keys kept as edges
    users = data["users"]
    stypes = {s.value: names for s, names in users.tf.col_names_dict.items()}
    assert stypes == {"numerical": ["age"], "categorical": ["country"], "timestamp": ["joined"]}
    assert users.dropped_columns == ["bio"]  # free text without an embedder


def test_tensor_frames_equal_relbenchs_for_the_same_column_types(forum):
    database, db = forum
    ours = to_heterodata(db, tables=["users", "posts"])
    stypes = {table: {c: s for s, names in ours[table].tf.col_names_dict.items() for c in names}
              for table in ("users", "posts")}
    theirs, stats = relbench_graph.make_pkey_fkey_graph(database, {t: dict(s) for t, s in stypes.items()})
    for table in ("users", "posts"):
        mine, reference = ours[table].tf, theirs[table].tf
        assert mine.col_names_dict == reference.col_names_dict, table
        for kind in reference.feat_dict:
            assert torch.equal(torch.nan_to_num(mine.feat_dict[kind].float(), nan=-7.0),
                               torch.nan_to_num(reference.feat_dict[kind].float(), nan=-7.0)), (table, kind)
        assert set(ours[table].col_stats) == set(stats[table])
        for column, values in stats[table].items():
            assert str(ours[table].col_stats[column]) == str(values), (table, column)
    assert stypes["posts"][("pinned")] == torch_frame.stype.categorical
    assert set(theirs.edge_types) == set(ours.edge_types)


def test_relbench_encoder_and_graphsage_train_on_the_export(forum):
    _, db = forum
    data = to_heterodata(db, tables=["users", "posts"])
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny graph: more threads only wait on each other
    channels = 16
    encoder = relbench_nn.HeteroEncoder(channels, {t: data[t].tf.col_names_dict for t in data.node_types},
                                        {t: data[t].col_stats for t in data.node_types})
    gnn = relbench_nn.HeteroGraphSAGE(data.node_types, data.edge_types, channels)
    head = torch.nn.Linear(channels, 1)
    # a label two tables away: a user's number of long posts
    posts = db.con.execute('SELECT user_id, count(*) FILTER (WHERE length > 250) AS n FROM "posts" GROUP BY 1').df()
    target = torch.zeros(data["users"].num_nodes)
    order = {int(k): i for i, k in enumerate(data["users"].node_keys.to_series(0))}
    for user, n in zip(posts["user_id"], posts["n"]):
        target[order[int(user)]] = float(n)
    target = (target - target.mean()) / target.std()
    params = [*encoder.parameters(), *gnn.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=0.01)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        x = encoder({t: data[t].tf for t in data.node_types})
        out = head(gnn(x, data.edge_index_dict)["users"]).squeeze(-1)
        loss = torch.nn.functional.mse_loss(out, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch.set_num_threads(threads)
    assert losses[-1] < 0.7 * losses[0]


def test_stypes_are_checked():
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v DOUBLE, s VARCHAR)")
    con.execute("INSERT INTO t VALUES (1, 0.5, 'a'), (2, 1.5, 'b'), (3, 2.5, 'a'), (4, 0.5, 'b')")
    db = relsql.connect(con)
    data = to_heterodata(db, stypes={"t": {"v": "categorical"}})
    assert sorted(data["t"].tf.col_names_dict[torch_frame.stype.categorical]) == ["s", "v"]
    with pytest.raises(relsql.RelsqlError, match="no PyTorch Frame stype"):
        to_heterodata(db, stypes={"t": {"v": "numbers"}})
    with pytest.raises(relsql.RelsqlError, match="not exported"):
        to_heterodata(db, stypes={"u": {"v": "numerical"}})
