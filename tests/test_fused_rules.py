"""The fused rules for binary ops, weights read as rows (as_row, weight_rows), combinations of
broadcast values (a (n, 1) column or a one-row constant among (n, m) values; element products)
segment reductions (sum, avg, max, min, count; ties, empty segments, an extreme of exactly 0) and
bags of hashed buckets (a row of only padding, a bucket read twice) and a row broadcast over rows:
values and gradients equal the op-by-op plan's (autograd), the generated backward equals finite
differences, and a FusedStep over them equals the regular path. Mutagenesis' templates, which
use them, fuse (whatever their size) and agree with op by op."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.test_small_plans import Build, assert_same, column, fused_gradcheck


def broadcast_net():
    b = Build()
    x = b.input(torch.tensor([[0.3, -1.0, 0.5], [1.2, 0.5, -0.2], [-0.7, 0.8, 0.1], [0.4, 0.0, -0.9]], dtype=torch.float64))
    c = b.input(column(0.5, -1.5, 2.0, 0.25))
    one = b.input(torch.tensor([[0.7]], dtype=torch.float64))  # a one-row constant
    vec = b.weight("vec", torch.tensor([0.2, -0.4, 0.9], dtype=torch.float64))
    row = b.op("as_row", vec)  # (1, 3)
    col = b.weight("col", torch.tensor([[0.3], [-0.6], [1.1]], dtype=torch.float64))  # (3, 1) column weights
    col2 = b.weight("col2", torch.tensor([[-0.2], [0.5], [0.8]], dtype=torch.float64))
    stacked = b.op("weight_rows", col, col2, col)  # (3, 3), one weight read twice
    scale = b.input(column(2.0, -0.5, 3.0))
    scaled = b.op("weight_rows", col2, col, col2, scale, scaled=True)
    h = b.op("act", b.op("linear", b.weight("m", torch.tensor([[0.4, -0.2, 0.1], [0.1, 0.9, -0.3], [-0.6, 0.3, 0.2]],
                                                               dtype=torch.float64)), x), name="tanh")  # (4, 3)
    plus = b.op("binary", h, row, op="+")  # broadcast over rows
    minus = b.op("binary", plus, b.weight("flat", torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)), op="-",
                 reshape_right=(3,))
    times = b.op("binary", minus, c, op="*")  # (4, 3) * (4, 1)
    summed = b.op("combine", times, c, h, one, kind="sum")  # a column and a one-row constant among (4, 3)
    avg = b.op("combine", c, times, kind="avg")
    product = b.op("combine", h, times, c, h, kind="elementproduct")  # h twice
    rows = b.op("linear", stacked, b.op("act", summed, name="sigmoid"))
    rows2 = b.op("linear", scaled, product)
    return b.net(summed=summed, avg=avg, product=product, rows=rows, rows2=rows2)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fused_step_over_broadcast_rules(optimizer):
    from tests.test_fused_step import trained

    make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.001), "adam": lambda ps: torch.optim.Adam(ps, lr=0.01)}[optimizer]
    ours, our_losses, _ = trained(broadcast_net, make, 6)
    theirs, their_losses, _ = trained(broadcast_net, make, 0, 6)
    assert their_losses[-1] < their_losses[0]
    for n in theirs:
        torch.testing.assert_close(ours[n], theirs[n], rtol=0, atol=1e-12)
    assert our_losses == pytest.approx(their_losses, abs=1e-12, rel=0)


def segment_net(ties: bool = True):
    """Groundings of 7 rows into 4 segments (segment 2 empty) reduced each way, then mixed by a
    weight so that every reduction's gradient reaches the weights. With `ties`, equal rows in a
    segment share its max/min, and one segment's max is exactly 0 (torch counts one more share)."""
    b = Build()
    x = b.input(torch.tensor([[0.3, -1.0], [1.2, 0.5], [0.9, 0.2], [-0.7, 0.8], [0.4, -0.3], [1.1, 0.6], [-0.2, 0.7]],
                             dtype=torch.float64))
    w = b.weight("w", torch.tensor([[0.4, -0.2], [0.1, 0.9]], dtype=torch.float64))
    h = b.op("linear", w, x)  # (7, 2): values that depend on a weight
    if ties:
        h = b.op("gather", b.op("act", h, name="relu"), b.input(torch.tensor([0, 1, 1, 3, 4, 5, 5])))  # rows 1, 2 and
        # rows 5, 6 equal; relu makes zeros
    ids = b.input(torch.tensor([0, 0, 1, 1, 3, 3, 3]))
    counts = b.input(torch.tensor([2, 2, 0, 3]))
    mixed = b.weight("mix", torch.tensor([[0.7, -0.3], [0.2, 0.5]], dtype=torch.float64))
    outs = {}
    for kind in ("sum", "avg", "max", "min", "count"):
        reduced = b.op("segment", h, ids, counts, kind=kind)
        outs[kind] = b.op("act", b.op("linear", mixed, reduced) if kind != "count" else reduced, name="tanh")
    return b.net(**outs)


def bag_net():
    """Rows' bucket ids (3 slots, padding 4: the table's last row) averaged, then mixed and squashed."""
    b = Build()
    table = b.weight("buckets", torch.tensor([[0.3, -1.0, 0.5], [1.2, 0.5, -0.2], [-0.7, 0.8, 0.1], [0.4, 0.0, -0.9],
                                              [0.0, 0.0, 0.0]], dtype=torch.float64))
    ids = b.input(torch.tensor([[0, 2, 4], [1, 1, 3], [4, 4, 4], [3, 4, 4]]))  # row 2: only padding
    bag = b.op("bag", table, ids, pad=4)
    mixed = b.op("linear", b.weight("mix", torch.tensor([[0.7, -0.3, 0.2], [0.2, 0.5, -0.4]], dtype=torch.float64)), bag)
    return b.net(out=b.op("act", mixed, name="tanh"))


def broadcast_rows_net():
    """A one-row value repeated over 4 rows (a view): added to row values, and an output itself."""
    b = Build()
    one = b.op("act", b.op("as_row", b.weight("row", torch.tensor([0.2, -0.4, 0.9], dtype=torch.float64))), name="tanh")
    spread = b.op("broadcast", one, rows=4)
    x = b.input(torch.tensor([[0.3, -1.0, 0.5], [1.2, 0.5, -0.2], [-0.7, 0.8, 0.1], [0.4, 0.0, -0.9]], dtype=torch.float64))
    mixed = b.op("linear", b.weight("mix", torch.tensor([[0.7, -0.3, 0.2], [0.2, 0.5, -0.4]], dtype=torch.float64)),
                 b.op("binary", x, spread, op="*"))
    return b.net(out=b.op("act", mixed, name="sigmoid"), spread=spread)


def added_net():
    """Values added to an affine product (a full one and a one-row one broadcast over the rows) and
    to a dense matrix's product (addspmm): each gradient is the result's, summed back where broadcast."""
    b = Build()
    x = b.input(torch.tensor([[0.3, -1.0], [1.2, 0.5], [-0.7, 0.8], [0.4, 0.0]], dtype=torch.float64))
    w = b.weight("w", torch.tensor([[0.4, -0.2], [0.1, 0.9], [-0.6, 0.3]], dtype=torch.float64))
    full = b.op("act", b.op("linear", b.weight("v", torch.tensor([[0.2, 0.5], [-0.3, 0.1], [0.7, -0.4]],
                                                                  dtype=torch.float64)), x), name="tanh")  # (4, 3)
    row = b.op("act", b.op("as_row", b.weight("row", torch.tensor([0.2, -0.4, 0.9], dtype=torch.float64))), name="tanh")
    on_full = b.op("affine", full, x, w)
    on_row = b.op("affine", row, x, w)  # (1, 3) broadcast over 4 rows
    matrix = b.input(torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 0.5, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 3.0]],
                                  dtype=torch.float64))
    summed = b.op("addspmm", row, matrix, on_full)
    return b.net(on_full=b.op("act", on_full, name="sigmoid"), on_row=b.op("act", on_row, name="tanh"),
                 summed=b.op("act", summed, name="tanh"))


NETS = {  # each net, and the net finite differences check (max/min without ties: differentiable there)
    "broadcast": (broadcast_net, broadcast_net),
    "segment": (segment_net, lambda: segment_net(ties=False)),
    "bag": (bag_net, bag_net),
    "row": (broadcast_rows_net, broadcast_rows_net),
    "added": (added_net, added_net),
}


@pytest.mark.parametrize("name", NETS)
def test_rules_equal_the_op_by_op_plan_and_finite_differences(name):
    make, smooth = NETS[name]
    net = make()
    net.execution = "auto"
    net()
    assert net.fused_reason is None
    assert_same(net)
    assert fused_gradcheck(smooth())


TEMPLATES = ("template.txt", "template_gnn.txt", "template_elementProduct.txt", "template_graphlets.txt",
             "template_partial.txt")


@pytest.mark.parametrize("name", TEMPLATES)
def test_mutagenesis_templates_fuse_exactly(name, tmp_path):
    """Mutagenesis with the wheel's templates at width 32 (as bench.neuralogic widens them):
    fused whatever the size, equal to op by op."""
    pytest.importorskip("neuralogic")
    import relsql
    from bench.neuralogic import load_dataset, write_template_dir

    db = relsql.connect()
    dataset = load_dataset(db.con, "mutagenesis")
    text, _ = write_template_dir(dataset, name, 32, tmp_path)
    template = relsql.Template.from_datalog(text, base_dir=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = relsql.compile(template, db, dtype=torch.float64, seed=7, outputs=list(dataset.heads))
    assert_same(net)
