"""The grounding store's folder: its files and their names, and what a store's contents follow from.

    .relsql-store                  the mark relsql writes when it makes a folder (new or empty) a
                                   store; relsql keeps a store in no other folder and writes or
                                   deletes nothing in it but the mark, the manifest and build folders
    manifest.json                  format, fingerprint of the data, the build folder, per relation its
                                   rows and per rule its groundings, value columns (dtype, width) and
                                   files; per file its bytes, SHA-256, inode and change time; a seal
    build-<hex>/                   one build's files (a rebuild makes a new one, then removes the old):
      <relation>.<rule>.offsets    int64 (rows + 1,): CSR offsets, the groundings of row h are
                                   [offsets[h], offsets[h + 1])
      <part>.r<j>                  (groundings,): row ids into the j-th referenced relation
      <part>.c<k>                  (groundings, width) encoded values, or (groundings,) codes
                                   (r<j> and c<k> in the rule's "dtypes": row ids, codes and text
                                   tokens in the smallest of int16/int32/int64 that holds the
                                   relation's rows, the dictionary's codes or the bucket count;
                                   values float32 for a float32 net, else float64)
      <part>.heads                 int64 (heads, 2): (head row, its groundings), what the offsets
                                   are written from
      <weight>.keys.arrow          Arrow IPC: the raw keys of a database-stored embedding, by code

A rule's groundings are one part (`<part>` = `<relation>.<rule>`) when this process streams them
from DuckDB, or several (`<relation>.<rule>.p<i>`, in head order) when Spark's executors write
one per partition (relsql/ground/parts.py, torch-free); the driver then reads only their heads'
counts. Raw little-endian arrays and JSON, so another engine can write a store and several
processes can read one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import sqlglot.expressions as exp

from relsql.data.engine import TEMP_PREFIX
from relsql.errors import RelsqlError
from relsql.ground.demand import BatchGrounder, PreparedRule
from relsql.template import ir

# 4: each file's numbers in their own type; 3: a marked folder, a build folder per build, checksums; 2: parts
FORMAT = "relsql-store-4"
MANIFEST = "manifest.json"
MARK = ".relsql-store"
BUILD = re.compile(r"build-[0-9a-f]{16}")
BUILD_MARK = ".relsql-build"  # in each build folder: what a rebuild may remove
READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)  # a store file, never through a link


@dataclass
class StoreMeta:
    """What reading a store needs besides its files: the grounder's template, order, encodings
    and fan-out, without its database (so another process can read the store: a training rank)."""

    template: ir.Template
    output: str
    order: list[str]
    fanout: dict[str, int] | int | None
    seed: int
    prepared: dict[str, list[PreparedRule]]
    stored: dict
    dictionary_tables: dict[str, pa.Table]
    feature_stats: dict
    sizes: dict[str, int]


def fingerprint(grounder: BatchGrounder) -> str:
    """What the store's contents follow from: the template, the encodings, and every row of every
    table the template reads (count and an order-independent sum of row hashes, in the database)."""
    db = grounder.db
    digest = hashlib.sha256(FORMAT.encode())
    digest.update(grounder.template.source.encode())
    digest.update(grounder.output.encode())
    digest.update(json.dumps(grounder.feature_stats, sort_keys=True, default=str).encode())
    for weight in sorted(grounder.dictionary_tables):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, grounder.dictionary_tables[weight].schema) as writer:
            writer.write_table(grounder.dictionary_tables[weight])
        digest.update(weight.encode() + sink.getvalue().to_pybytes())
    tables: dict[str, exp.Table] = {}
    for rules in grounder.prepared.values():
        for prepared in rules:
            for table in prepared.source.find_all(exp.Table):
                if table.name and not table.name.startswith(TEMP_PREFIX):
                    plain = exp.Table(this=table.this.copy(), db=table.args.get("db"), catalog=table.args.get("catalog"))
                    tables[plain.sql("duckdb")] = plain
    for name in sorted(tables):
        try:
            digest.update(f"{name}:{db.row_summary(tables[name])}".encode())
        except duckdb.Error:  # a table function or view the database cannot hash as rows: its name only
            digest.update(name.encode())
    return digest.hexdigest()


def file_name(name: str) -> str:
    """A relation's or weight's name as a file name: letters, digits, underscores, and a short hash
    so that names differing only in other characters (or case) never share a file."""
    return f"{ir.table_suffix(name)}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


class Damaged(Exception):
    """What is wrong with a store's manifest or files (becomes a RelsqlError naming the folder)."""


def damaged(folder: Path, reason: str, created: bool) -> RelsqlError:
    """The error for a damaged store in `folder`, with the fix (`created`: relsql made the folder)."""
    fix = f"delete {folder / MANIFEST} and relsql rebuilds the store"
    if created:
        fix += f" (or delete the folder {folder}: relsql made it)"
    return RelsqlError(f"grounding store {folder} is damaged ({reason}); {fix}")


def hash_file(path: Path) -> str:
    """SHA-256 of a file (read without following a link)."""
    digest = hashlib.sha256()
    try:
        fd = os.open(path, READ)
        try:
            while chunk := os.read(fd, 1 << 22):
                digest.update(chunk)
        finally:
            os.close(fd)
    except OSError as err:
        raise Damaged(f"{path.name}: {err.strerror or err}") from None
    return digest.hexdigest()
