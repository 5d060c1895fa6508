"""relsql's groundings and databases handed to other libraries (PyTorch Geometric: pyg.py)."""

from relsql.export.pyg import to_heterodata

__all__ = ["to_heterodata"]
