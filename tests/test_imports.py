"""Layers point one way: the import graph of relsql/ (its connectors and datasets included) has no cycle.

The graph is read from the source with `ast`, so a cycle counts even when Python would tolerate
it at run time: imports at module level and inside functions both make an arrow, and
`from pkg import name` points at the submodule `pkg.name` where there is one, else at `pkg`.
Only imports under `if TYPE_CHECKING:` are left out (they never run).
"""

from __future__ import annotations

import ast
import functools
import warnings
from pathlib import Path

from relsql.template import recursion

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("relsql",)  # the only package installed (pyproject: include = ["relsql*"])

# Modules whose import cycle is accepted: none. (The model/train cycle that issue #28 split is
# gone; keep this empty. It may only ever name relsql/model.py and modules in relsql/train/.)
ALLOWED_CYCLE_MEMBERS: frozenset[str] = frozenset()


def module_files() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name (a package is its __init__)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of `path`, read once for all the tests of this file (each reads every module)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@functools.cache
def imports_in(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """`_import_nodes` of `path`'s tree, found once."""
    return tuple(_import_nodes(parsed(path)))


def _is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement anywhere in the tree (functions included) except the bodies of
    `if TYPE_CHECKING:` blocks (their `else:` branch runs, so it counts)."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = parts[:keep]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that `module` imports (itself left out)."""
    targets: set[str] = set()
    for node in imports_in(path):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name:
                    targets.add(name)
            continue
        base = _base(module, path.name == "__init__.py", node)
        for alias in node.names:
            if f"{base}.{alias.name}" in known:
                targets.add(f"{base}.{alias.name}")
            elif base in known:
                targets.add(base)
    targets.discard(module)
    return targets


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    files = module_files()
    known = set(files)
    return {module: imports_of(module, path, known) for module, path in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module, each sorted (relsql's
    own Tarjan, relsql/template/recursion.py, over the modules in sorted order)."""
    ordered = {node: sorted(graph[node]) for node in sorted(graph)}
    return [sorted(component) for component in recursion.strongly_connected(ordered) if len(component) > 1]


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A concrete cycle through the component's first module, as a path that ends where it starts."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to start
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component of size > 1 always has one


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    return f"{len(component)} modules {component}; e.g. " + " -> ".join(one_cycle(graph, component))


def test_graph_is_read():
    """The reader finds arrows that are known to exist, and only those (else 'no cycle' would
    prove nothing): a module-level import, a function-level one, `from pkg import submodule`
    resolved to the submodule, and an import under `if TYPE_CHECKING:` left out."""
    graph = import_graph()
    assert "relsql.errors" in graph["relsql.data.duckdb"]  # module level
    assert "relsql.template.auto" in graph["relsql.template"]  # inside Template.auto
    assert "relsql.arguments" in graph["relsql.predictive.terms"]  # from relsql import arguments
    assert "relsql" not in graph["relsql.predictive.terms"]
    assert "relsql.data.duckdb" not in graph["relsql.data.catalog"]  # only under TYPE_CHECKING
    assert all(target in graph for targets in graph.values() for target in targets)
    assert len(graph) > 80


def test_cycles_are_found():
    """The cycle finder reports a cycle through imports inside functions, and a longer one."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    components = strongly_connected(graph)
    assert sorted(components) == [["a", "b", "c"], ["d", "e"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_allow_list_only_names_model_and_train():
    """The allowance is for the model/train split alone, and names only modules that exist."""
    graph = import_graph()
    for member in ALLOWED_CYCLE_MEMBERS:
        assert member == "relsql.model" or member.startswith("relsql.train."), member
        assert member in graph, f"{member} is no longer a module: remove it from ALLOWED_CYCLE_MEMBERS"


def test_no_import_cycles():
    graph = import_graph()
    refused = []
    for component in strongly_connected(graph):
        if set(component) <= ALLOWED_CYCLE_MEMBERS:
            warnings.warn(f"import cycle accepted until the product-layer split lands: "
                          f"{describe(graph, component)}", stacklevel=1)
        else:
            refused.append(describe(graph, component))
    assert not refused, "import cycles (layers must point one way):\n" + "\n".join(refused)


def _top_level_names(path: Path) -> set[str]:
    """The first component of every module `path` imports absolutely (relative imports stay inside)."""
    names = set()
    for node in imports_in(path):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif not node.level and node.module:
            names.add(node.module.partition(".")[0])
    return names


def test_relsql_imports_no_folder_of_the_checkout():
    """An installed wheel holds relsql/ alone: a module that imported a folder beside it (the old
    top-level connectors/, bench/, tests/, demos/) would run from a checkout and fail once installed."""
    beside = {path.name for path in ROOT.iterdir() if path.is_dir() and path.name != "relsql"}
    beside |= {path.stem for path in ROOT.glob("*.py")}
    assert {"bench", "tests", "demos"} <= beside  # the check sees the folders it guards against
    found = {f"{module}: {name}" for module, path in module_files().items() for name in _top_level_names(path) & beside}
    assert not found, sorted(found)


def test_source_connectors_sit_below_the_dataset_loaders():
    """relsql.connectors (what `relsql.connect` opens) never imports relsql.datasets (the loaders of
    test, bench and demo data), and only the CLI's demo and the loaders themselves import a loader."""
    graph = import_graph()
    assert "relsql.connectors.extensions" in graph["relsql.datasets.tpch"]  # the reader sees loader -> connector
    into_datasets = {(module, target) for module, targets in graph.items() for target in targets
                     if target.startswith("relsql.datasets") and not module.startswith("relsql.datasets")}
    assert into_datasets == {("relsql.cli.demo", "relsql.datasets.mutagenesis")}
    assert any(m.startswith("relsql.connectors.") for m in graph) and any(m.startswith("relsql.datasets.") for m in graph)


DATA_LEAVES = {"relsql.errors", "relsql.sql", "relsql.textfile", "relsql.arguments", "relsql.cores"}  # leaves every floor may use


def test_the_data_layer_imports_no_higher_floor():
    """relsql.data (engines, sources, catalog, keys) imports only itself, the connectors it opens and
    the leaves: never grounding, compilation, templates, training or the CLI above it."""
    graph = import_graph()
    data = [m for m in graph if m == "relsql.data" or m.startswith("relsql.data.")]
    assert {"relsql.data.engine", "relsql.data.duckdb", "relsql.data.spark", "relsql.data.keys"} <= set(data)
    upward = {(m, t) for m in data for t in graph[m]
              if not (t.startswith(("relsql.data.", "relsql.connectors")) or t in DATA_LEAVES)}
    assert not upward, sorted(upward)
    assert "relsql.arguments" in graph["relsql.data.duckdb"]  # the reader sees a function-level arrow out of the package


TRAIN_ROOMS = ("task", "gbm", "persist", "embeddings", "feed", "learner", "ranking", "loop", "model")  # lowest first


def test_training_rooms_import_only_lower_rooms():
    """relsql/train/'s rooms (its __init__ says what each holds) are floors: a module imports modules of
    its own room or of rooms listed before it, never one above (function-level imports count; only
    `if TYPE_CHECKING:` annotations are left out)."""
    graph = import_graph()

    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 and parts[:2] == ["relsql", "train"] else None

    assert {room(m) for m in graph} - {None} == set(TRAIN_ROOMS)  # every room is listed, and nothing else
    upward = sorted((m, t) for m in graph for t in graph[m]
                    if room(m) and room(t) and TRAIN_ROOMS.index(room(t)) > TRAIN_ROOMS.index(room(m)))
    assert not upward, upward


def _private_reads(path: Path, known: set[str]) -> set[tuple[str, str]]:
    """(module, name) for each private name of another relsql module that `path` imports or reads as an attribute."""
    tree = parsed(path)
    modules: dict[str, str] = {}  # local name -> the relsql module it is
    found = set()
    for node in imports_in(path):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("relsql"):
            for alias in node.names:
                if f"{node.module}.{alias.name}" in known:
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add((node.module, alias.name))
        elif isinstance(node, ast.Import):
            modules.update({alias.asname: alias.name for alias in node.names if alias.asname and alias.name in known})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.add((modules[node.value.id], node.attr))
    return found


def test_no_module_reads_another_modules_private_names():
    """A name another module needs is public in its own (PEP 8's leading underscore means 'this module's
    own'); tests may reach in, relsql's modules may not."""
    files = module_files()
    reads = {(module, *read) for module, path in files.items() for read in _private_reads(path, set(files))}
    assert not reads, sorted(reads)
    # the check sees both kinds of read
    probe = "from relsql.compile import sparse\nfrom relsql.ground.execute import _y, run\nsparse._x()\nsparse.ok()\n"
    assert _private_reads_of_text(probe, files) == {("relsql.compile.sparse", "_x"), ("relsql.ground.execute", "_y")}


def _private_reads_of_text(text: str, files: dict[str, Path]) -> set[tuple[str, str]]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "probe.py"
        path.write_text(text, encoding="utf-8")
        return _private_reads(path, set(files))
