"""relsql vs PyNeuraLogic 0.9.2 on the datasets and templates shipped with neuralogic.

    python -m bench.neuralogic [--quick] [--datasets ...] [--out out/bench] [--reps 3] [--no-memory]

Datasets (``--datasets``, default: every one that runs on both sides): Mutagenesis, every
template at the shipped width (3) and with every weight dimension widened to 32; XOR,
XOR_Vectorized, Family, Trains and Nations with their own template at its shipped dimensions
(column ``width`` = shipped), and the hand-set ``simple/xor/solution``. The wheel's recursive
``simple/xor/generalized`` needs a recursion depth, which its text does not declare: a full
run tries its build on both sides and prints why (``NOT_RUN``); tests/test_recursion.py runs it
with a depth against PyNeuraLogic. The rest below says "the 188 molecules"; the other datasets are timed
the same way over their own samples. For every row:

* build: PyNeuraLogic = ``Model(model_file).build(settings)`` + ``build_dataset`` on the 188
  molecules (JVM already started and warm; the one-time JVM start is reported separately);
  relsql = ``Template.from_datalog`` + ``relsql.compile`` (grounding + plan + module) on a DuckDB
  that already holds the examples (the DuckDB import is reported separately);
* epoch: PyNeuraLogic = ``built.train(dataset)`` (one epoch: its SGD over all samples, one step
  per sample); relsql = one full-batch forward + backward + SGD step of Σ(o − t)² over the 188
  queries, in float64 (the ratio's reference: NeuraLogic computes in Java doubles) and float32.
  Where NeuraLogic's backward pass fails (template_product: matrix-valued atoms) both sides are
  timed on a forward pass over all samples instead (column ``epoch_kind`` = forward);
* identical numbers: before any timing the relsql float64 weights are copied into NeuraLogic
  (by weight index, as tests/oracles/compare.py does) and every query output must agree within
  1e-6; the max |Δ| is recorded;
* memory: peak RSS (VmHWM) of a fresh subprocess per side that builds and runs one epoch
  (PyNeuraLogic's includes the in-process JVM through JPype; relsql's includes DuckDB + import);
  the two sides' subprocesses run side by side, after the timings.

Times are medians over ``--reps`` repetitions after one warm-up; an epoch repetition is the
mean of 10 epochs in a row on either side. ``--quick`` (a check that the bench runs and that the
numbers are identical, not a measurement) times each side's first build (no warm-up) and one
epoch per repetition, on Mutagenesis' template.txt only. NeuraLogic is timed in this
process, relsql in a fresh process without a JVM (the JVM's JIT and GC threads go on working
after its calls and slowed whatever ran next on these 2 cores: relsql builds measured 0.15 s
alone and 0.3–0.8 s right after a NeuraLogic build); the two sides' epoch repetitions alternate
(relsql's after a 0.3 s pause), so load from other processes reaches both medians alike
(column ``load_avg``: the 1-minute load average over the repetitions). Each side's process CPU
time per epoch is recorded too (``×f64 cpu``; NeuraLogic's includes its JVM's threads): on a
shared machine it moves far less with the load than wall time does.
NeuraLogic settings (``--nl-settings iso``, the default): its defaults (iso-value compression on,
Glorot init) except optimizer SGD(lr=1e-9) and MSE(reduction="sum"), the same step relsql takes,
and chain_pruning=False: chain pruning changes NeuraLogic's outputs (max |Δ| 0.13 on
template.txt with the same weights), so no identical numbers with it. ``--nl-settings oracle``
also switches iso-value compression off, exactly as the oracle tests do.
Results: a printed table, ``neuralogic.csv`` and ``neuralogic.png`` in ``--out``.

relsql's epoch is the fastest of three ways to take the step, timed on the data before the
repetitions (relsql/compile/step.py ``choose``, which puts the weights back): the regular path
(``net()``, torch's squared error, autograd, torch.optim), a FusedStep of the plan fused as
``net()`` runs it (one generated forward and backward, the squared error's gradient and the SGD
update on a flat buffer, no autograd or torch.optim), or a FusedStep of the plan fused whatever
its size. The float64 epoch is also timed op by op (``CompiledNet.execution = "ops"``) and fused
through autograd (``"fused"``, where every op has a fused rule), alternated with it in the same
process: columns ``f64 op-by-op ms``, ``×f64 op-by-op``, ``×f64 autograd``; ``relsql_execution``
in the CSV says which way the epoch ran (or why the plan does not fuse). On a shared machine
run it with ``OMP_WAIT_POLICY=PASSIVE``: torch's spinning OpenMP threads made Nations' epoch
34-243 ms with 2 threads at load 6 (7-10 ms with 1 thread, 11 ms with 2 passive ones).
A full run ends with the fixed cost per op, forward and backward, op by op and fused, measured
on chains of ``tanh(w * h)`` over 4 x 1 values (``--per-op`` prints only that); ``--threads``
sets the relsql side's torch threads (default 2).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace

from bench import peak_rss_mib, write_csv

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TEMPLATES = (
    "template.txt",
    "template_gnn.txt",
    "template_crosssum.txt",
    "template_elementProduct.txt",
    "template_graphlets.txt",
    "template_product.txt",
    "template_partial.txt",
)
WIDTHS = (3, 32)  # Mutagenesis only; the other datasets keep their template's dimensions
SHIPPED = "shipped"  # the width column of the other datasets' rows
DATASETS: dict[str, tuple[str, ...]] = {  # dataset -> its template files benchmarked
    "mutagenesis": TEMPLATES,
    "xor": ("template.txt",),
    "xor_vectorized": ("template.txt",),
    "family": ("template.txt",),
    "trains": ("template.txt",),
    "nations": ("template.txt",),
    "xor_solution": ("template.txt",),
}
QUICK_DATASETS = ("mutagenesis",)  # XOR would add its three fresh processes: ~10 s idle, 88 s at load 8
EXTRA = {  # templates in the wheel with no loader in relsql.datasets.neuralogic_files: (folder, examples)
    "xor_generalized": ("simple/xor/generalized", "examples.txt"),
    "xor_solution": ("simple/xor/solution", "testExamples.txt"),
}
NOT_RUN = ("xor_generalized",)  # tried (builds only) in full runs to print why they do not run
TOL = 1e-6
EPOCH_LOOPS = 10  # epochs per timed repetition, on both sides
SETTLE_S = 0.3  # pause after NeuraLogic's epochs before relsql's (its JVM threads settle)
LR = 1e-9  # timing does not depend on it; tiny so that no template diverges (identity-activation GNNs at width 32 do at 1e-4)
TARGETS = {"build": 10.0, "epoch@3": 1.0, "epoch@32": 20.0}

COLUMNS = (
    "dataset", "template", "width", "epoch_kind",
    "nl_build_s", "relsql_build_s", "build_ratio", "build_ratio_incl_import",
    "nl_epoch_ms", "relsql_epoch_ms_f64", "relsql_epoch_ms_f32", "epoch_ratio_f64", "epoch_ratio_f32",
    "relsql_epoch_ms_f64_ops", "epoch_ratio_f64_ops", "relsql_epoch_ms_f64_autograd", "epoch_ratio_f64_autograd",
    "relsql_execution",
    "max_abs_dev", "n_outputs", "nl_peak_rss_mib", "relsql_peak_rss_mib",
    "relsql_import_s", "jvm_start_s", "nl_settings", "reps", "load_avg",
    "nl_epoch_cpu_ms", "relsql_epoch_cpu_ms_f64", "epoch_ratio_cpu_f64", "note",
)


# --------------------------------------------------------------------------- templates


def widen(text: str, width: int | str) -> str:
    """Every weight/offset dimension > 1 in `{..}` becomes `width` ({3,3}→{w,w}, {3,1}→{w,1}, {1,4}→{1,w})."""
    if width in (3, SHIPPED):
        return text

    def dims(m: re.Match) -> str:
        parts = [p.strip() for p in m.group(1).split(",")]
        return "{" + ",".join(str(width) if int(p) > 1 else p for p in parts) + "}"

    return re.sub(r"\{\s*(\d+(?:\s*,\s*\d+)*)\s*\}", dims, text)


def skip_reason(name: str, width: int | str) -> str | None:
    if name == "template_crosssum.txt" and width != 3:
        return f"crosssum's {{1,243}} = 3^5 would become {{1,{width}^5}} = {width**5:,} columns: skipped"
    return None


def dataset_files(name: str) -> SimpleNamespace:
    """A shipped dataset's files (nothing imported): name, template, templates (copied with it), examples, queries."""
    from relsql.datasets.neuralogic_files import BUILTIN_DATASETS, builtin_dataset_root

    root = builtin_dataset_root()
    if name in EXTRA:
        folder, examples = EXTRA[name]
        template, extra, examples_path, queries = root / folder / "template.txt", [], root / folder / examples, None
    else:
        spec = BUILTIN_DATASETS[name]
        template, examples_path = root / spec.template, root / spec.examples
        queries = root / spec.queries if spec.queries else None
        extra = [root / p for p in spec.extra_templates]
        if spec.template_dir:
            extra += sorted(p for p in (root / spec.template_dir).glob("*.txt") if p != template)
    return SimpleNamespace(name=name, template=template, templates=(template, *extra), examples=examples_path,
                           queries=queries)


def load_dataset(con, name: str) -> SimpleNamespace:
    """`dataset_files` imported into `con`, with its tables, query heads and NeuraLogic's sample count."""
    from relsql.datasets.neuralogic_files import import_files

    ds = dataset_files(name)
    ds.tables = import_files(con, ds.examples, ds.queries)
    ds.heads = tuple(t.removeprefix("query_") for t in ds.tables if t.startswith("query_"))
    # samples as NeuraLogic numbers them: one example statement = one sample shared by every query
    ds.n_examples = sum(1 for ln in ds.examples.read_text().splitlines() if ln.strip().endswith("."))
    return ds


def write_template_dir(ds: SimpleNamespace, name: str, width: int | str, dest: Path) -> tuple[str, Path]:
    """Widened copies of the dataset's template files in `dest`; returns (template text, path for NeuraLogic)."""
    from tests.oracles.compare import oracle_text

    dest.mkdir(parents=True, exist_ok=True)
    for p in ds.templates:  # all in one folder: `import ./x` resolves beside the template
        (dest / p.name).write_text(widen(p.read_text(), width))
    text = (dest / name).read_text()
    if name == "template_partial.txt":  # it leaves atom/bond embeddings to another file
        text = "import ./embeddings.txt\n" + text
    nl_path = dest / f"__nl__{name}"
    nl_path.write_text(oracle_text(text) + "\n")
    return text, nl_path


# --------------------------------------------------------------------------- the two sides


def _quiet_java() -> float:
    """Start the JVM (once per process, log off); returns the seconds it took (0 if already up)."""
    import neuralogic

    from tests.oracles import neuralogic_oracle as oracle

    t = time.perf_counter()
    already = neuralogic.is_initialized()
    oracle._init()
    return 0.0 if already else time.perf_counter() - t


def nl_settings(kind: str):
    from neuralogic.core import Settings
    from neuralogic.nn.loss import MSE
    from neuralogic.nn.optim import SGD

    iso = kind == "iso"  # chain pruning changes the outputs: always off
    return Settings(optimizer=SGD(lr=LR), error_function=MSE(reduction="sum"), iso_value_compression=iso,
                    chain_pruning=False, prune_only_identities=False)


class NeuraLogicSide:
    def __init__(self, template_path: Path, examples: Path, queries: Path | None, settings_kind: str):
        self.template_path, self.examples, self.queries = template_path, examples, queries
        self.settings_kind = settings_kind
        self.model = self.dataset = None

    def build(self):
        import neuralogic
        from neuralogic.core.model import Model
        from neuralogic.dataset import FileDataset

        neuralogic.manual_seed(0)
        model = Model(model_file=str(self.template_path)).build(nl_settings(self.settings_kind))
        queries = str(self.queries) if self.queries else None  # None: XOR's format, one sample per example line
        dataset = model.build_dataset(FileDataset(examples_file=str(self.examples), queries_file=queries))
        self.model, self.dataset = model, dataset

    def set_weights(self, weights) -> None:
        from tests.oracles import neuralogic_oracle as oracle

        _, shapes, _, _ = oracle.get_weights(self.model)
        for i, w in weights.items():
            assert i in shapes and (shapes[i] == () or int(_prod(shapes[i])) == w.size), (i, shapes.get(i), w.shape)
        oracle.set_weights(self.model, weights)
        self.initial = weights

    def reset(self):
        from tests.oracles import neuralogic_oracle as oracle

        oracle.set_weights(self.model, self.initial)

    def outputs(self, n_examples: int):
        from tests.oracles import neuralogic_oracle as oracle

        ws = SimpleNamespace(model=self.model, dataset=self.dataset, examples=[None] * n_examples,
                             queries=[] if self.queries else None)
        return oracle._outputs(ws)

    def epoch(self):
        self.model.train(self.dataset)

    def forward(self):
        self.model(self.dataset)


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class RelsqlSide:
    def __init__(self, db, text: str, template_dir: Path, dtype, heads: tuple[str, ...] = ("predict",)):
        self.db, self.text, self.template_dir, self.dtype, self.heads = db, text, template_dir, dtype, heads
        self.tpl = self.net = self.opt = self.targets = None

    def build(self):
        import relsql

        tpl = relsql.Template.from_datalog(self.text, base_dir=str(self.template_dir))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = relsql.compile(tpl, self.db, dtype=self.dtype, seed=7, outputs=list(self.heads))
        self.tpl, self.net = tpl, net

    def prepare(self, like: RelsqlSide | None = None):
        """Targets aligned with the output rows, the optimizer; optionally copy weights from `like`."""
        import torch

        from tests.oracles.compare import keyed_values

        if like is not None:
            theirs = like.net.named_weights()
            with torch.no_grad():
                for name, p in self.net.named_weights().items():
                    p.copy_(theirs[name].to(p.dtype))
        outs = self.net()
        self.rows, self.targets = {}, {}
        for head in self.heads:
            rows = {k: i for i, k in enumerate(keyed_values(self.net, head))}
            out = outs[head]
            target = torch.zeros_like(out)
            mask = torch.zeros(out.shape[0], dtype=torch.bool)
            for t in self.db.arrow(f'SELECT * FROM "query_{head}" ORDER BY ordinal').to_pylist():
                key = (t["sample"], *[t[f"a{i}"] for i in range(len(t) - 3)])
                target[rows[key]] = torch.as_tensor(t["target"], dtype=out.dtype).reshape(target[rows[key]].shape)
                mask[rows[key]] = True
            sel = None if bool(mask.all()) else torch.nonzero(mask).reshape(-1)  # queries without a target left out
            self.rows[head] = sel
            self.targets[head] = target if sel is None else target.index_select(0, sel)
        self.opt = torch.optim.SGD([p for p in self.net.parameters() if p.requires_grad], lr=LR, foreach=True)
        self.initial = {n: p.detach().clone() for n, p in self.net.named_weights().items()}
        self.step = None

    def use_fused_step(self) -> str:
        """Epochs as relsql/compile/step.py's FusedStep (no autograd, no torch.optim: the same SGD
        update on a flat buffer) where `choose` measures it faster than the regular path;
        returns what the epoch runs."""
        from relsql.compile.step import RegularStep, SquaredError, choose

        self.step = choose(self.net, self.opt, SquaredError(self.targets, self.rows))
        self.net()
        if isinstance(self.step, RegularStep):
            return f"ops on {self.step.threads} thread ({self.net.fused_reason or 'fastest'})"
        if self.step is not None:
            on = " on 1 thread" if self.step.threads == 1 else ""
            return f"fused step{on}" if self.net.fused_reason is None else f"fused step{on} (fused whatever the size)"
        return "fused" if self.net.fused_reason is None else f"ops ({self.net.fused_reason})"

    def reset(self):
        import torch

        with torch.no_grad():
            for n, p in self.net.named_weights().items():
                p.copy_(self.initial[n])

    def epoch(self):
        import torch

        if self.step is not None and self.net.execution == "auto":
            self.step.step()
            return
        outs = self.net()
        loss = 0.0
        for head in self.heads:
            out, sel = outs[head], self.rows[head]
            if sel is not None:
                out = out.index_select(0, sel)
            loss = loss + torch.nn.functional.mse_loss(out, self.targets[head], reduction="sum")  # Σ(o − t)², one op
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def forward(self):
        import torch

        with torch.no_grad():
            self.net()


def check_identical(rel: RelsqlSide, nl: NeuraLogicSide, n_examples: int) -> tuple[float, int]:
    """Copy relsql's float64 weights into NeuraLogic; max |Δ| over every query output."""
    import numpy as np

    from tests.oracles.compare import keyed_values, relsql_weights

    nl.set_weights(relsql_weights(rel.tpl, rel.net))
    ours = {}  # (predicate, arity) -> keyed values; relsql names a head `p/2` where `p` has two arities
    for head in rel.heads:
        values = keyed_values(rel.net, head)
        ours[(head.split("/")[0], len(next(iter(values), (0,))) - 1)] = values
    worst = 0.0
    outs = nl.outputs(n_examples)
    for out in outs:
        args = tuple(a.strip() for a in out.query[out.query.index("(") + 1:-1].split(",")) if "(" in out.query else ()
        key = (out.sample, *args)
        values = ours.get((out.query.split("(")[0].strip(), len(args)), {})
        if key not in values:
            raise AssertionError(f"{out.query} of sample {out.sample} has no value in relsql")
        worst = max(worst, float(np.abs(values[key].reshape(-1) - out.value.reshape(-1)).max()))
    return worst, len(outs)


def _timed_cpu(fn, reset=None, loops: int = 1) -> tuple[float, float]:
    """(wall, CPU) seconds per call of `fn`, as `_timed`; CPU is the whole process's (the JVM's
    JIT and GC threads count for NeuraLogic), which other processes' load barely moves."""
    if reset is not None:
        reset()
    gc.collect()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - t) / loops, (time.process_time() - c) / loops


def _timed(fn, reset=None, loops: int = 1) -> float:
    """Seconds per call of `fn`, over `loops` calls in a row (timeit-style: a millisecond epoch
    timed alone is mostly timer and cache noise)."""
    if reset is not None:
        reset()
    gc.collect()
    t = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - t) / loops


# --------------------------------------------------------------------------- one configuration


def run_config(name: str, width: int | str, db, dataset, work: Path, reps: int, settings_kind: str,
               memory: bool, import_s: float, jvm_s: float, warm: bool = True, loops: int = EPOCH_LOOPS,
               threads: int = 2) -> dict:
    """One template at one width; `warm` False (--quick): the first builds are the timed ones, and
    `loops` epochs make an epoch repetition."""
    import torch

    row = {c: "" for c in COLUMNS}
    row.update(dataset=dataset.name, template=name, width=width, nl_settings=settings_kind, reps=reps,
               relsql_import_s=f"{import_s:.4f}", jvm_start_s=f"{jvm_s:.3f}")
    reason = skip_reason(name, width)
    if reason:
        row["note"] = reason
        return row
    tdir = work / f"{dataset.name}_{Path(name).stem}_w{width}"
    text, nl_path = write_template_dir(dataset, name, width, tdir)
    rel = RelsqlSide(db, text, tdir, torch.float64, dataset.heads)
    nl = NeuraLogicSide(nl_path, dataset.examples, dataset.queries, settings_kind)
    rel.build()
    first_nl_build = _timed(nl.build)

    # identical numbers before any timing (fresh float64 weights into NeuraLogic)
    dev, n_out = check_identical(rel, nl, dataset.n_examples)
    row.update(max_abs_dev=f"{dev:.3e}", n_outputs=n_out)

    kind = "train"
    try:
        nl.epoch()  # warm-up; NeuraLogic's backward pass fails on some templates
    except Exception as e:  # noqa: BLE001 - the Java exception type is not importable here
        if "NaN" in str(e):
            raise
        kind = "forward"
        row["note"] = f"NeuraLogic backward fails ({str(e).splitlines()[0][:90]}); forward pass timed on both sides"
        nl.forward()

    # NeuraLogic here, then relsql back to back in a fresh process: the JVM's JIT and GC threads
    # keep running after its calls and would slow whatever runs next on these 2 cores
    nb = [_timed(nl.build) for _ in range(reps)] if warm else [first_nl_build] + [_timed(nl.build) for _ in range(reps - 1)]
    epoch = nl.epoch if kind == "train" else nl.forward
    ne, ours = _interleaved(epoch, nl.reset, RelsqlWorker(dataset.name, name, width, kind, reps, work, warm, loops, threads),
                            reps, loops)
    bmed_r, bmed_n, nl_epoch = ours["build_s"], statistics.median(nb), statistics.median(ne)
    row.update(
        epoch_kind=kind,
        nl_build_s=f"{bmed_n:.4f}", relsql_build_s=f"{bmed_r:.4f}",
        build_ratio=f"{bmed_n / bmed_r:.2f}", build_ratio_incl_import=f"{bmed_n / (bmed_r + import_s):.2f}",
        nl_epoch_ms=f"{nl_epoch * 1e3:.2f}", relsql_epoch_ms_f64=f"{ours['f64'] * 1e3:.2f}",
        relsql_epoch_ms_f32=f"{ours['f32'] * 1e3:.2f}",
        epoch_ratio_f64=f"{nl_epoch / ours['f64']:.2f}", epoch_ratio_f32=f"{nl_epoch / ours['f32']:.2f}",
        relsql_epoch_ms_f64_ops=f"{ours['f64_ops'] * 1e3:.2f}", epoch_ratio_f64_ops=f"{nl_epoch / ours['f64_ops']:.2f}",
        relsql_execution=ours["execution"], load_avg=ours["load_avg"],
        **({"relsql_epoch_ms_f64_autograd": f"{ours['f64_autograd'] * 1e3:.2f}",
            "epoch_ratio_f64_autograd": f"{nl_epoch / ours['f64_autograd']:.2f}"} if "f64_autograd" in ours else {}),
        nl_epoch_cpu_ms=f"{ours['nl_cpu'] * 1e3:.2f}", relsql_epoch_cpu_ms_f64=f"{ours['f64_cpu'] * 1e3:.2f}",
        epoch_ratio_cpu_f64=f"{ours['nl_cpu'] / ours['f64_cpu']:.2f}",
    )
    del rel, nl
    gc.collect()
    if memory:  # side by side: each its own process, their peak RSS is their own
        probes = {side: _memory_subprocess(side, dataset.name, name, width, kind, settings_kind, work)
                  for side in ("neuralogic", "relsql")}
        for side, probe in probes.items():
            row[f"{'nl' if side == 'neuralogic' else 'relsql'}_peak_rss_mib"] = _memory_result(side, name, width, *probe)
    return row


def why_not_run(dsname: str) -> str:
    """Both sides' build of a dataset's template, each side's first error (or "builds")."""
    import torch

    import relsql

    db = relsql.connect()
    ds = load_dataset(db.con, dsname)
    with tempfile.TemporaryDirectory(prefix="relsql_bench_nr_") as tmp:
        text, nl_path = write_template_dir(ds, "template.txt", SHIPPED, Path(tmp))
        sides = {"relsql": RelsqlSide(db, text, Path(tmp), torch.float64, ds.heads).build,
                 "NeuraLogic": NeuraLogicSide(nl_path, ds.examples, ds.queries, "iso").build}
        said = []
        for side, build in sides.items():
            try:
                build()
                said.append(f"{side} builds")
            except Exception as e:  # noqa: BLE001 - the reason is the result
                said.append(f"{side}: {type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e) else ''}")
    db.close()
    return "; ".join(said)


# --------------------------------------------------------------------------- the fixed cost per op


def chain_net(links: int, rows: int = 4, weights: int | None = None):
    """A CompiledNet of `links` links `h = tanh(w_i * h)` over a (rows, 1) column: NeuraLogic's
    small templates in their simplest form, 2 ops a link, every tensor tiny. `weights`: how many
    distinct scalar weights the links cycle through (default one per link)."""
    import torch

    from relsql.compile.module import CompiledNet
    from relsql.compile.plan import Op, ParamSpec, Plan, make_op

    plan = Plan()
    h = plan.add_input(torch.linspace(-1, 1, rows, dtype=torch.float64).reshape(rows, 1))
    slots: dict[str, int] = {}
    for i in range(links):
        name = f"w{i % (weights or links)}"
        if name not in slots:
            plan.params[name] = ParamSpec(name, (1,), "datalog", 0.5, False)
            slots[name] = plan.new_slot()
            plan.meta[slots[name]] = torch.empty((1,), dtype=torch.float64, device="meta")
            plan.param_slots.add(slots[name])
            plan.ops.append(Op("param", slots[name], (), {"name": name}, rows=1, shape=(1,)))
        w = slots[name]
        for kind, args, attrs in (("linear", (w, h), {}), ("act", None, {"name": "tanh"})):
            op = make_op(plan, kind, args or (h,), f"link {i}", **attrs)
            plan.ops.append(op)
            h = op.out
    plan.outputs["out"] = h
    return CompiledNet(plan, None, dtype=torch.float64)


def per_op_cost(execution: str, weights: int | None = None, short: int = 10, long: int = 60,
                reps: int = 7) -> tuple[float, float]:
    """Microseconds per op, forward and backward: the slope between a short and a long chain (the
    fixed cost of a call and of the backward engine cancels), median over `reps` rounds.
    `weights` as in chain_net (None: a weight per link, so each op also carries half a weight's
    autograd leaf; 1: one shared weight, the ops' own cost)."""
    nets = {n: chain_net(n, weights=weights) for n in (short, long)}
    fwd, bwd = [], []
    for _ in range(reps):
        got = {}
        for n, net in nets.items():
            net.execution = execution
            got[n] = _forward_backward(net)
        ops = 2 * (long - short)
        fwd.append((got[long][0] - got[short][0]) / ops * 1e6)
        bwd.append((got[long][1] - got[short][1]) / ops * 1e6)
    return statistics.median(fwd), statistics.median(bwd)


def _forward_backward(net, loops: int = 200) -> tuple[float, float]:
    """Seconds of one forward and of one backward (of the output's sum), each the mean of `loops`;
    gradients are reset to None before each step, as a training step's zero_grad does."""
    weights = list(net.parameters())
    for _ in range(20):
        net()["out"].sum().backward()
    forward = backward = 0.0
    for _ in range(loops):
        for w in weights:
            w.grad = None
        t = time.perf_counter()
        loss = net()["out"].sum()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        forward, backward = forward + t1 - t, backward + t2 - t1
    return forward / loops, backward / loops


def per_op_step(weights: int | None = None, short: int = 10, long: int = 60, reps: int = 7, loops: int = 200) -> float:
    """Microseconds per op of a whole FusedStep (forward, loss gradient, backward, SGD update),
    the slope between a short and a long chain as in per_op_cost, median over `reps` rounds."""
    import torch

    from relsql.compile.step import FusedStep, SquaredError

    steps = {}
    for n in (short, long):
        net = chain_net(n, weights=weights)
        out = net()["out"]
        opt = torch.optim.SGD(list(net.parameters()), lr=LR)
        steps[n] = FusedStep.build(net, opt, SquaredError({"out": torch.zeros_like(out)}, {"out": None}))
        for _ in range(20):
            steps[n].step()
    slopes = []
    for _ in range(reps):
        got = {}
        for n, step in steps.items():
            t = time.perf_counter()
            for _ in range(loops):
                step.step()
            got[n] = (time.perf_counter() - t) / loops
        slopes.append((got[long] - got[short]) / (2 * (long - short)) * 1e6)
    return statistics.median(slopes)


def print_per_op(threads: int) -> None:
    """The fixed cost per op op by op (the interpreter) and fused, alternated in this process, twice."""
    import torch

    torch.set_num_threads(threads)
    print(f"fixed cost per op (chains of tanh(w * h) on 4 x 1 values, float64, {threads} thread(s)), us:")
    for round_ in (1, 2):
        for weights, what in ((1, "one shared weight"), (None, "a weight per link")):
            ops = per_op_cost("ops", weights)
            fused = per_op_cost("fused", weights)
            step = per_op_step(weights)
            print(f"  round {round_}, {what}: op by op fwd {ops[0]:.2f} + bwd {ops[1]:.2f} = {sum(ops):.2f};  fused fwd "
                  f"{fused[0]:.2f} + bwd {fused[1]:.2f} = {sum(fused):.2f} (×{sum(ops) / sum(fused):.2f});  fused step "
                  f"(fwd + bwd + SGD) {step:.2f} (×{sum(ops) / step:.2f});  load {os.getloadavg()[0]:.1f}", flush=True)


# --------------------------------------------------------------------------- relsql timings (fresh process)


class RelsqlWorker:
    """relsql's side in a fresh process without a JVM (`--time-relsql`), timing one repetition of
    its epochs each time it is asked: the two sides' repetitions alternate, so a change of the
    machine's load (shared cores) reaches both sides' medians alike."""

    def __init__(self, dsname: str, name: str, width: int | str, kind: str, reps: int, work: Path, warm: bool = True,
                 loops: int = EPOCH_LOOPS, threads: int = 2):
        cmd = [sys.executable, "-m", "bench.neuralogic", "--time-relsql", "--probe-dataset", dsname, "--probe-template", name,
               "--probe-width", str(width), "--probe-kind", kind, "--reps", str(reps), "--loops", str(loops),
               "--threads", str(threads), *([] if warm else ["--no-warmup"])]
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.what = f"relsql timing of {name} w{width}"
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True)
        self.ready = self._answer()  # build times, execution: the process is built and warm

    def _answer(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        self.proc.wait()
        self.err.seek(0)
        raise RuntimeError(f"{self.what} failed:\n{self.err.read()[-2000:]}")

    def rep(self, i: int) -> dict:
        """One repetition: seconds per epoch of each variant (f64, f32, f64 op by op)."""
        self.proc.stdin.write(f"{i}\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        self.err.close()


def _interleaved(epoch, reset, worker: RelsqlWorker, reps: int, loops: int) -> tuple[list[float], dict]:
    """NeuraLogic's epoch repetitions in this process alternated with relsql's in the worker;
    (NeuraLogic's seconds per epoch, relsql's medians with its build and the load average)."""
    ne, times, loads = [], {}, []
    try:
        for i in range(reps):
            wall, cpu = _timed_cpu(epoch, reset, loops)
            ne.append(wall)
            times.setdefault("nl_cpu", []).append(cpu)
            time.sleep(SETTLE_S)  # the JVM's JIT and GC threads run on after its calls
            for k, v in worker.rep(i).items():
                times.setdefault(k, []).append(v)
            loads.append(os.getloadavg()[0])
    finally:
        worker.close()
    return ne, {**worker.ready, **{k: statistics.median(v) for k, v in times.items()},
                "load_avg": f"{min(loads):.1f}-{max(loads):.1f}"}


def _in(side: RelsqlSide, execution: str, fn):
    """`fn` (an epoch) with the net run as `execution` says (CompiledNet.execution)."""
    def run():
        side.net.execution = execution
        fn()
    return run


def time_relsql(dsname: str, name: str, width: int | str, kind: str, reps: int, warm: bool = True,
                loops: int = EPOCH_LOOPS, threads: int = 2) -> None:
    """Runs in a fresh process (no JVM): relsql builds (printed once built and warm), then per
    line the parent writes, one repetition of the float64 and float32 epochs and float64 op by op
    (execution "ops": the plan before fusing), in alternating order (`warm` False: the first
    build and epochs are the timed ones)."""
    import torch

    import relsql

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="relsql_bench_time_") as tmp:
        db = relsql.connect()
        ds = load_dataset(db.con, dsname)
        text, _ = write_template_dir(ds, name, width, Path(tmp))
        rel = RelsqlSide(db, text, Path(tmp), torch.float64, ds.heads)
        rel32 = RelsqlSide(db, text, Path(tmp), torch.float32, ds.heads)
        if warm:
            rel.build()  # warm-up
        builds = [_timed(rel.build) for _ in range(reps)]
        rel32.build()
        rel.prepare()
        rel32.prepare(like=rel)
        f64 = rel.epoch if kind == "train" else rel.forward
        execution = rel.use_fused_step() if kind == "train" else "fused"
        if kind == "train":
            rel32.use_fused_step()
        fns = {"f64": _in(rel, "auto", f64), "f32": rel32.epoch if kind == "train" else rel32.forward,
               "f64_ops": _in(rel, "ops", f64), "f64_autograd": _in(rel, "fused", f64)}
        resets = {"f64": rel.reset, "f32": rel32.reset, "f64_ops": rel.reset, "f64_autograd": rel.reset}
        rel.net.execution = "fused"
        rel.net()
        if rel.net.fused_reason is not None:  # no code for some op: nothing to time through autograd fused
            del fns["f64_autograd"]
        rel.net.execution = "auto"
        rel.net()
        if rel.net.fused_reason is not None and not execution.startswith(("fused step", "ops on")):
            execution = f"ops ({rel.net.fused_reason})"
        for fn in fns.values() if warm else ():
            fn()
        print(json.dumps({"build_s": statistics.median(builds), "execution": execution}), flush=True)
        for line in sys.stdin:  # the parent asks for repetition i between its own (RelsqlWorker)
            i = int(line)
            order = list(fns) if i % 2 == 0 else list(fns)[::-1]
            found = {}
            for k in order:
                found[k], found[f"{k}_cpu"] = _timed_cpu(fns[k], resets[k], loops)
            print(json.dumps(found), flush=True)


# --------------------------------------------------------------------------- memory (fresh processes)


def _memory_subprocess(side: str, dsname: str, name: str, width: int | str, kind: str, settings_kind: str, work: Path):
    """The probe of one side, started: (process, its stdout file, its stderr file)."""
    cmd = [sys.executable, "-m", "bench.neuralogic", "--memory-probe", side, "--probe-dataset", dsname,
           "--probe-template", name,
           "--probe-width", str(width), "--probe-kind", kind, "--nl-settings", settings_kind]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cwd = work / f"probe_{side}"
    cwd.mkdir(exist_ok=True)
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True), out, err


def _memory_result(side: str, name: str, width: int, proc: subprocess.Popen, out, err) -> str:
    """The peak RSS a probe reported (MiB), once it ended, or "failed"."""
    with out, err:
        try:
            proc.wait(900)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        for line in out.read().splitlines()[::-1]:
            if line.startswith("{"):
                return f"{json.loads(line)['peak_rss_mib']:.0f}"
        print(f"memory probe {side} {name} w{width} failed:\n{err.read()[-2000:]}", file=sys.stderr)
    return "failed"


def memory_probe(side: str, dsname: str, name: str, width: int | str, kind: str, settings_kind: str) -> None:
    """Runs in a fresh process: build + one epoch (or forward) of one side, prints its peak RSS."""
    with tempfile.TemporaryDirectory(prefix="relsql_bench_probe_") as tmp:
        if side == "neuralogic":
            ds = dataset_files(dsname)
            _, nl_path = write_template_dir(ds, name, width, Path(tmp))
            _quiet_java()
            s = NeuraLogicSide(nl_path, ds.examples, ds.queries, settings_kind)
        else:
            import torch

            import relsql

            db = relsql.connect()
            ds = load_dataset(db.con, dsname)
            text, _ = write_template_dir(ds, name, width, Path(tmp))
            s = RelsqlSide(db, text, Path(tmp), torch.float64, ds.heads)
        s.build()
        if side == "relsql":
            s.prepare()
        s.epoch() if kind == "train" else s.forward()
    print(json.dumps({"side": side, "peak_rss_mib": peak_rss_mib()}))


# --------------------------------------------------------------------------- output


def print_table(rows: list[dict]) -> str:
    head = ("dataset", "template", "w", "kind", "build NL s", "build rs s", "×", "epoch NL ms", "rs f64 ms", "rs f32 ms",
            "×f64", "×f32", "f64 op-by-op ms", "×f64 op-by-op", "×f64 autograd", "×f64 cpu", "load", "max|Δ|",
            "RSS NL MiB", "RSS rs MiB")
    keys = ("dataset", "template", "width", "epoch_kind", "nl_build_s", "relsql_build_s", "build_ratio", "nl_epoch_ms",
            "relsql_epoch_ms_f64", "relsql_epoch_ms_f32", "epoch_ratio_f64", "epoch_ratio_f32", "relsql_epoch_ms_f64_ops",
            "epoch_ratio_f64_ops", "epoch_ratio_f64_autograd", "epoch_ratio_cpu_f64", "load_avg", "max_abs_dev",
            "nl_peak_rss_mib", "relsql_peak_rss_mib")
    cells = [head] + [tuple(str(r[k]) if r[k] != "" else "-" for k in keys) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c[i].ljust(widths[i]) if i < 4 else c[i].rjust(widths[i]) for i in range(len(head))) for c in cells]
    lines.insert(1, "-" * len(lines[0]))
    notes = [f"  {r['dataset']} {r['template']} w{r['width']}: {r['note']}" for r in rows if r["note"]]
    notes += [f"  {r['dataset']} {r['template']} w{r['width']}: relsql ran {r['relsql_execution']}"
              for r in rows if r["relsql_execution"] and not r["relsql_execution"].startswith(("fused", "fused step"))]
    return "\n".join(lines + (["notes:"] + notes if notes else []))


def write_chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["build_ratio"] != ""]
    if not done:
        return
    labels = [(f"{Path(r['template']).stem.removeprefix('template').lstrip('_') or 'template'}\nw{r['width']}"
               if r["dataset"] == "mutagenesis" else r["dataset"].replace("_", "\n"))
              + ("\n(fwd)" if r["epoch_kind"] == "forward" else "") for r in done]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.8 * len(done) + 2), 9))
    x = range(len(done))
    ax = axes[0]
    ax.bar(x, [float(r["build_ratio"]) for r in done], color="tab:blue")
    ax.axhline(TARGETS["build"], color="red", ls="--", label=f"target ≥ {TARGETS['build']:g}×")
    ax.set_title("build (grounding) speed-up: NeuraLogic s / relsql s")
    ax2 = axes[1]
    w = 0.4
    ax2.bar([i - w / 2 for i in x], [float(r["epoch_ratio_f64"]) for r in done], w, label="relsql float64", color="tab:green")
    ax2.bar([i + w / 2 for i in x], [float(r["epoch_ratio_f32"]) for r in done], w, label="relsql float32", color="tab:olive")
    for i, r in enumerate(done):
        t = TARGETS["epoch@32"] if str(r["width"]) == "32" else TARGETS["epoch@3"]
        ax2.hlines(t, i - 0.5, i + 0.5, color="red", ls="--", label="target (1× at w3, 20× at w32)" if i == 0 else None)
    ax2.set_title("epoch speed-up: NeuraLogic ms / relsql ms")
    for a in axes:
        a.set_yscale("log")
        a.axhline(1.0, color="gray", lw=0.8)
        a.set_xticks(list(x))
        a.set_xticklabels(labels, fontsize=7)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.neuralogic", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="Mutagenesis' template.txt at width 3 only, 1 repetition without warm-up, 1 epoch per repetition")
    ap.add_argument("--datasets", nargs="*", choices=(*DATASETS, *EXTRA), default=None,
                    help=f"default: all that run on both sides ({', '.join(DATASETS)}); quick: {', '.join(QUICK_DATASETS)}")
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions after the warm-up (default 3; quick 1)")
    ap.add_argument("--templates", nargs="*", default=None, help="Mutagenesis templates (default: all seven)")
    ap.add_argument("--widths", nargs="*", type=int, default=None, help="Mutagenesis widths (default 3 32)")
    ap.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak-RSS probes")
    ap.add_argument("--nl-settings", choices=("iso", "oracle"), default="iso")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the relsql side (default 2)")
    ap.add_argument("--per-op", action="store_true", help="only print the fixed cost per op, op by op and fused")
    ap.add_argument("--memory-probe", choices=("neuralogic", "relsql"), help=argparse.SUPPRESS)
    ap.add_argument("--probe-template", help=argparse.SUPPRESS)
    ap.add_argument("--probe-dataset", default="mutagenesis", help=argparse.SUPPRESS)
    ap.add_argument("--probe-width", type=lambda w: w if w == SHIPPED else int(w), help=argparse.SUPPRESS)
    ap.add_argument("--probe-kind", default="train", help=argparse.SUPPRESS)
    ap.add_argument("--time-relsql", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-warmup", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--loops", type=int, default=EPOCH_LOOPS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.time_relsql:
        time_relsql(args.probe_dataset, args.probe_template, args.probe_width, args.probe_kind, args.reps or 3,
                    not args.no_warmup, args.loops, args.threads)
        return 0
    if args.per_op:
        print_per_op(args.threads)
        return 0
    if args.memory_probe:
        memory_probe(args.memory_probe, args.probe_dataset, args.probe_template, args.probe_width, args.probe_kind,
                     args.nl_settings)
        return 0

    templates = args.templates or (("template.txt",) if args.quick else TEMPLATES)
    widths = args.widths or ((3,) if args.quick else WIDTHS)
    reps = args.reps or (1 if args.quick else 3)
    datasets = args.datasets or (QUICK_DATASETS if args.quick else tuple(DATASETS))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    import torch

    import relsql

    old_cwd = os.getcwd()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="relsql_bench_nl_") as tmp:
        work = Path(tmp)
        os.chdir(work)  # PyNeuraLogic writes ./target/...
        try:
            jvm_s = _quiet_java()
            print(f"JVM start {jvm_s:.2f} s (once, excluded from builds); torch threads {torch.get_num_threads()}, "
                  f"cores {os.cpu_count()}; NeuraLogic settings: {args.nl_settings}; reps {reps}", flush=True)
            for dsname in datasets:
                t = time.perf_counter()
                db = relsql.connect()  # one database per dataset: their relation names overlap
                dataset = load_dataset(db.con, dsname)
                import_s = time.perf_counter() - t
                print(f"{dsname}: DuckDB import of the examples {import_s:.3f} s (excluded from relsql builds)", flush=True)
                mutagenesis = dsname == "mutagenesis"
                for width in widths if mutagenesis else (SHIPPED,):
                    for name in templates if mutagenesis else DATASETS.get(dsname, ("template.txt",)):
                        t0 = time.perf_counter()
                        try:
                            row = run_config(name, width, db, dataset, work, reps, args.nl_settings,
                                             not args.no_memory, import_s, jvm_s, warm=not args.quick,
                                             loops=1 if args.quick else EPOCH_LOOPS, threads=args.threads)
                        except Exception as e:  # noqa: BLE001 - report and go on with the other templates
                            traceback.print_exc()
                            row = {c: "" for c in COLUMNS}
                            row.update(dataset=dsname, template=name, width=width, nl_settings=args.nl_settings, reps=reps,
                                       note=f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}")
                        rows.append(row)
                        print(f"  {dsname} {name} w{width}: build ×{row['build_ratio'] or '-'}, epoch ×"
                              f"{row['epoch_ratio_f64'] or '-'} (f64; op by op ×{row['epoch_ratio_f64_ops'] or '-'}), "
                              f"max|Δ| {row['max_abs_dev'] or '-'}  "
                              f"[{time.perf_counter() - t0:.0f} s]", flush=True)
                db.close()
            not_run = {} if args.quick else {n: why_not_run(n) for n in NOT_RUN if n not in datasets}
        finally:
            os.chdir(old_cwd)

    csv_path, png_path = out / "neuralogic.csv", out / "neuralogic.png"
    write_csv(csv_path, [{k: r[k] for k in COLUMNS} for r in rows])
    write_chart(rows, png_path)
    print()
    print(print_table(rows))
    if not args.quick:
        print()
        print_per_op(args.threads)
    if not_run:
        print("not run (templates shipped in the wheel that do not run on both sides):")
        for n, why in not_run.items():
            print(f"  {n}: {why}")
    print(f"\nbuild = NL Model.build+build_dataset vs relsql from_datalog+compile (import excluded; "
          f"ratio incl. import in the CSV); epoch: NL train() per-sample SGD vs relsql full-batch SGD step; "
          f"× = NeuraLogic / relsql; targets build ≥{TARGETS['build']:g}×, epoch >{TARGETS['epoch@3']:g}× at w3, "
          f"≥{TARGETS['epoch@32']:g}× at w32")
    print(f"wrote {png_path}")
    bad = [r for r in rows if (r["max_abs_dev"] != "" and not float(r["max_abs_dev"]) < TOL) or r["note"].startswith("ERROR")]
    if bad:
        print("FAILED (identical-numbers check or error): "
              + ", ".join(f"{r['dataset']} {r['template']} w{r['width']} ({r['max_abs_dev']})" for r in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
