"""An activation overwrites its input when nothing else needs that input.

The result of a weight product, a sparse product or a sum is read once by the activation that
follows it, and none of those ops keeps its own output for the backward pass; applying the
activation in place saves allocating (and first touching) one more tensor of the layer's size.
"""

from __future__ import annotations

from relsql.compile.passes._rewrite import only_reader, producers, readers
from relsql.compile.plan import Plan

IN_PLACE = {"relu", "tanh", "sigmoid", "leaky_relu", "exp"}
# their backward does not read their result (sparse attention keeps its weights and source, not its output)
OUTPUT_FREE = {"affine", "linear", "stacked_linear", "spmm", "addspmm", "sum", "sparse_attention"}


def inplace_activations(plan: Plan) -> Plan:
    made, reads, made_by = 0, readers(plan), producers(plan)
    for op in plan.ops:
        if op.kind != "act" or op.attrs["name"] not in IN_PLACE:
            continue
        if op.attrs["name"] == "leaky_relu" and op.attrs.get("slope", 0.01) < 0:
            continue  # torch's in-place leaky_relu has no backward for a negative slope
        producer = made_by.get(op.args[0])
        if producer is not None and producer.kind in OUTPUT_FREE and only_reader(plan, producer.out, op, reads) \
                and producer.rows == op.rows and producer.shape == op.shape \
                and not (producer.kind == "sum" and len(producer.args) < 2):  # a one-term sum is its term
            op.attrs = {**op.attrs, "inplace": True}
            made += 1
    plan.log.append(f"inplace_activations: {made} activations applied in place")
    return plan
