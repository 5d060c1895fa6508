"""relsql: deep relational learning that runs on a relational database.

The public names are loaded on first use (PEP 562): `import relsql.ground.parts`, which Spark's
executors run to write a grounding store, must not import torch, and most of relsql needs it.
`from relsql import Model` and `relsql.Model` work as ever.
"""

from __future__ import annotations

import importlib
import sys
import types

from relsql.errors import (
    GroundingError,
    RelsqlError,
    SchemaError,
    ShapeError,
    SourceError,
    TemplateError,
)

_LAZY = {  # public name -> the module that defines it
    "Callback": "relsql.train.loop.callbacks", "CompiledNet": "relsql.compile", "compile": "relsql.compile",
    "tune": "relsql.compile",
    "Database": "relsql.data.engine", "connect": "relsql.data.connection", "Model": "relsql.model",
    "ModelSpec": "relsql.train.model.spec",
    "PredictiveQuery": "relsql.predictive", "QueryError": "relsql.predictive", "Template": "relsql.template",
    "from_relbench": "relsql.relbench", "to_heterodata": "relsql.export", "Loader": "relsql.train.model.loader",
    "TensorBoard": "relsql.train.loop.tracking", "MLflow": "relsql.train.loop.tracking", "WhereError": "relsql.where",
    "explain_summary": "relsql.explain", "write_explanation": "relsql.explain",
}

__all__ = [
    "Callback", "CompiledNet", "Database", "GroundingError", "Loader", "MLflow", "Model", "ModelSpec", "PredictiveQuery",
    "QueryError", "RelsqlError", "SchemaError", "ShapeError", "SourceError", "Template", "TemplateError", "TensorBoard",
    "compile", "WhereError", "connect", "explain_summary", "from_relbench", "to_heterodata", "tune", "write_explanation",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use; else a submodule (`relsql.data.duckdb`)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # straight into the namespace: the next lookup does not come here
        return value
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """relsql's module: the function `relsql.compile` keeps its name when the submodule of the
    same name is first imported (the import system would bind the submodule over it)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return  # the submodule stays reachable as sys.modules["relsql.compile"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
