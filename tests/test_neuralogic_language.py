"""NeuraLogic's language beyond the basics (#18 part 4) against PyNeuraLogic 0.9.2, float64:
template facts (learnable `{3} f(a).`, fixed `<[1, 2]> f(a).`, plain `f(a).`), the concat
aggregation, the combinations softmax, sparsemax, cossim and count, and the transformations
norm, transpose, sparsemax, softmax and lukasiewicz. Values and gradients to 1e-6, except where a
comment says why (NeuraLogic's Łukasiewicz backward)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relsql
from relsql.errors import ShapeError, TemplateError
from tests.oracles import neuralogic_oracle as oracle
from tests.oracles.compare import compare_template, facts_db, keyed_values, relsql_weights

# two samples, vectors of width 3 under a(X) and b(X) for two constants each
EXAMPLES = ["[0.5, -0.2, 0.9] a(x), [0.1, 0.3, -0.4] b(x), [1.0, 2.0, 0.5] a(y), [0.3, 0.2, 0.1] b(y).",
            "[-0.7, 0.4, 0.2] a(x), [0.6, -0.5, 0.8] b(x), [0.2, 0.1, -0.9] a(y), [-0.3, 0.9, 0.4] b(y)."]
QUERIES = ["1.0 predict.", "-0.5 predict."]


def dataset() -> relsql.Database:
    return facts_db(EXAMPLES, QUERIES)


def check(text: str, intermediates: tuple[str, ...] = ("h",)) -> dict[str, float]:
    deviations = compare_template(text, "/tmp", dataset(), EXAMPLES, QUERIES, "query_predict", intermediates)
    assert max(deviations.values()) < 1e-6, deviations
    return deviations


# -- transformations -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["norm", "sparsemax", "softmax"])
def test_row_transformations(name, neuralogic_workdir):
    """Join transformations over a whole value: as the predicate's and as the rule's."""
    check("{3,3} h(X) :- {3,3} a(X), {3,3} b(X).\nh/1 [transformation=" + name + "]\n{1,3} predict :- h(X).")
    check("h(X) :- {3,3} a(X), {3,3} b(X). [transformation=" + name + "]\n{1,3} predict :- h(X).")


def test_transpose(neuralogic_workdir):
    """A column vector becomes a row: row × column under the product combination is a dot
    product; a row read through a {1,1} weight stays a row (a 1×2 output)."""
    check("h(X) :- {3,3} a(X). [transformation=transpose]\ng(X) :- h(X), b(X). [combination=product]\n"
          "{1,1} predict :- g(X).", ("h", "g"))
    check("h(X) :- {2,3} a(X).\nh/1 [transformation=transpose]\npredict :- {1,1} h(X).")


def test_lukasiewicz(neuralogic_workdir):
    """NeuraLogic's Łukasiewicz transformation is sigmoid(6x + 0.5) (0 below -100, 1 above 100).
    Its backward in PyNeuraLogic 0.9.2 is s(1 - s), without the inner factor 6, so its weight
    gradients below the transformation are 1/6 of the derivative of its own forward values
    (checked by finite differences); relsql keeps the true derivative. Values match exactly;
    gradients are compared as 6 × NeuraLogic's below the transformation, 1 × above."""
    text = "{3,3} h(X) :- {3,3} a(X).\nh/1 [transformation=lukasiewicz]\n{1,3} predict :- h(X)."
    db = dataset()
    compare_template(text, "/tmp", db, EXAMPLES, QUERIES, "query_predict", ("h",), check_gradients=False)
    tpl = relsql.Template.from_datalog(text)
    net = relsql.compile(tpl, db, dtype=torch.float64, seed=3)
    weights = relsql_weights(tpl, net)
    x = np.array([0.5, -0.2, 0.9]) @ weights[1].T @ weights[0].T  # h(x) of sample 0 before the transformation
    assert np.allclose(keyed_values(net, "h")[(0, "x")], 1 / (1 + np.exp(-6 * x - 0.5)))
    out = net()["predict"]
    loss = ((out.reshape(-1) - torch.tensor([1.0, -0.5], dtype=torch.float64)) ** 2).sum()
    loss.backward()
    expected = oracle.gradients(text, EXAMPLES, QUERIES, weights=weights)
    named = net.named_weights()
    for index, name in enumerate(tpl.weights):
        factor = 1.0 if index == 2 else 6.0  # weights 0 and 1 lie below the transformation
        assert np.allclose(named[name].grad.numpy(), factor * expected[index].reshape(named[name].shape), atol=1e-6)


# -- combinations --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "sparsemax"])
def test_softmax_and_sparsemax_combinations(name, neuralogic_workdir):
    """Scalar inputs become one vector of their soft(sparse)max weights."""
    check("h(X) :- {1,3} a(X), {1,3} b(X), {1,3} a(X). [combination=" + name + "]\n{1,3} predict :- h(X).")


def test_cosine_similarity(neuralogic_workdir):
    check("h(X) :- {3,3} a(X), {3,3} b(X). [combination=cossim]\n{1,1} predict :- h(X).")


def test_count_combination(neuralogic_workdir):
    """The number of inputs, whatever their values: no gradient flows to the body weights."""
    check("h(X) :- {1,3} a(X), {1,3} b(X). [combination=count]\n{1,1} predict :- h(X).")


# -- aggregation ---------------------------------------------------------------------------
def test_concat_aggregation(neuralogic_workdir):
    """A head's groundings side by side. NeuraLogic orders them by its own hash sets (for
    constants q, c, m, b1, zz, a it gave b1, q, m, zz, a, c; over dataset facts the order of x, y
    changed between samples); relsql in grounding order: by the rows of the neural relations read
    (their keys' order), then by the dataset facts' values. Over a neural relation's atoms e(x),
    e(y), and over the vectors here, both orders agree."""
    check("h :- {2,3} a(X). [aggregation=concat]\n{1,4} predict :- h.")
    check("e(X) :- {1,3} b(X), {1,3} a(X). [transformation=tanh]\nh :- e(X). [aggregation=concat]\n"
          "{1,2} predict :- h.", ("e", "h"))


def test_concat_aggregation_needs_equal_groundings():
    db = dataset()
    db.execute("INSERT INTO a VALUES (0, 'z', [1.0, 1.0, 1.0])")
    tpl = relsql.Template.from_datalog("h :- {2,3} a(X). [aggregation=concat]\n{1,4} predict :- h.")
    with pytest.raises(ShapeError, match="same number of groundings"):
        relsql.compile(tpl, db, dtype=torch.float64)


# -- template facts --------------------------------------------------------------------------
def test_learnable_template_facts(neuralogic_workdir):
    """`{3} emb(x).` is a fact of every sample whose value is a learnable weight; NeuraLogic
    numbers those weights after all rules' (relsql does the same, wherever the facts stand)."""
    check("{3} emb(x).\n{3} emb(y).\nh(X) :- emb(X), a(X). [combination=elproduct]\n{1,3} predict :- h(X).")


def test_fixed_and_plain_template_facts(neuralogic_workdir):
    check("h(X) :- emb(X), a(X). [combination=elproduct]\n{1,3} predict :- h(X).\n"
          "<[1.0, 2.0, 3.0]> emb(x).\n{3} emb(y).")
    check("h(X) :- emb(X), {1,3} a(X).\n{1,1} predict :- h(X).\nemb(x).\n0.5 scale(y).\n"
          "{1,1} predict :- scale(Y), {1,3} b(Y).")  # a scalar fact with vectors: NeuraLogic's backward fails


def test_template_fact_errors():
    with pytest.raises(TemplateError, match="must be constants"):
        relsql.Template.from_datalog("{3} emb(X).\n{1,3} predict :- emb(x), a(x).")
    with pytest.raises(TemplateError, match="reads only template facts"):  # its head would hold in sample 0 only
        relsql.Template.from_datalog("{3} emb(x).\n{1,3} predict :- emb(x).")
    with pytest.raises(TemplateError, match="both template facts and rules"):
        relsql.Template.from_datalog("{3} emb(x).\nemb(X) :- a(X).\n{1,3} predict :- emb(x).")
    with pytest.raises(TemplateError, match="only template facts"):
        relsql.Template.from_datalog("{3} emb(x).\nemb/1 [transformation=sigmoid]\n{1,3} predict :- emb(x).")


def test_the_wheels_xor_solution_with_an_offset_equals_neuralogic(neuralogic_workdir):
    """simple/xor/solution: hand-set weights, signum hidden units and `xor/0 [offset=1.0]`, a
    constant NeuraLogic adds (not a learnable weight): outputs 0, 1, 1, 0, as NeuraLogic's."""
    from pathlib import Path

    import neuralogic

    from relsql.datasets.neuralogic_files import import_files

    folder = Path(neuralogic.__file__).parent / "utils" / "data" / "datasets" / "simple" / "xor" / "solution"
    db = relsql.connect()
    import_files(db.con, str(folder / "testExamples.txt"), None)
    text = (folder / "template.txt").read_text()
    assert compare_template(text, str(folder), db, str(folder / "testExamples.txt"), None, "query_xor")["outputs"] < 1e-6
    net = relsql.compile(relsql.Template.from_datalog(text), db, dtype=torch.float64)
    assert sorted(v[0] for v in net.values("xor")["value"].to_list()) == [0.0, 0.0, 1.0, 1.0]  # the offset counted
    assert not net.weights_by_name()["xor.offset"].requires_grad
    negative = relsql.compile(relsql.Template.from_datalog(text.replace("offset=1.0", "offset=-0.5")), db, dtype=torch.float64)
    assert negative.weights_by_name()["xor.offset"].item() == -0.5
    with pytest.raises(TemplateError, match="offset must be a number"):
        relsql.Template.from_datalog(text.replace("offset=1.0", "offset=high"))
