"""Mini-batch plans built once per shape and replayed with each batch's index tensors.

Planning a batch (relsql/compile/planning.py: build, then the optimizer passes) costs more than
reading it from the grounding store. Yet consecutive batches of one template differ only in their
index tensors and sizes: the same relations, the same rules, the same ops. So:

1. A batch's grounding is padded to bucketed sizes (`pad`): every relation gets extra rows that
   no real row reads, every rule extra groundings whose heads are those rows. Real rows' values
   are unchanged; the sizes, and so every shape the planner sees, repeat across batches.
2. The first batch of a shape is planned under a recorder (`Trace.record`): every torch call whose
   arguments depend on the grounding's tensors is kept, and every value such a call hands back to
   Python (a shape, a count, a comparison) is kept as a guard.
3. A later batch of that shape replays only those calls on its own tensors (`Trace.replay`, one
   function generated from the recording, a line per call):
   the guards must come out the same (else it is planned afresh), and the plan is the recorded
   one with its index tensors and matrices swapped.

The first replay of each trace is checked against a fresh plan of the same batch (`PlanCache`):
any difference (a value computed outside torch, which the recorder cannot see) turns reuse off
for that shape, so a wrong replay never reaches training.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from relsql.compile.plan import Plan
from relsql.compile.planning import make_plan
from relsql.ground.execute import Grounding, RuleGrounding
from relsql.template import ir

STEPS_PER_OCTAVE = 8  # bucket grid: 8 sizes per power of two, at most 12.5% padding


def bucket(n: int) -> int:
    """The smallest grid size >= n (0 stays 0): powers of two split in STEPS_PER_OCTAVE steps."""
    if n <= STEPS_PER_OCTAVE:
        return n
    base = 1 << (n.bit_length() - 1)
    step = max(base // STEPS_PER_OCTAVE, 1)
    return base + math.ceil((n - base) / step) * step


# -- padding -----------------------------------------------------------------------------------

class PaddedRelation:
    """A relation's grounding with pad rows: `size` counts them; `keys` stays the real rows'."""

    def __init__(self, name: str, keys, rules: list[RuleGrounding], size: int):
        self.name, self.keys, self.rules, self.size = name, keys, rules, size


def _uniform(rg: RuleGrounding) -> int | None:
    """The groundings per head when every head has as many (pad heads then get as many too).
    In numpy on the CPU (a third of the time of the same five torch calls, once per rule and batch)."""
    if not rg.rule.grouped or rg.offsets.shape[0] < 2:
        return None
    offsets = rg.offsets.numpy() if rg.offsets.device.type == "cpu" else rg.offsets.cpu().numpy()
    counts = offsets[1:] - offsets[:-1]
    first = int(counts[0])
    return first if bool((counts == first).all()) else None


def _pad_rule(rg: RuleGrounding, n: int, k_heads: int, k_rows: int, per_head: int | None,
              ref_sizes: list[int]) -> RuleGrounding:
    """`rg` with `k_heads` pad heads (rows n, n+1, ...) holding `k_rows` pad groundings: one each
    (the last takes the rest), or `per_head` each; pad groundings read distinct real rows where
    they can and zero-valued columns."""
    if k_heads == 0:
        return rg
    columns_spec = tuple((i, c.dtype, tuple(c.shape[1:])) for i, c in rg.columns.items())
    heads, head, ends, refs, columns = _pad_pieces(n, k_heads, k_rows, per_head, tuple(ref_sizes), columns_spec)
    # offsets[-1] is the rule's groundings: a Python int added, not a tensor element read and added
    return RuleGrounding(rg.rule, torch.cat([rg.head, head]), [torch.cat([r, p]) for r, p in zip(rg.refs, refs)],
                         {i: torch.cat([c, columns[i]]) for i, c in rg.columns.items()},
                         torch.cat([rg.segment_heads, heads]), torch.cat([rg.offsets, ends + rg.size]))


_PIECES: dict[tuple, tuple] = {}  # the pad tensors of a (rows, pad heads, pad groundings, ...) combination


def _pad_pieces(n: int, k_heads: int, k_rows: int, per_head: int | None, ref_sizes: tuple, columns: tuple) -> tuple:
    """Pad heads, pad groundings' heads, offsets past the real ones, refs and zero columns;
    made once per combination (batches of one shape mostly repeat them)."""
    key = (n, k_heads, k_rows, per_head, ref_sizes, columns)
    if key not in _PIECES:
        if len(_PIECES) > 256:
            _PIECES.clear()
        heads = torch.arange(n, n + k_heads, dtype=torch.int64)
        if per_head is not None:
            head = heads.unsqueeze(1).expand(k_heads, per_head).reshape(-1)
            ends = torch.arange(1, k_heads + 1, dtype=torch.int64) * per_head
        else:  # one grounding per pad head, the last takes the rest
            head = torch.cat([heads, torch.full((k_rows - k_heads,), n + k_heads - 1, dtype=torch.int64)])
            ends = torch.arange(1, k_heads + 1, dtype=torch.int64)
            ends[-1] = k_rows
        k = int(head.shape[0])
        refs = [torch.arange(k, dtype=torch.int64) % max(size, 1) for size in ref_sizes]
        zeros = {i: torch.zeros((k, *shape), dtype=dtype) for i, dtype, shape in columns}
        _PIECES[key] = (heads, head, ends, refs, zeros)
    return _PIECES[key]


def _has_concat(expr: ir.Expr) -> bool:
    """A concat aggregation: its width is the groundings per head, which pad heads must not change."""
    return (isinstance(expr, ir.Agg) and expr.kind == "concat") or any(_has_concat(c) for c in expr.children())


_CONCAT: dict[int, tuple[ir.Expr, bool]] = {}  # id of a rule's expression -> (it, has a concat aggregation)


def _concat(expr: ir.Expr) -> bool:
    if id(expr) not in _CONCAT:
        _CONCAT[id(expr)] = (expr, _has_concat(expr))
    return _CONCAT[id(expr)][1]


def needs(grounding: Grounding) -> tuple | None:
    """What padding must respect, per relation: (name, rows, per rule (heads, groundings, every
    row a head, groundings per head if uniform, grouped, column shapes)), and the embeddings'
    vocabulary sizes; None where the grounding cannot be padded (a concat aggregation needs its
    real head counts; a pad grounding needs a row to read)."""
    found = []
    real = {name: r.size for name, r in grounding.relations.items()}
    for name, relation in grounding.relations.items():
        n, rules = relation.size, []
        for rg in relation.rules:
            if _concat(rg.rule.expr) or any(real.get(r, 0) == 0 for r in rg.rule.refs):
                return None
            heads = rg.segment_heads.shape[0]
            rules.append((heads, rg.size, heads == n and n > 0, _uniform(rg), rg.rule.grouped,
                          tuple((i, c.dtype, tuple(c.shape[1:])) for i, c in rg.columns.items())))
        found.append((name, n, tuple(rules)))
    return tuple(found), tuple(sorted(grounding.vocab_sizes.items()))


def _rule_size(rule: tuple, k_heads: int) -> int:
    heads, rows, _, per_head, grouped, _ = rule
    if not grouped:
        return rows + k_heads
    if per_head is not None:
        return rows + k_heads * per_head
    return bucket(rows + k_heads)


def shape_for(need: tuple) -> tuple:
    """The bucketed padded shape of `need`: per relation (name, rows, per rule (heads, groundings,
    every row a head, groundings per head, grouped, column shapes)), and the vocabulary sizes."""
    relations, vocab = need
    key = []
    for name, n, rules in relations:
        extra = max([bucket(r[0] + 1) - r[0] for r in rules if not r[2]] + [1]) if rules else 0
        size = bucket(n + extra)
        shape = []
        for rule in rules:
            heads, _, full, per_head, grouped, columns = rule
            k_heads = size - n if full else bucket(heads + 1) - heads
            shape.append((heads + k_heads, _rule_size(rule, k_heads), full, per_head, grouped, columns))
        key.append((name, size, tuple(shape)))
    return tuple(key), vocab


def fits(need: tuple, shape: tuple) -> bool:
    """Whether `need` pads exactly to `shape` (a larger shape recorded earlier)."""
    (relations, vocab), (target, target_vocab) = need, shape
    if vocab != target_vocab or len(relations) != len(target):
        return False
    for (name, n, rules), (name_t, size, rules_t) in zip(relations, target):
        if name != name_t or len(rules) != len(rules_t) or size < n + (1 if rules else 0):
            return False
        for (heads, rows, full, per_head, grouped, columns), (heads_t, rows_t, full_t, per_head_t, _, columns_t) \
                in zip(rules, rules_t):
            k_heads, k_rows = heads_t - heads, rows_t - rows
            if (full, per_head, columns) != (full_t, per_head_t, columns_t) or k_heads < 1 or k_heads > size - n \
                    or (full and k_heads != size - n) or k_rows < k_heads \
                    or (not grouped and k_rows != k_heads) or (per_head is not None and k_rows != k_heads * per_head):
                return False
    return True


def volume(shape: tuple) -> int:
    """Rows and groundings of a padded shape: what its plan's work grows with."""
    return sum(size + sum(rule[1] for rule in rules) for _, size, rules in shape[0])


def pad_to(grounding: Grounding, shape: tuple) -> Grounding:
    """The grounding padded to `shape` (which `fits` its needs)."""
    relations = {}
    real = {name: r.size for name, r in grounding.relations.items()}
    for (name, relation), (_, size, rules_t) in zip(grounding.relations.items(), shape[0]):
        n = relation.size
        rules = [_pad_rule(rg, n, heads_t - rg.segment_heads.shape[0], rows_t - rg.size, per_head,
                           [real[r] for r in rg.rule.refs])
                 for rg, (heads_t, rows_t, _, per_head, _, _) in zip(relation.rules, rules_t)]
        relations[name] = PaddedRelation(name, relation.keys, rules, size)
    return dataclasses.replace(grounding, relations=relations)


def pad(grounding: Grounding) -> tuple[Grounding, tuple] | None:
    """The grounding padded to its bucketed shape, and that shape; None where it cannot be."""
    need = needs(grounding)
    if need is None:
        return None
    shape = shape_for(need)
    return pad_to(grounding, shape), shape


def raw_tensors(grounding: Grounding) -> list[torch.Tensor]:
    """Every index and column tensor of a grounding, in a fixed order (a trace's inputs)."""
    found = []
    for relation in grounding.relations.values():
        for rg in relation.rules:
            found += [rg.head, *rg.refs, *(rg.columns[i] for i in sorted(rg.columns)), rg.segment_heads, rg.offsets]
    return found


# -- recording and replay ----------------------------------------------------------------------

class Unsupported(Exception):
    """The planner did something a replay could not repeat (data leaving torch)."""


@dataclasses.dataclass(frozen=True)
class _Ref:
    node: int


# calls whose result's shape depends on their arguments' values, not only on their shapes
VARYING_SHAPE = {"unique", "unique_consecutive", "nonzero", "argwhere", "masked_select", "repeat_interleave", "bincount",
                 "to_sparse", "to_sparse_csr", "to_sparse_coo", "coalesce", "histogram", "tolist", "item"}
METADATA = {"__get__", "numel", "dim", "size", "is_floating_point", "is_contiguous", "stride", "__len__"}
ESCAPES = {"numpy", "__array__", "data_ptr", "untyped_storage", "storage", "__reduce_ex__", "__deepcopy__"}


def _seq(value) -> bool:
    """A list or tuple (torch's named result tuples included) but not a shape."""
    return isinstance(value, list | tuple) and not isinstance(value, torch.Size)


def _leaves(value, found: list) -> None:
    if _seq(value):
        for v in value:
            _leaves(v, found)
    elif type(value) is dict:
        for v in value.values():
            _leaves(v, found)
    else:
        found.append(value)


def _flat(value) -> list:
    found: list = []
    _leaves(value, found)
    return found


def _in_place(func, kwargs: dict) -> bool:
    name = getattr(func, "__name__", "")
    return "out" in kwargs or name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))


class _Recorder(TorchFunctionMode):
    def __init__(self, raw: list[torch.Tensor]):
        super().__init__()
        self.nodes: dict[int, int] = {id(t): i for i, t in enumerate(raw)}  # id of a dynamic tensor -> node
        self.count = len(raw)
        self.keep: list = list(raw)  # every tensor seen stays alive: ids are not reused while recording
        self.constants: set[int] = set()  # ids of constants a recorded step reads
        self.steps: list[tuple] = []  # (func, args, kwargs, out nodes, expected python values or None)
        self.raw = len(raw)
        self.seen: set = set()  # metadata guards already recorded (shapes do not change in place)
        self.generation = 0  # in-place writes so far (a repeated check after one is checked again)
        self.varying: set[int] = set()  # nodes whose shape the padded sizes do not fix (a unique's result)

    def _template(self, value):
        if type(value) in (list, tuple):
            return type(value)(self._template(v) for v in value)
        if type(value) is dict:
            return {k: self._template(v) for k, v in value.items()}
        if isinstance(value, torch.Tensor):
            if id(value) in self.nodes:
                return _Ref(self.nodes[id(value)])
            self.constants.add(id(value))
            self.keep.append(value)
        return value

    def _out(self, value):
        if _seq(value):
            return tuple(self._out(v) for v in value)
        if isinstance(value, torch.Tensor):
            self.keep.append(value)
            self.nodes[id(value)] = self.count
            self.count += 1
            return _Ref(self.count - 1)
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs: list = []
        _leaves((args, kwargs), inputs)
        dynamic = any(isinstance(t, torch.Tensor) and id(t) in self.nodes for t in inputs)
        if not dynamic:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in ESCAPES:
            raise Unsupported(f"planning reads a tensor's data outside torch ({name})")
        if _in_place(func, kwargs):
            target = args[0] if args else kwargs.get("out")
            if isinstance(target, torch.Tensor) and id(target) not in self.nodes:
                if id(target) in self.constants:
                    raise Unsupported(f"planning writes batch data into a tensor it read before ({name})")
                self._snapshot(target)
        args_t, kwargs_t = self._template(args), self._template(kwargs)
        out = func(*args, **kwargs)
        writes = _in_place(func, kwargs)
        if writes:
            self.generation += 1
        elif isinstance(out, torch.Tensor) and any(out is t for t in inputs):
            return out  # a conversion to what it already is (.to, .contiguous): the same tensor, the same node
        values: list = []
        _leaves(out, values)
        python = [v for v in values if not isinstance(v, torch.Tensor)]
        expected = copy.deepcopy(out) if python else None
        if expected is not None and (self._known(name, func, args_t, kwargs_t) or self._repeated(func, args_t, kwargs_t)):
            return out
        made = self._out(out)
        if name in VARYING_SHAPE or (name == "where" and len(args) == 1) \
                or (name == "__getitem__" and any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in inputs)) \
                or any(type(r) is _Ref and r.node in self.varying for r in _flat((args_t, kwargs_t))):
            self.varying.update(r.node for r in _flat(made) if type(r) is _Ref)
        self.steps.append((func, args_t, kwargs_t, made, expected))
        return out

    def _known(self, name: str, func, args: tuple, kwargs: dict) -> bool:
        """A metadata read (a shape, a dtype) of a tensor whose shape the padded sizes fix (a
        grounding tensor, or one computed from such by shape-preserving calls), or one already
        recorded: a replay need not check it again."""
        if name not in METADATA:
            return False
        refs: list = []
        _leaves((args, kwargs), refs)
        if not any(r.node in self.varying for r in refs if type(r) is _Ref):
            return True
        try:
            signature = (func, args, tuple(sorted(kwargs.items())))
            if signature in self.seen:
                return True
            self.seen.add(signature)
        except TypeError:  # an unhashable argument: keep the check
            pass
        return False

    def _repeated(self, func, args: tuple, kwargs: dict) -> bool:
        """A check already recorded on the same tensors with no write since (the passes test one
        index several times): a replay need not repeat it."""
        try:
            signature = (self.generation, func, args, tuple(sorted(kwargs.items())))
            if signature in self.seen:
                return True
            self.seen.add(signature)
        except TypeError:
            pass
        return False

    def _snapshot(self, target: torch.Tensor) -> None:
        """A constant about to receive batch data becomes a node: replays start from its copy."""
        self.keep.append(target)
        self.nodes[id(target)] = self.count
        self.steps.append((torch.Tensor.clone, (target.clone(),), {}, _Ref(self.count), None))
        self.count += 1


def _same(expected, found) -> bool:
    """Equal python values (tensors inside are nodes, bound elsewhere)."""
    if isinstance(expected, torch.Tensor):
        return isinstance(found, torch.Tensor)
    if _seq(expected):
        return _seq(found) and len(found) == len(expected) and all(_same(e, f) for e, f in zip(expected, found))
    return type(found) is type(expected) and not isinstance(found, torch.Tensor) and found == expected


class Trace:
    """A recorded planning: the steps that depend on the grounding's tensors, and where their
    results sit in the plan (inputs, and op attributes holding tensors)."""

    def __init__(self, plan: Plan, recorder: _Recorder):
        self.plan = plan
        inputs = {slot: recorder.nodes.get(id(t)) for slot, t in plan.inputs.items()}
        shapes = [(node, tuple(plan.inputs[slot].shape)) for slot, node in inputs.items() if node is not None]
        attrs = {i: {k: recorder.nodes[id(v)] for k, v in op.attrs.items()
                     if isinstance(v, torch.Tensor) and id(v) in recorder.nodes}
                 for i, op in enumerate(plan.ops)}
        attrs = {i: found for i, found in attrs.items() if found}
        self.frame = Frame(plan, [slot for slot, node in inputs.items() if node is not None],
                           [(i, k) for i, found in attrs.items() for k in found])
        nodes = [inputs[slot] for slot in self.frame.inputs] + [attrs[i][k] for i, k in self.frame.attrs]
        self.source, self.run = _straight(_live(recorder, plan), recorder.raw, shapes, nodes)
        self.verified = False

    @staticmethod
    def record(template, grounding: Grounding, dtype: torch.dtype, passes: tuple, outputs: list[str], device: str) -> Trace:
        """Plan `grounding` (padded) while recording; Unsupported where it cannot be replayed."""
        recorder = _Recorder(raw_tensors(grounding))
        with recorder:
            plan = make_plan(template, grounding, dtype, passes, outputs=outputs, device=device)
        return Trace(plan, recorder)

    def replay(self, grounding: Grounding) -> Plan | None:
        """The recorded plan for another grounding of the same shape; None where a guard differs."""
        tensors = self.run(raw_tensors(grounding))
        return None if tensors is None else self.frame.fill(tensors)


class Frame:
    """A recorded plan less its batch tensors: which inputs and op attributes a batch swaps in.
    A replay fills it; so does a process that gets only a batch's tensors (relsql/train/feed/batch_process.py)."""

    def __init__(self, plan: Plan, inputs: list[int], attrs: list[tuple[int, str]]):
        self.plan, self.inputs, self.attrs = plan, inputs, attrs  # input slots, then (op index, attribute)

    def tensors(self, plan: Plan) -> list[torch.Tensor]:
        """The batch tensors of `plan` (a fill of this frame), in `fill`'s order."""
        return [plan.inputs[slot] for slot in self.inputs] + [plan.ops[i].attrs[k] for i, k in self.attrs]

    def fill(self, tensors: list[torch.Tensor]) -> Plan:
        """The recorded plan with a batch's tensors in place of its own (the recorded plan is left alone)."""
        plan = copy.copy(self.plan)
        plan.inputs = {**self.plan.inputs, **dict(zip(self.inputs, tensors))}
        plan.ops = list(self.plan.ops)
        swapped: dict[int, dict] = {}
        for (i, k), tensor in zip(self.attrs, tensors[len(self.inputs):]):
            swapped.setdefault(i, {})[k] = tensor
        for i, found in swapped.items():
            plan.ops[i] = dataclasses.replace(plan.ops[i], attrs={**plan.ops[i].attrs, **found})
        return plan


class _Source:
    """Python source of a replay: recorded nodes as locals (n<node>), everything else the steps
    hold (functions, constants, expected values) as globals (c<k>) of the generated function."""

    def __init__(self) -> None:
        self.scope: dict[str, object] = {"_same": _same}
        self.names: dict[int, str] = {}  # id of a constant -> its global (the scope keeps the constant alive)
        self.read: set[int] = set()  # nodes the source reads

    def constant(self, value) -> str:
        if id(value) not in self.names:
            self.names[id(value)] = name = f"c{len(self.names)}"
            self.scope[name] = value
        return self.names[id(value)]

    def value(self, template) -> str:
        """An expression for a step's argument: a list, tuple or dict holding nodes rebuilt per call."""
        if type(template) is _Ref:
            self.read.add(template.node)
            return f"n{template.node}"
        if type(template) is list:
            return "[" + ", ".join(self.value(v) for v in template) + "]"
        if type(template) is tuple:
            return "(" + "".join(self.value(v) + ", " for v in template) + ")"
        if type(template) is dict:
            return "{" + ", ".join(f"{self.constant(k)}: {self.value(v)}" for k, v in template.items()) + "}"
        return self.constant(template)

    def bind(self, template, value: str, lines: list[str], made: set[int]) -> None:
        """Lines binding the nodes of a step's result (a tuple's items by position)."""
        if type(template) is _Ref:
            lines.append(f"    n{template.node} = {value}")
            made.add(template.node)
        elif type(template) is tuple:
            for i, t in enumerate(template):
                if t is not None:
                    self.bind(t, f"{value}[{i}]", lines, made)

    def guard(self, expected, value: str) -> str:
        """The condition under which `value` is not the recorded python value (_same's test)."""
        if isinstance(expected, torch.Tensor) or _seq(expected):
            return f"not _same({self.constant(expected)}, {value})"
        return f"type({value}) is not {self.constant(type(expected))} or {value} != {self.constant(expected)}"


def _straight(steps: list[tuple], raw: int, shapes: list[tuple[int, tuple]], nodes: list[int]) -> tuple[str, Callable]:
    """The replay of `steps` as one generated straight-line function of the grounding's tensors:
    each step one line calling its recorded function, each guard one test. A Python loop over the
    steps filling argument templates cost ~3 us a step beyond the calls themselves (bench/relgen.py's
    shop at batch 512, 372 steps: 4.9 ms a batch, 3.9 generated). The function returns the batch
    tensors in `nodes`' order, or None where a guard or a shape differs."""
    source, body, made = _Source(), [], set(range(raw))
    for func, args, kwargs, out, expected in steps:
        call = f"{source.constant(func)}({''.join(source.value(a) + ', ' for a in args)}" \
               f"{'**' + source.value(kwargs) if kwargs else ''})"
        if expected is None and type(out) is _Ref:
            source.bind(out, call, body, made)
            continue
        body.append(f"    v = {call}")
        if expected is not None:
            body.append(f"    if {source.guard(expected, 'v')}:\n        return None")
        source.bind(out, "v", body, made)
    for node, shape in shapes:  # a shape the skipped metadata checks took as fixed
        body.append(f"    if n{node}.shape != {source.constant(shape)}:\n        return None")
        source.read.add(node)
    body.append(f"    return [{', '.join(f'n{node}' for node in nodes)}]")
    source.read.update(nodes)
    unset = [f"    n{node} = None" for node in sorted(source.read - made)]  # as the loop's env starts: None
    head = [f"def replay(raw):\n    if len(raw) != {raw}:\n        return None"]
    if raw:
        head.append(f"    ({''.join(f'n{k}, ' for k in range(raw))}) = raw")
    text = "\n".join(head + unset + body) + "\n"
    exec(compile(text, "<relsql replay>", "exec"), source.scope)  # our own generated source, never user text
    return text, source.scope["replay"]


def _live(recorder: _Recorder, plan: Plan) -> list[tuple]:
    """The steps a replay needs: those whose results reach the plan or a guard, and in-place
    writes into such results (kept in their order)."""
    needed = {recorder.nodes[id(t)] for t in plan.inputs.values() if id(t) in recorder.nodes}
    needed |= {recorder.nodes[id(v)] for op in plan.ops for v in op.attrs.values()
               if isinstance(v, torch.Tensor) and id(v) in recorder.nodes}
    kept = []
    for step in reversed(recorder.steps):
        func, args, kwargs, out, expected = step
        outs: list = []
        _leaves(out, outs)
        produced = {r.node for r in outs if type(r) is _Ref}
        if expected is not None or produced & needed or _in_place(func, kwargs):
            kept.append(step)
            reads: list = []
            _leaves((args, kwargs), reads)
            needed |= {r.node for r in reads if type(r) is _Ref}
    # in-place writes are all kept: a view taken before one sees it through shared storage
    return kept[::-1]


def plans_equal(a: Plan, b: Plan) -> bool:
    """The same ops, outputs, weights and (bitwise) input tensors."""
    if a.outputs != b.outputs or list(a.params) != list(b.params) or len(a.ops) != len(b.ops) \
            or any(pa.shape != pb.shape for pa, pb in zip(a.params.values(), b.params.values())):
        return False
    for x, y in zip(a.ops, b.ops):
        if (x.kind, x.out, x.args, x.rows, x.shape) != (y.kind, y.out, y.args, y.rows, y.shape) \
                or x.attrs.keys() != y.attrs.keys() or not all(_equal(x.attrs[k], y.attrs[k]) for k in x.attrs):
            return False
    return a.inputs.keys() == b.inputs.keys() and all(_equal(a.inputs[s], b.inputs[s]) for s in a.inputs)


def _equal(x, y) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.layout != y.layout \
                or x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.layout == torch.sparse_csr:
            return all(torch.equal(p, q) for p, q in ((x.crow_indices(), y.crow_indices()),
                                                       (x.col_indices(), y.col_indices()), (x.values(), y.values())))
        return torch.equal(x, y)
    if type(x) in (list, tuple):
        return type(y) is type(x) and len(x) == len(y) and all(_equal(p, q) for p, q in zip(x, y))
    if callable(x) and callable(y):
        return True  # kernels chosen by name carry functions: same op kind and attrs otherwise
    return x == y


class PlanCache:
    """Batch plans by shape: recorded once per variant (a shape whose guards differ, such as a
    sparse matrix with merged duplicate entries, gets its own trace, up to MAX_VARIANTS), checked
    against a fresh plan on first reuse, then replayed."""

    MAX_VARIANTS = 8
    MAX_SHAPES = 32  # recorded shapes kept (each holds its first batch's plan)
    SLACK = 1.25  # a batch pads up to a recorded shape of at most this much more volume than its own

    def __init__(self, template, dtype: torch.dtype, passes: tuple, outputs: list[str], device: str):
        self.template, self.dtype, self.passes, self.outputs, self.device = template, dtype, passes, outputs, device
        self.traces: dict[tuple, list[Trace]] = {}  # shape key -> its variants, the last one used first
        self.refused: set[tuple] = set()  # shapes whose planning cannot be replayed
        self.stats = {"replayed": 0, "recorded": 0, "fresh": 0}
        self.lock = threading.Lock()

    def fresh(self, grounding: Grounding) -> Plan:
        self.stats["fresh"] += 1
        return make_plan(self.template, grounding, self.dtype, self.passes, outputs=self.outputs, device=self.device)

    def plan(self, grounding: Grounding) -> Plan:
        """The batch's plan: replayed where a recorded variant of its shape fits, else made."""
        return self.traced(grounding)[0]

    def traced(self, grounding: Grounding) -> tuple[Plan, Trace | None]:
        """The batch's plan and the trace it fills (None: planned afresh)."""
        with self.lock:  # the traces and refused shapes change as batches come
            return self._plan(grounding)

    def _plan(self, grounding: Grounding) -> tuple[Plan, Trace | None]:
        need = needs(grounding)
        if need is None:
            return self.fresh(grounding), None
        key = self._shape(need)
        padded_grounding = pad_to(grounding, key)
        if key in self.refused or (key not in self.traces and len(self.traces) >= self.MAX_SHAPES):
            return self.fresh(grounding), None
        variants = self.traces.setdefault(key, [])
        for i, trace in enumerate(reversed(variants)):
            plan = trace.replay(padded_grounding)
            if plan is None:
                continue
            if not trace.verified and not self._verify(trace, plan, padded_grounding, key):
                return self.fresh(grounding), None
            variants.append(variants.pop(len(variants) - 1 - i))
            self.stats["replayed"] += 1
            return plan, trace
        if len(variants) >= self.MAX_VARIANTS:
            return self.fresh(grounding), None
        try:
            trace = Trace.record(self.template, padded_grounding, self.dtype, self.passes, self.outputs, self.device)
        except Unsupported:
            self.refused.add(key)
            return self.fresh(grounding), None
        variants.append(trace)
        self.stats["recorded"] += 1
        return trace.plan, trace

    def _shape(self, need: tuple) -> tuple:
        """The smallest recorded shape `need` pads to, if at most SLACK times its own bucketed
        shape's volume; else that bucketed shape."""
        own = shape_for(need)
        if own in self.traces:
            return own
        limit = volume(own) * self.SLACK
        fitting = [shape for shape, variants in self.traces.items()
                   if variants and shape not in self.refused and volume(shape) <= limit and fits(need, shape)]
        return min(fitting, key=volume) if fitting else own

    def _verify(self, trace: Trace, plan: Plan, grounding: Grounding, key: tuple) -> bool:
        """A trace's first replay against a fresh plan of the same batch: reuse of the shape stops
        at any difference (planning that depends on data the recorder did not see)."""
        if not plans_equal(plan, self.fresh(grounding)):
            self.refused.add(key)
            return False
        trace.verified = True
        return True
