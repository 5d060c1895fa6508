"""relsql: deep relational learning that runs on a relational database."""

from relsql.compile import CompiledNet, compile, tune
from relsql.db import Database, connect
from relsql.errors import (
    GroundingError,
    RelsqlError,
    SchemaError,
    ShapeError,
    SourceError,
    TemplateError,
)
from relsql.model import Model
from relsql.predictive import PredictiveQuery, QueryError
from relsql.template import Template

__all__ = [
    "CompiledNet", "Database", "GroundingError", "Model", "PredictiveQuery", "QueryError", "RelsqlError", "SchemaError",
    "ShapeError", "SourceError", "Template", "TemplateError", "compile", "connect", "tune",
]
__version__ = "0.1.0"
