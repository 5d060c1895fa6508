"""The plan IR: a flat list of vectorized ops over numbered slots, built from IR + groundings.

One op handles every grounding of a rule at once. Shapes are found by running each op's kernel
on one-row stand-ins while building (relsql/compile/shapes.py), so shape rules live in one
place (the kernels) and a mismatch is reported at compile time with the rule that caused it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from relsql.compile import compress, kernels, shapes, sparse
from relsql.errors import ShapeError
from relsql.ground.execute import Grounding, RuleGrounding
from relsql.template import ir


@dataclass(eq=False)  # an op is itself: passes look ops up in lists, and comparing fields was 10% of planning
class Op:
    kind: str  # param gather linear binary act combine segment scatter broadcast sum as_row
    out: int
    args: tuple[int, ...] = ()
    attrs: dict = field(default_factory=dict)
    rows: int = 0
    shape: tuple[int, ...] = ()
    note: str = ""


@dataclass
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    kind: str
    init: list | float | None
    fixed: bool
    external: bool = False  # its value comes from outside the module (an embedding kept in the database)
    blocks: int = 1  # a block-diagonal linear's blocks (relsql/compile/members.py)


@dataclass
class Plan:
    ops: list[Op] = field(default_factory=list)
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)  # index tensors, columns
    params: dict[str, ParamSpec] = field(default_factory=dict)
    outputs: dict[str, int] = field(default_factory=dict)  # relation -> slot
    slots: int = 0
    meta: dict[int, torch.Tensor] = field(default_factory=dict)  # slot -> meta tensor (shapes)
    log: list[str] = field(default_factory=list)  # what each optimizer pass changed
    param_slots: set[int] = field(default_factory=set)  # slots holding a weight (no row dimension)
    device: str = "cpu"  # the device type the plan will run on: cost and timing decisions are made for it
    # classes of an input's rows the builder found while compressing (None: more than half of them
    # distinct), so that deduplicate_rows does not classify a wide feature matrix a second time
    row_classes: dict[int, torch.Tensor | None] = field(default_factory=dict)

    def new_slot(self) -> int:
        self.slots += 1
        return self.slots - 1

    def add_input(self, tensor: torch.Tensor) -> int:
        slot = self.new_slot()
        self.inputs[slot] = tensor
        self.meta[slot] = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        return slot


def make_op(plan: Plan, op_kind: str, args: tuple[int, ...], note: str, row_count: int | None = None, **attrs) -> Op:
    """A new op writing a new slot; its shape comes from running the kernel on small stand-ins.

    `row_count` overrides the row rule where a weight is read as rows (an embedding table an op
    was moved in front of), which the rules take for a weight without a row dimension.
    """
    slot = plan.new_slot()
    metas = [plan.meta[a] for a in args]
    try:
        out = shapes.infer(op_kind, metas, attrs, [a in plan.param_slots for a in args], row_count)
    except (ValueError, RuntimeError, IndexError) as err:
        raise ShapeError(f"{note}: {op_kind} does not fit the shapes {[tuple(m.shape[1:]) for m in metas]}: {err}") from None
    shapes.check_size(tuple(out.shape), out.dtype, note, "use smaller widths (the d of linear(x, d) and embed(c, d)), "
                      "or train on mini-batches (batch_size=...) so that fewer rows are in memory at once")
    plan.meta[slot] = out
    return Op(op_kind, slot, args, attrs, rows=out.shape[0] if out.dim() else 1, shape=tuple(out.shape[1:]), note=note)


EXACT_CLASSES_BELOW = 10_000  # smaller rules get their exact grounding classes (they are cheap there)


class PlanBuilder:
    """Translates each rule's expression into ops, tracking levels: constant, grounding, head."""

    context: type | None = None  # a _RuleContext subclass to use instead (relsql/explain records the plan's inputs)

    def __init__(self, template: ir.Template, grounding: Grounding, dtype: torch.dtype, compress: bool = False):
        self.template = template
        self.grounding = grounding
        self.dtype = dtype
        self.compress = compress
        self.classes: dict[str, torch.Tensor] = {}  # relation -> structural class of each row
        self.compressed = 0
        self._memo: dict = {}  # grounding classes and (segment, class) pairs per rule grounding
        self.plan = Plan()
        self._param_slots: dict[str, int] = {}

    # -- slots ---------------------------------------------------------------------------
    def _input(self, tensor: torch.Tensor) -> int:
        return self.plan.add_input(tensor)

    def _emit(self, op_kind: str, args: tuple[int, ...], note: str, **attrs) -> int:
        op = make_op(self.plan, op_kind, args, note, **attrs)
        self.plan.ops.append(op)
        return op.out

    def _param(self, name: str, input_shape: tuple[int, ...] | None, note: str) -> int:
        spec = self.template.weights[name]
        if name in self._param_slots:
            return self._param_slots[name]
        shape = list(spec.shape)
        if spec.kind == "typed":  # one (out, in) matrix per value of the type column
            if input_shape is None or len(input_shape) != 1:
                raise ShapeError(f"{spec.origin}: typed linear '{name}' needs a vector input, got shape {input_shape}")
            shape = [max(int(self.grounding.vocab_sizes.get(name, 0)), 1), shape[0], input_shape[0]]
        elif None in shape:
            if spec.kind == "embed":
                shape[0] = max(int(self.grounding.vocab_sizes.get(name, 0)), 1)
            else:
                if input_shape is None or len(input_shape) != 1:
                    raise ShapeError(f"{spec.origin}: linear '{name}' needs a vector input, got shape {input_shape}")
                shape[shape.index(None)] = input_shape[0]
        final = tuple(int(s) for s in shape)
        if spec.blocks > 1 and (len(final) != 2 or final[0] % spec.blocks or final[1] % spec.blocks):
            raise ShapeError(f"{spec.origin}: linear '{name}' in {spec.blocks} blocks needs an input width that is a "
                             f"multiple of {spec.blocks}, got {final[1] if len(final) == 2 else input_shape}")
        shapes.check_size(final, self.dtype, f"{spec.origin}: weight '{name}'", "use a smaller width, or fewer categories "
                          "(embed a column with fewer distinct values)")
        self.plan.params[name] = ParamSpec(name, final, spec.kind, spec.init, spec.fixed,
                                           external=spec.kind == "embed" and spec.storage == "database",
                                           blocks=spec.blocks)
        slot = self.plan.new_slot()
        self.plan.meta[slot] = torch.empty(final, dtype=self.dtype, device="meta")
        self.plan.param_slots.add(slot)
        self.plan.ops.append(Op("param", slot, (), {"name": name}, rows=1, shape=final, note=note))
        self._param_slots[name] = slot
        return slot

    # -- relations -----------------------------------------------------------------------
    def build(self) -> Plan:
        for name, relation_grounding in self.grounding.relations.items():
            relation = self.template.relations[name]
            size = relation_grounding.size
            parts = [self._rule(rg, size) for rg in relation_grounding.rules]
            if self.compress:
                self.classes[name] = self._relation_classes(relation_grounding, size)
            note = f"{name}"
            if not parts:
                self.plan.outputs[name] = self._input(torch.zeros((size, 1), dtype=self.dtype))
                continue
            value = parts[0] if len(parts) == 1 else self._emit("sum", tuple(parts), note)
            if relation.offset is not None:
                shape = tuple(self.plan.meta[value].shape[1:])
                offset = self._param(relation.offset, None, note)
                if math.prod(self.plan.meta[offset].shape) != math.prod(shape):
                    raise ShapeError(f"{name}: offset '{relation.offset}' of shape {tuple(self.plan.meta[offset].shape)} "
                                     f"does not fit values of shape {shape}")
                covered = torch.zeros(size, dtype=torch.bool)
                for rg in relation_grounding.rules:
                    if rg.rule.offset_applies:
                        covered[rg.segment_heads] = True
                if not bool(covered.all()):  # only atoms grounded by a head-weighted rule get it
                    mask = self._input(covered.to(self.dtype).reshape(size, *([1] * len(shape))))
                    offset = self._emit("binary", (mask, offset), note, op="*", reshape_right=shape)
                    value = self._emit("binary", (value, offset), note, op="+")
                else:
                    value = self._emit("binary", (value, offset), note, op="+", reshape_right=shape)
            if relation.activation not in (None, "identity"):
                value = self._emit("act", (value,), note, name=relation.activation)
            if self.compress:
                value = self._rows_once(name, value, size)
            self.plan.outputs[name] = value
        if self.compress:
            self.plan.log.append(f"compress_groundings: {self.compressed} rules evaluated once per class of identical groundings")
        return self.plan

    # -- isomorphic compression ------------------------------------------------------------
    def _rows_once(self, name: str, value: int, size: int) -> int:
        """A relation whose rows fall into few structural classes is read as its representatives'
        rows, gathered back; the optimizer pulls the first gather into the ops before it, so those
        compute one row per class (an atom embedding per element type, not per atom)."""
        classes = self.classes[name]
        k = int(classes.max()) + 1 if classes.numel() else 0
        if size < 64 or k > size // 2:
            return value
        note = f"{name} (one row per class)"
        reps = self._input(compress.representatives(classes, k))
        value = self._emit("gather", (value, reps), note, relation="row classes")
        return self._emit("gather", (value, self._input(classes)), note, relation="row classes")

    def _grounding_classes(self, rg: RuleGrounding) -> torch.Tensor:
        if id(rg) not in self._memo:
            self._memo[id(rg)] = self._classes_of_groundings(rg)
        return self._memo[id(rg)]

    def _classes_of_groundings(self, rg: RuleGrounding) -> torch.Tensor:
        """A grounding's class: the tuple of its body rows' classes and its column values, the
        columns a features(...) or encoder reads taken together as the plan reads them (in its
        dtype: values equal there compute equally). A large rule whose groundings are known to be
        mostly distinct (more than half, from the cheapest parts first: row classes, codes, then
        values by width) is not compressed, and each of its groundings is its own class: finer than
        exact, which is always sound (equal class still means equal value), and it saves
        classifying the rest in full. The classes found for a value are kept for deduplicate_rows."""
        columns = [self.classes[r][index] if r in self.classes else index for r, index in zip(rg.rule.refs, rg.refs)]
        groups = self._value_groups(rg)
        if rg.size < EXACT_CLASSES_BELOW:
            return compress.combine(columns + [self._group_classes(rg, key, None) for key in groups], rg.size)
        limit = rg.size // 2
        found = compress.combine(columns, rg.size)
        for key in sorted(groups, key=lambda k: groups[k][0].numel() if groups[k].shape[0] else 0):
            if columns and compress.class_count(found) > limit:
                return torch.arange(rg.size)  # the rest (wider values) left unread
            classes = self._group_classes(rg, key, limit)
            if classes is None:
                return torch.arange(rg.size)
            found = compress.combine([found, classes], rg.size) if columns else classes
            columns.append(classes)
        return found

    def _value_groups(self, rg: RuleGrounding) -> dict[tuple, torch.Tensor]:
        """The rule's columns as the plan reads them: each features(...)/encoder's columns
        concatenated in the plan's dtype (the tensor the plan's input will be), others alone, raw."""
        key = ("groups", id(rg))
        if key not in self._memo:
            groups, used = {}, set()
            for e in ir.walk(rg.rule.expr):
                if isinstance(e, ir.Features | ir.Encode) and e.columns and not used & set(e.columns) \
                        and all(rg.columns[c].dim() == 2 and rg.columns[c].is_floating_point() for c in e.columns):
                    parts = [rg.columns[c] for c in e.columns]  # written in the plan's dtype: one pass, not two
                    groups[tuple(e.columns)] = torch.cat(parts, dim=1, out=torch.empty(
                        (rg.size, sum(p.shape[1] for p in parts)), dtype=self.dtype))
                    used |= set(e.columns)
            groups.update({(k,): c for k, c in rg.columns.items() if k not in used})
            self._memo[key] = groups
        return self._memo[key]

    def _group_classes(self, rg: RuleGrounding, columns: tuple, limit: int | None) -> torch.Tensor | None:
        key = ("group classes", id(rg), columns)
        if key not in self._memo:
            self._memo[key] = compress.classes_of(self._value_groups(rg)[columns], limit)
        return self._memo[key]

    def known_values(self, rg: RuleGrounding, columns: tuple) -> tuple[torch.Tensor | None, bool, object]:
        """(the concatenated tensor the builder classified for these columns, whether its classes
        are known, the classes or None for more than half distinct)."""
        groups = self._memo.get(("groups", id(rg)), {})
        key = ("group classes", id(rg), columns)
        return groups.get(columns), key in self._memo, self._memo.get(key)

    def pairs(self, rg: RuleGrounding, segment_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(segment, grounding class, multiplicity) of a grouped rule, computed once."""
        key = ("pairs", id(rg))
        if key not in self._memo:
            self._memo[key] = compress.pairs(segment_ids, self._grounding_classes(rg))
        return self._memo[key]

    def _relation_classes(self, relation_grounding, size: int) -> torch.Tensor:
        per_rule = []
        for rg in relation_grounding.rules:
            cls = self._grounding_classes(rg)
            heads = torch.full((size,), -1, dtype=torch.int64)
            if rg.rule.grouped and rg.size > rg.segment_heads.shape[0]:
                counts = rg.offsets[1:] - rg.offsets[:-1]
                ids = torch.repeat_interleave(torch.arange(counts.shape[0]), counts)
                found = compress.distinct_segments(ids, cls, counts.shape[0])
                heads[rg.segment_heads] = (found if found is not None
                                           else compress.segment_signatures(self.pairs(rg, ids), counts.shape[0]))
            else:  # one grounding per head (always so for a per-row rule): the head's class is that grounding's
                heads[rg.head] = cls
            per_rule.append(heads)
        return compress.combine(per_rule, size)

    def _classes_are_rows(self, rg: RuleGrounding, k: int) -> bool:
        """A rule that reads one relation's rows (a message-passing edge) and whose classes are
        nearly as many as the rows it reads gains nothing from compression: the sparse passes
        already compute once per row read. Compressing would only add a gather of representatives
        (on 10M edges of a random graph: a 10M-entry sparse matrix re-sorted to fold it away)."""
        if len(rg.refs) != 1 or rg.columns:
            return False
        read = int(torch.count_nonzero(torch.bincount(rg.refs[0]))) if rg.refs[0].numel() else 0
        return k > read // 2

    def _rule(self, rg: RuleGrounding, size: int) -> int:
        rule = rg.rule
        note = f"{rule.head} {rule.origin}"
        ctx = (self.context or _RuleContext)(rg, self, note)
        if self.compress and rg.size >= 64:
            cls = self._grounding_classes(rg)
            k = int(cls.max()) + 1 if cls.numel() else 0
            if k <= rg.size // 2 and not self._classes_are_rows(rg, k):
                ctx.compress(cls, k)
                self.compressed += 1
        if ctx.classes is None:
            ctx.sort_by_type(rule.expr)
        slot, level = ctx.compile(rule.expr)
        if level == "g" and ctx.classes is not None:  # a per-row rule ran once per class: back to every row
            slot = self._emit("gather", (slot, ctx.tensor("classes", ctx.classes)), note, relation="row classes")
        if level == "c":
            slot = self._emit("broadcast", (slot,), note, rows=rg.segment_heads.shape[0])
            level = "h"
        if level == "g":  # per-row statement: every grounding is its own head
            index = rg.head if ctx.permutation is None else rg.head[ctx.permutation]
        else:
            index = rg.segment_heads
        if index.shape[0] == size and bool(torch.equal(index, torch.arange(size))):
            return slot
        if ctx.permutation is not None and index.shape[0] == size and bool((torch.bincount(index, minlength=size) == 1).all()):
            # every row once, in type order: a gather by the inverse order (it composes with the
            # gathers that read the relation), not a scatter into zeros
            inverse = torch.empty_like(index)
            inverse[index] = torch.arange(size)
            return self._emit("gather", (slot, ctx.tensor("rows_from_type_order", inverse)), note, relation="row order")
        return self._emit("scatter", (slot, ctx.tensor("heads", index)), note, rows=size)


class _RuleContext:
    def __init__(self, rg: RuleGrounding, builder: PlanBuilder, note: str):
        self.rg = rg
        self.b = builder
        self.note = note
        self._cache: dict[str, int] = {}
        self.refs, self.columns, self.rows = rg.refs, rg.columns, rg.size
        self.classes: torch.Tensor | None = None  # grounding classes when compressed
        self.permutation: torch.Tensor | None = None  # the groundings in type order: position i holds grounding permutation[i]

    def compress(self, classes: torch.Tensor, k: int) -> None:
        """Evaluate per-grounding parts on one representative grounding per class."""
        rep = compress.representatives(classes, k)
        self.classes, self.rows = classes, k
        self.refs = [r[rep] for r in self.rg.refs]
        self.columns = {i: c[rep] for i, c in self.rg.columns.items()}

    def sort_by_type(self, expr: ir.Expr) -> None:
        """A rule with a typed linear computes its groundings in the order of the type (stable):
        each type's rows are then contiguous, and the typed linears multiply slices with no
        gather into type order and back on every call, forwards and backwards. Values are
        gathered back into grounding order where they are aggregated (the sparse passes fold
        that gather into their matrices; an attention's value: into its column indices), and a
        per-row rule's rows by a gather into row order (which composes with its readers' gathers)."""
        stack, column = [expr], None
        while stack and column is None:
            node = stack.pop()
            column = node.types if isinstance(node, ir.Apply) and node.types is not None else None
            stack.extend(node.children())
        if column is None:
            return
        types = self.columns[column]
        if sparse.is_sorted(types):
            return
        order = torch.argsort(types, stable=True)
        self.permutation = order
        self.refs = [r[order] for r in self.refs]
        self.columns = {i: c[order] for i, c in self.columns.items()}

    def regroup(self, x: int) -> int:
        """Per-grounding values (computed once per class, or in type order) in grounding order."""
        if self.classes is not None:  # per class: back to every grounding
            return self.b._emit("gather", (x, self.tensor("classes", self.classes)), self.note, relation="grounding classes")
        if self.permutation is not None:
            inverse = torch.empty_like(self.permutation)
            inverse[self.permutation] = torch.arange(self.permutation.shape[0])
            return self.b._emit("gather", (x, self.tensor("type_order_inverse", inverse)), self.note, relation="grounding order")
        return x

    def tensor(self, key: str, tensor: torch.Tensor) -> int:
        if key not in self._cache:
            self._cache[key] = self.b._input(tensor)
        return self._cache[key]

    def values(self, key: str, columns: tuple[int, ...]) -> int:
        """Columns encoded in SQL, side by side in the plan's dtype: the tensor the builder already
        made (and classified) when every grounding is computed in order, with its known classes."""
        if key in self._cache:
            return self._cache[key]
        made, known, classes = self.b.known_values(self.rg, tuple(columns))
        if made is None or self.classes is not None or self.permutation is not None:
            return self.tensor(key, torch.cat([self.columns[c] for c in columns], dim=1).to(self.b.dtype))
        slot = self.tensor(key, made)
        if known:
            self.b.plan.row_classes[slot] = classes
        return slot

    def segments(self) -> tuple[int, int]:
        counts = self.rg.offsets[1:] - self.rg.offsets[:-1]
        ids = torch.repeat_interleave(torch.arange(counts.shape[0]), counts)
        return self.tensor("segment_ids", ids), self.tensor("counts", counts)

    def compile(self, expr: ir.Expr) -> tuple[int, str]:  # noqa: C901 - one branch per IR expression kind
        b, note = self.b, self.note
        if isinstance(expr, ir.Ref):
            relation = self.rg.rule.refs[expr.index]
            source = b.plan.outputs[relation]
            return b._emit("gather", (source, self.tensor(f"ref{expr.index}", self.refs[expr.index])), note,
                           relation=relation), "g"
        if isinstance(expr, ir.Column):
            return self.tensor(f"col{expr.index}", self.columns[expr.index].to(b.dtype)), "g"
        if isinstance(expr, ir.Features):
            return self.values(f"features{expr.columns}", expr.columns), "g"
        if isinstance(expr, ir.Encode):
            return self.values(f"encode_{expr.kind}{expr.columns}", expr.columns), "g"
        if isinstance(expr, ir.Text):
            weight = b._param(expr.weight, None, note)
            ids = self.tensor(f"text{expr.column}", self.columns[expr.column].to(torch.int64))  # exact integers
            return b._emit("bag", (weight, ids), note, pad=expr.buckets), "g"
        if isinstance(expr, ir.LayerNorm):
            x, level = self.compile(expr.arg)
            width = tuple(b.plan.meta[x].shape[1:])
            if len(width) != 1:
                raise ShapeError(f"{note}: layer_norm needs a vector per row, got shape {width}")
            gain, bias = b._param(expr.gain, width, note), b._param(expr.bias, width, note)
            return b._emit("layer_norm", (x, gain, bias), note), level
        if isinstance(expr, ir.Dropout):
            x, level = self.compile(expr.arg)
            return b._emit("dropout", (x,), note, p=expr.p), level
        if isinstance(expr, ir.Embed):
            weight = b._param(expr.weight, None, note)
            return b._emit("gather", (weight, self.tensor(f"col{expr.column}", self.columns[expr.column])), note,
                           relation=expr.weight), "g"
        if isinstance(expr, ir.Param):
            weight = b._param(expr.weight, None, note)
            return b._emit("as_row", (weight,), note), "c"
        if isinstance(expr, ir.Const):
            return self.tensor(f"const{expr.value}", torch.full((1, 1), expr.value, dtype=b.dtype)), "c"
        if isinstance(expr, ir.Apply):
            x, level = self.compile(expr.arg)
            weight = b._param(expr.weight, tuple(b.plan.meta[x].shape[1:]), note)
            if expr.types is None:
                return b._emit("linear", (weight, x), note), level
            if level != "g":
                raise ShapeError(f"{note}: typed linear '{expr.weight}' chooses its matrix per grounding; its input "
                                 "must be a per-grounding value (not an aggregate or a constant)")
            types = self.columns[expr.types]
            kinds = b.plan.meta[weight].shape[0]
            order = self.tensor(f"type_order{expr.types}", torch.argsort(types, stable=True))
            counts = self.tensor(f"type_counts{expr.types}_{kinds}", torch.bincount(types, minlength=kinds))
            in_order = sparse.is_sorted(types)  # each type's rows contiguous
            return b._emit("typed_linear", (weight, x, order, counts), note, **({"sorted": True} if in_order else {})), level
        if isinstance(expr, ir.Binary):
            (left, l1), (right, l2) = self.compile(expr.left), self.compile(expr.right)
            return b._emit("binary", (left, right), note, op=expr.op), _level(l1, l2, note)
        if isinstance(expr, ir.Act):
            x, level = self.compile(expr.arg)
            attrs = ({} if expr.param is None else {"heads": int(expr.param)} if expr.name == "sum_per_head"
                     else {"slope": expr.param})
            return b._emit("act", (x,), note, name=expr.name, **attrs), level
        if isinstance(expr, ir.Combine):
            parts = [self.compile(a) for a in expr.args]
            level = "c"
            for _, lv in parts:
                level = _level(level, lv, note)
            return b._emit("combine", tuple(s for s, _ in parts), note, kind=expr.kind), level
        if isinstance(expr, ir.Attention):
            parts = []
            for part in (expr.arg, expr.value):
                x, level = self.compile(part)
                if level == "c":
                    x = b._emit("broadcast", (x,), note, rows=self.rows)
                parts.append(self.regroup(x))  # every grounding's own softmax weight, in grounding order
            ids, counts = self.segments()
            return b._emit("attention", (*parts, ids, counts), note, mode=expr.mode), "h"
        if isinstance(expr, ir.Agg):
            x, level = self.compile(expr.arg)
            if level == "c":
                x = b._emit("broadcast", (x,), note, rows=self.rows)
            if expr.kind == "concat":
                return self._concat(x), "h"
            ids, counts = self.segments()
            if self.classes is not None:
                if expr.kind in ("sum", "avg") and b.plan.meta[x].dim() == 2:
                    matrix = compress.multiplicity_matrix(b.pairs(self.rg, b.plan.inputs[ids]), b.plan.inputs[counts],
                                                          self.rows, expr.kind == "avg")
                    return b._emit("spmm", (self.tensor(f"multiplicity_{expr.kind}", matrix), x), note), "h"
            x = self.regroup(x)
            return b._emit("segment", (x, ids, counts), note, kind=expr.kind), "h"
        raise TypeError(f"unknown expression node {expr!r}")


    def _concat(self, x: int) -> int:
        """NeuraLogic's concat aggregation: a head's groundings (in grounding order: by body row
        ids, then columns) side by side in one vector; every head needs as many groundings."""
        b = self.b
        x = self.regroup(x)
        counts = self.rg.offsets[1:] - self.rg.offsets[:-1]
        if counts.numel() and bool((counts != counts[0]).any()):
            raise ShapeError(f"{self.note}: a concat aggregation needs the same number of groundings for every head "
                             f"(found {int(counts.min())} to {int(counts.max())}): the result's width would vary")
        width = int(counts[0]) if counts.numel() else 1
        return b._emit("dense_reduce", (x,), self.note, kind="concat", width=width)


def _level(a: str, b: str, note: str) -> str:
    if a == "c":
        return b
    if b == "c" or a == b:
        return a
    raise ShapeError(f"{note}: mixes per-grounding values with aggregated ones; wrap the per-grounding part in an aggregate")


RuleContext = _RuleContext  # what a PlanBuilder.context subclasses (relsql/explain/inputs.py)


def build_plan(template: ir.Template, grounding: Grounding, dtype: torch.dtype, compress: bool = False) -> Plan:
    return PlanBuilder(template, grounding, dtype, compress).build()


__all__ = ["Op", "Plan", "ParamSpec", "build_plan", "kernels"]
