"""PyNeuraLogic 0.9.2 as an exact numeric oracle for relsql tests.

Everything here runs NeuraLogic's own Java engine (through PyNeuraLogic) on a
text template plus text examples/queries, with settings that keep every
neuron (no iso-value compression, no chain pruning) and make one training
step a clean gradient read-out (plain SGD, lr = 1, summed squared error).
All numbers come back as float64 numpy arrays; the engine computes in Java
doubles, so agreement to ~1e-12 is expected.

See docs/neuralogic-semantics.md for the semantics these numbers follow.

Public API
----------
evaluate(template_text, examples, queries, weights=None, template_dir=None)
    -> OracleResult (weights, weight_shapes, weight_names, fixed_weights,
       outputs, and .gradients()).
gradients(template_text, examples, queries, weights=None, template_dir=None)
    -> {weight index: d/dw sum_q (o_q - t_q)^2}.
atom_values(template_text, examples, predicate, weights=None, template_dir=None)
    -> {(example index, args tuple): value} for every ground atom of
       `predicate` that has a neuron, in every example.
dataset_files(name) -> (template_path, examples_path, queries_path | None)
    for the datasets shipped in the wheel ("mutagenesis", "family", ...).

Value shapes (as returned here): a scalar is shape (); a column vector
(NeuraLogic `{n}` / `{n,1}` / `[a,b,c]`) is shape (n,); a matrix `{r,c}`
(r, c > 1 or r == 1 < c, i.e. a row vector) is shape (r, c).

Input conventions
-----------------
* `template_text` is NeuraLogic template text.  `import ./x.txt` lines are
  resolved relative to `template_dir` (copied next to the temp template).
  A path to an existing file is accepted too (its directory becomes the
  default template_dir).
* `examples` / `queries`: a list of lines (one sample per line, as in the
  mutagenesis examples.txt / queries.txt), one multi-line string, or a path
  to such a file.  `queries` may be None when every example line carries its
  own query (`<target> head :- facts.`, the XOR format).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "OracleOutput",
    "OracleResult",
    "evaluate",
    "gradients",
    "atom_values",
    "dataset_files",
    "get_weights",
    "set_weights",
]

_initialised = False


def _init() -> None:
    """Start the JVM once per process and silence the Java log."""
    global _initialised
    if _initialised:
        return
    import neuralogic
    from neuralogic.logging import Level, LogHandler, add_log_handler

    add_log_handler(LogHandler(open(os.devnull, "w"), Level.OFF))
    if not neuralogic.is_initialized():
        neuralogic.initialize()
    unhook_java_gc()
    _initialised = True


def unhook_java_gc() -> None:
    """Drop the Python garbage-collection callbacks JPype adds when the JVM starts (two, both
    `_jpype._collect`): they run the JVM's reference queue and collector on every Python collection,
    so relsql's allocation-heavy code (sqlglot's tree copies, DuckDB calls) ran 4-6x slower in a process
    that had started PyNeuraLogic (a Model of tests/test_shared_key_tables: 0.5 s -> 2.5 s each; its
    JPype "Python Reference" thread took 6 CPU-s of 9). The oracle's Java objects are still freed by
    the JVM's own collector; only the Python-driven extra collections stop."""
    import gc

    gc.callbacks[:] = [c for c in gc.callbacks if getattr(c, "__module__", None) != "_jpype"]


def _settings():
    """Oracle settings: keep all neurons, SGD lr=1, loss = sum of squared errors."""
    from neuralogic.core import Settings
    from neuralogic.nn.loss import MSE
    from neuralogic.nn.optim import SGD

    return Settings(
        optimizer=SGD(lr=1.0),
        error_function=MSE(reduction="sum"),
        iso_value_compression=False,
        chain_pruning=False,
        prune_only_identities=False,
    )


def _datasets_dir() -> str:
    import neuralogic

    return os.path.join(os.path.dirname(neuralogic.__file__), "utils", "data", "datasets")


def dataset_files(name: str, template: str = "template.txt") -> tuple[str, str, str | None]:
    """Paths of a dataset shipped in the PyNeuraLogic wheel.

    name: "mutagenesis" (template: any file in .../mutagenesis/templates/),
    "family", "trains", "nations", "xor" (naive), "xor_vectorized".
    Returns (template_path, examples_path, queries_path or None).
    """
    base = _datasets_dir()
    if name == "mutagenesis":
        d = os.path.join(base, "molecules", "mutagenesis")
        return os.path.join(d, "templates", template), os.path.join(d, "examples.txt"), os.path.join(d, "queries.txt")
    if name in ("family", "trains"):
        d = os.path.join(base, "simple", name)
        return os.path.join(d, "template.txt"), os.path.join(d, "examples.txt"), os.path.join(d, "queries.txt")
    if name == "nations":
        d = os.path.join(base, "nations")
        return os.path.join(d, "template.txt"), os.path.join(d, "examples.txt"), os.path.join(d, "queries.txt")
    if name == "xor":
        d = os.path.join(base, "simple", "xor", "naive")
        return os.path.join(d, "template.txt"), os.path.join(d, "trainExamples.txt"), None
    if name == "xor_vectorized":
        d = os.path.join(base, "simple", "xor", "vectorized")
        return os.path.join(d, "template.txt"), os.path.join(d, "trainExamples.txt"), None
    raise KeyError(name)


# --------------------------------------------------------------------------- data classes


@dataclass
class OracleOutput:
    """One query's output.

    sample: index of the example (line of the examples input) the query was
        evaluated on (0 when there is a single example for many queries).
    line: index of the query line (or of the example line, for the XOR
        format where queries live in the examples).
    query: the ground query atom, e.g. "predict" or "h(x, y)".
    value: np.ndarray, shape () / (n,) / (r, c).
    target: np.ndarray or None (from the query text, e.g. "1.0 predict.").
    """

    sample: int
    line: int
    query: str
    value: np.ndarray
    target: np.ndarray | None
    missing: bool = False  # the query atom has no neuron (not derivable); the engine outputs 0.0


@dataclass
class OracleResult:
    weights: dict[int, np.ndarray]
    weight_shapes: dict[int, tuple[int, ...]]
    weight_names: dict[int, str]
    fixed_weights: dict[int, np.ndarray]
    outputs: list[OracleOutput]
    _inputs: dict = field(default_factory=dict, repr=False)

    def values(self) -> np.ndarray:
        """Outputs stacked (only when all have the same shape)."""
        return np.stack([o.value for o in self.outputs])

    def gradients(self) -> dict[int, np.ndarray]:
        """Gradient of sum over queries of sum((o - t)^2) at self.weights."""
        return gradients(**self._inputs, weights=self.weights)


# --------------------------------------------------------------------------- helpers


def _read_lines(src: list[str] | str | None) -> list[str] | None:
    if src is None:
        return None
    if isinstance(src, str):
        if "\n" not in src and os.path.isfile(src):
            with open(src) as fp:
                src = fp.read()
        lines = src.splitlines()
    else:
        lines = list(src)
    return [ln.strip() for ln in lines if ln.strip()]


def _to_np(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)


def _java_value_to_np(value: Any) -> np.ndarray:
    from neuralogic.core.constructs.java_objects import ValueFactory

    return _to_np(ValueFactory.from_java(value))


class _Workspace:
    """A temp dir with template/examples/queries files and a built model."""

    def __init__(self, template_text, examples, queries, template_dir):
        _init()
        self.dir = tempfile.mkdtemp(prefix="nl_oracle_")
        if os.path.isfile(template_text) if "\n" not in template_text else False:
            template_dir = template_dir or os.path.dirname(os.path.abspath(template_text))
            with open(template_text) as fp:
                template_text = fp.read()
        if template_dir:
            for name in os.listdir(template_dir):
                p = os.path.join(template_dir, name)
                if os.path.isfile(p):
                    shutil.copy(p, os.path.join(self.dir, name))
        self.template_path = os.path.join(self.dir, "__template__.txt")
        with open(self.template_path, "w") as fp:
            fp.write(template_text + "\n")
        self.examples = _read_lines(examples) or []
        self.queries = _read_lines(queries)
        self.examples_path = self._write("__examples__.txt", self.examples)
        self.queries_path = self._write("__queries__.txt", self.queries) if self.queries is not None else None
        self.model = None
        self.dataset = None

    def _write(self, name, lines):
        path = os.path.join(self.dir, name)
        with open(path, "w") as fp:
            fp.write("\n".join(lines) + "\n")
        return path

    def build(self, weights=None, seed=0):
        import neuralogic
        from neuralogic.core.model import Model
        from neuralogic.dataset import FileDataset

        neuralogic.manual_seed(seed)
        self.model = Model(model_file=self.template_path).build(_settings())
        if weights is not None:
            set_weights(self.model, weights)
        self.dataset = self.model.build_dataset(
            FileDataset(examples_file=self.examples_path, queries_file=self.queries_path)
        )
        return self

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def get_weights(model) -> tuple[dict, dict, dict, dict]:
    """(learnable values, shapes, names, fixed values) of a built model."""
    weights, shapes, names, fixed = {}, {}, {}, {}
    for w in model._neural_model.getAllWeights():
        idx = int(w.index)
        if idx < 0:
            continue  # engine-internal constants
        val = _java_value_to_np(w.value)
        if w.isLearnable():
            weights[idx] = val
            shapes[idx] = tuple(val.shape)
            names[idx] = str(w.name)
        else:
            fixed[idx] = val
    order = sorted(weights)
    return (
        {i: weights[i] for i in order},
        {i: shapes[i] for i in order},
        {i: names[i] for i in order},
        dict(sorted(fixed.items())),
    )


def set_weights(model, weights: dict[int, Any]) -> None:
    """Overwrite learnable weights by index (others keep their values)."""
    by_index = {int(w.index): w for w in model._neural_model.getAllWeights()}
    for idx, value in weights.items():
        w = by_index.get(int(idx))
        if w is None or not w.isLearnable():
            raise KeyError(f"no learnable weight with index {idx}")
        arr = _to_np(value)
        cur = _java_value_to_np(w.value)
        if arr.size != cur.size:
            raise ValueError(f"weight {idx}: expected shape {cur.shape}, got {arr.shape}")
        flat = arr.reshape(cur.shape).reshape(-1)  # row-major, as the engine stores it
        for k, v in enumerate(flat):
            w.value.set(k, float(v))


_ID_RE = re.compile(r"^s_(\d+):")


def _sample_line(java_sample) -> int:
    m = _ID_RE.match(str(java_sample.getId()))
    return int(m.group(1)) if m else -1


def _outputs(ws: _Workspace) -> list[OracleOutput]:
    values = ws.model(ws.dataset)
    n_examples = len(ws.examples)
    outs = []
    for pos, (s, v) in enumerate(zip(ws.dataset, values)):
        js = s._java_sample
        line = _sample_line(js)
        if ws.queries is None:  # XOR format: each example line is a sample
            line = pos
        sample = 0 if n_examples <= 1 else line
        missing = js.query.neuron is None
        if missing:
            query = str(js.getId()).split(":", 1)[-1]
        else:
            query = str(js.query.neuron.getName())
        target = None if js.target is None else _java_value_to_np(js.target)
        outs.append(
            OracleOutput(sample=sample, line=line, query=query, value=_to_np(v), target=target, missing=missing)
        )
    return outs


# --------------------------------------------------------------------------- public API


def evaluate(
    template_text: str,
    examples: list[str] | str,
    queries: list[str] | str | None,
    weights: dict[int, np.ndarray] | None = None,
    template_dir: str | None = None,
    seed: int = 0,
) -> OracleResult:
    """Evaluate every query (no training).  `weights` overrides learnable
    weights by index; the rest keep their seeded Glorot initial values."""
    ws = _Workspace(template_text, examples, queries, template_dir).build(weights, seed)
    try:
        w, shapes, names, fixed = get_weights(ws.model)
        outs = _outputs(ws)
    finally:
        ws.close()
    return OracleResult(
        weights=w,
        weight_shapes=shapes,
        weight_names=names,
        fixed_weights=fixed,
        outputs=outs,
        _inputs=dict(template_text=template_text, examples=examples, queries=queries, template_dir=template_dir),
    )


def gradients(
    template_text: str,
    examples: list[str] | str,
    queries: list[str] | str | None,
    weights: dict[int, np.ndarray] | None = None,
    template_dir: str | None = None,
    seed: int = 0,
) -> dict[int, np.ndarray]:
    """d/dw of  L = sum over queries q of sum_components (o_q - t_q)^2  at `weights`.

    Read out from the engine's own SGD: for each sample separately the
    weights are reset to w0 and one step with lr = 1 is taken, so
    grad_q = w0 - w1; the per-sample gradients are summed.  (A single
    `train` call over a list of samples steps after each sample, which is
    not a full-batch gradient.)  Every query needs a target.
    """
    ws = _Workspace(template_text, examples, queries, template_dir).build(weights, seed)
    try:
        w0, _, _, _ = get_weights(ws.model)
        total = {i: np.zeros_like(v) for i, v in w0.items()}
        for s in ws.dataset:
            if s._java_sample.target is None:
                raise ValueError(f"query {s._java_sample.query.neuron.getName()} has no target")
            set_weights(ws.model, w0)
            ws.model.train(s)
            w1, _, _, _ = get_weights(ws.model)
            for i in total:
                total[i] += w0[i] - w1[i]
        set_weights(ws.model, w0)
    finally:
        ws.close()
    return total


def _predicate_arity(template_text: str, name: str) -> int:
    m = re.search(r"(?<![\w$])" + re.escape(name) + r"\s*/\s*(\d+)", template_text)
    if m:
        return int(m.group(1))
    m = re.search(r"(?<![\w$])" + re.escape(name) + r"\s*(\(([^()]*)\))?", template_text)
    if not m:
        raise ValueError(f"predicate {name} not found in the template; pass 'name/arity'")
    args = m.group(2)
    return 0 if args is None or not args.strip() else args.count(",") + 1


_NOT_MATCHED = "not matched anywhere"


def _split_args(atom: str) -> tuple[str, ...]:
    if "(" not in atom:
        return ()
    inner = atom[atom.index("(") + 1 : atom.rindex(")")]
    return tuple(a.strip() for a in inner.split(","))


def atom_values(
    template_text: str,
    examples: list[str] | str,
    predicate: str,
    weights: dict[int, np.ndarray] | None = None,
    template_dir: str | None = None,
    seed: int = 0,
) -> dict[tuple[int, tuple[str, ...]], np.ndarray]:
    """Values of every ground atom of `predicate` ("name" or "name/arity")
    in every example: {(example index, args): value}.

    Implemented with one variable query `name(X0, ..., Xk)` per example
    line: the engine turns it into one sample per derivable substitution.
    Atoms that have no neuron (no grounding, or facts that no rule derives)
    are absent.  XOR-style example lines (`target head :- facts.`) are
    reduced to their facts.
    """
    if "/" in predicate:
        name, ar = predicate.split("/")
        name, arity = name.strip(), int(ar)
    else:
        name, arity = predicate, None
    text = template_text
    if "\n" not in text and os.path.isfile(text):
        with open(text) as fp:
            text = fp.read()
    if arity is None:
        arity = _predicate_arity(text, name)
    query = name + ("(" + ", ".join(f"X{i}" for i in range(arity)) + ")" if arity else "") + "."

    lines = _read_lines(examples) or []
    lines = [ln.split(":-", 1)[1].strip() if ":-" in ln else ln for ln in lines]
    if not lines[-1:] or not lines[-1].endswith("."):
        lines = [ln if ln.endswith(".") else ln + "." for ln in lines]

    def run(ex_lines):
        ws = _Workspace(template_text, ex_lines, [query] * len(ex_lines), template_dir).build(weights, seed)
        try:
            return _outputs(ws)
        finally:
            ws.close()

    result: dict[tuple[int, tuple[str, ...]], np.ndarray] = {}
    try:
        outs = run(lines)
        for o in outs:
            if not o.missing:
                result[(o.sample, _split_args(o.query))] = o.value
        return result
    except Exception as e:  # some example has no such atom: go one by one
        if _NOT_MATCHED not in str(e):
            raise
    for i, line in enumerate(lines):
        try:
            outs = run([line])
        except Exception as e:
            if _NOT_MATCHED in str(e):
                continue
            raise
        for o in outs:
            if not o.missing:
                result[(i, _split_args(o.query))] = o.value
    return result
