"""The grounding store: every grounding a mini-batch can need, computed once by the database.

Per batch, grounding in the database (relsql/ground/demand.py) makes DuckDB scan the tables it
semi-joins, so a batch costs in proportion to the database. The store grounds each relation the
output depends on once, in bulk, and keeps the result as plain arrays in a folder of its own,
which a batch then reads in O(batch). docs/grounding-store.md describes it for users.

    layout.py            the folder's files and names, the format, the data's fingerprint
    folder.py            the folder claimed with relsql's mark, locked per build, cleared to rebuild
    manifest.py          the manifest and files checked when a kept store is opened
    write.py             a build: every relation grounded in bulk into a new build folder
    read.py              one batch read over the CSR offsets, through memory maps
    memory.py            pages kept mapped up to a budget; the C heap trimmed after large batches
    grounding_store.py   GroundingStore: open (reuse or build), attach and detach, describe
"""

from relsql.ground.store.grounding_store import GroundingStore
from relsql.ground.store.layout import FORMAT, MANIFEST, MARK, StoreMeta, fingerprint
from relsql.ground.store.memory import trim_heap

__all__ = ["FORMAT", "MANIFEST", "MARK", "GroundingStore", "StoreMeta", "fingerprint", "trim_heap"]
