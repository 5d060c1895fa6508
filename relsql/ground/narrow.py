"""A grounding store's part files in compact types: what the store writer hands its executors.

`PartWriter` (relsql/ground/parts.py) writes row ids and codes as int64 and values as float64.
Most of those bytes are zeros: TPC-H's row ids fit int32, a text column's 128 hashed tokens per
row fit int16 (its vocabulary is its bucket count), and a float32 net reads float32 values.
`NarrowWriter` writes each file in the type the store chose for it; a number that does not fit
that type is refused (never wrapped into another valid-looking id). Torch-free, like
relsql.ground.parts: Spark's executors import it to write their partitions.
"""

from __future__ import annotations

import numpy as np

from relsql.errors import RelsqlError
from relsql.ground.parts import HashedFile, PartWriter

INTEGERS = ("int16", "int32", "int64")
FLOATS = ("float32", "float64")


def smallest_integer(largest: int, smallest: int = -1) -> str:
    """The smallest of int16, int32 and int64 that holds every number in [smallest, largest]
    (-1 by default: the code a NULL category is stored as)."""
    for name in INTEGERS:
        info = np.iinfo(name)
        if info.min <= smallest and largest <= info.max:
            return name
    raise RelsqlError(f"grounding store: numbers up to {largest:,} do not fit a 64-bit integer")


class _Narrowed:
    """A part file that receives int64/float64 bytes and writes them in its own type."""

    def __init__(self, file: HashedFile, source: str, target: str, what: str):
        self.file, self.source, self.target, self.what = file, np.dtype(source), np.dtype(target), what

    def write(self, data: bytes | memoryview) -> None:
        values = np.frombuffer(data, dtype=self.source)
        if self.target.kind == "i" and self.target.itemsize < self.source.itemsize and len(values):
            low, high = values.min(), values.max()
            info = np.iinfo(self.target)
            if self.source.kind == "f":  # text tokens travel as exact float64 integers
                if not np.array_equal(values, np.round(values)):
                    raise RelsqlError(f"grounding store: {self.what} holds fractions where whole tokens were expected")
            if low < info.min or high > info.max:
                raise RelsqlError(f"grounding store: {self.what} holds {low:g}..{high:g}, outside the {self.target} the "
                                  "store chose from the data's sizes; did the tables change during the build? build it again")
        self.file.write(values.astype(self.target, copy=False).tobytes())


class NarrowWriter(PartWriter):
    """A `PartWriter` whose files `r<j>` and `c<k>` are written in `dtypes[...]` (numpy type names)."""

    def __init__(self, relation, rule, folder: str, stem: str, dtypes: dict[str, str],
                 edges: dict[int, list[float]] | None = None):
        super().__init__(relation, rule, folder, stem, edges)
        self.dtypes = dict(dtypes)

    def _write(self, chunks, heads_file: HashedFile, ref_files: list[HashedFile],
               column_files: list[HashedFile]) -> tuple[dict[str, list], int]:
        refs = [_Narrowed(f, "int64", self.dtypes[f"r{j}"], f"{self.relation.name}'s row ids of `{ref}`")
                for j, (f, ref) in enumerate(zip(ref_files, self.rule.refs))]
        columns = [_Narrowed(f, "int64" if k in self.embeds else "float64", self.dtypes[f"c{k}"],
                             f"{self.relation.name}'s value column {k}") for k, f in enumerate(column_files)]
        return super()._write(chunks, heads_file, refs, columns)


__all__ = ["FLOATS", "INTEGERS", "NarrowWriter", "smallest_integer"]
