"""The store's manifest and files, checked: contents are not trusted.

Opening a kept store checks the manifest's every field (types, names, counts against the template
and the data, a seal over the rest), each file's size, and each file's checksum: a file whose
inode, size and change time are those recorded when relsql wrote it is unchanged since (the
kernel moves the change time on any write, truncation, rename or chmod, and only root can set it
back), any other file is hashed in full. (Per batch, relsql/ground/store/read.py range-checks the
offsets, row ids and codes it reads.)

What the checks do not detect (docs/grounding-store.md says the same): a forgery by someone who
can write the folder and recomputes the files' SHA-256 and the seal. The seal is a checksum, not
a signature (relsql holds no secret), so any change that stays in range passes: row ids of an
`r<j>` permuted or swapped for other valid rows, values in a `c<k>` changed, groundings moved
between heads with matching offsets. The model then reads other rows and predicts differently,
silently. Only grounding again from the database would find that, the cost the store avoids; a
store's folder is trusted like the database itself (delete its manifest.json to rebuild one from
elsewhere).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

from relsql.errors import RelsqlError
from relsql.ground.demand import BatchGrounder, PreparedRule
from relsql.ground.narrow import FLOATS, INTEGERS
from relsql.ground.parts import io_error, part_files
from relsql.ground.store.layout import BUILD, FORMAT, MANIFEST, Damaged, StoreMeta, damaged, file_name, hash_file
from relsql.template import ir
from relsql.textfile import read_text

_NAME = re.compile(r"\w+(\.\w+)*", re.ASCII)  # a file name in a build folder: no separator, no "..", not absolute


def current(manifest: dict | None, mark: str) -> bool:
    """The manifest is of this format and of the data and template `mark` fingerprints."""
    return manifest is not None and manifest.get("format") == FORMAT and manifest.get("fingerprint") == mark


def read_manifest(folder: Path, created: bool) -> dict | None:
    """The store's manifest (None when there is none); one of another format (to be rebuilt) as it
    is; one of this format checked field by field, or a RelsqlError."""
    path = folder / MANIFEST
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise io_error(err, path, "read") from None
    try:
        if not stat.S_ISREG(info.st_mode):
            raise Damaged(f"{MANIFEST} is not a regular file")
        try:
            manifest = json.loads(read_text(path, "grounding store manifest"))
        except RelsqlError as err:
            raise Damaged(f"{MANIFEST} cannot be read: {err}") from None
        except (ValueError, RecursionError) as err:
            raise Damaged(f"{MANIFEST} cannot be read: not JSON ({str(err)[:80]})") from None
        if not isinstance(manifest, dict):
            raise Damaged(f"{MANIFEST} is not a JSON object")
        if manifest.get("format") == FORMAT:
            check_manifest(manifest)
        return manifest
    except Damaged as err:
        raise damaged(folder, str(err), created) from None


def seal(manifest: dict) -> str:
    """SHA-256 of the manifest without its seal: an edited field is found, whatever its place."""
    rest = {k: v for k, v in manifest.items() if k != "seal"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise Damaged(what)


def _count(value: object, what: str) -> int:
    _need(type(value) is int and value >= 0, f"{what} is not a count")
    return value


def _mapping(value: object, what: str) -> dict:
    _need(isinstance(value, dict), f"{what} is not a JSON object")
    return value


def check_manifest(manifest: dict) -> str:
    """Every field has its type and form (names are plain file names), and the seal matches; the
    build folder's name."""
    _need(manifest.get("format") == FORMAT, "format: not this relsql's")
    for key in ("fingerprint", "output", "build", "seal"):
        _need(isinstance(manifest.get(key), str), f"{key} is not a string")
    _need(bool(BUILD.fullmatch(manifest["build"])), "build is not a build folder's name")
    for name, relation in _mapping(manifest.get("relations"), "relations").items():
        relation = _mapping(relation, f"relation {name}")
        _count(relation.get("rows"), f"{name}: rows")
        _count(relation.get("bytes"), f"{name}: bytes")
        for index, rule in _mapping(relation.get("rules"), f"{name}: rules").items():
            _check_rule(_mapping(rule, f"{name}: rule {index}"), f"{name}: rule {index}")
    for file, record in _mapping(manifest.get("files"), "files").items():
        _need(bool(_NAME.fullmatch(file)), f"files: {file!r} is not a plain file name")
        record = _mapping(record, f"files: {file}")
        for key in ("bytes", "inode", "ctime_ns"):
            _count(record.get(key), f"files: {file}: {key}")
        _need(isinstance(record.get("sha256"), str) and bool(re.fullmatch(r"[0-9a-f]{64}", record["sha256"])),
              f"files: {file}: sha256 is not a SHA-256")
    _need(manifest["seal"] == seal(manifest), "its seal does not match its contents: it was edited")
    return manifest["build"]


def _check_rule(rule: dict, what: str) -> None:
    _need(isinstance(rule.get("stem"), str) and bool(_NAME.fullmatch(rule["stem"])), f"{what}: stem is not a plain file name")
    for key in ("rows", "groundings", "bytes"):
        _count(rule.get(key), f"{what}: {key}")
    for k, kind in _mapping(rule.get("columns"), f"{what}: columns").items():
        _need(k.isdigit() and isinstance(kind, list) and len(kind) == 2 and kind[0] in ("code", "value"),
              f"{what}: column {k} is not [kind, width]")
        _count(kind[1], f"{what}: column {k}'s width")
    dtypes = _mapping(rule.get("dtypes"), f"{what}: dtypes")
    for file, dtype in dtypes.items():
        _need(bool(re.fullmatch(r"[rc]\d+", file)) and dtype in (*INTEGERS, *FLOATS), f"{what}: {file} has no known dtype")
    parts = rule.get("parts")
    _need(isinstance(parts, list), f"{what}: parts is not a list")
    for part in parts:
        part = _mapping(part, f"{what}: a part")
        _need(isinstance(part.get("stem"), str) and bool(_NAME.fullmatch(part["stem"])),
              f"{what}: a part's stem is not a plain file name")
        _count(part.get("groundings"), f"{what}: a part's groundings")


def check_against(manifest: dict, grounder: BatchGrounder | StoreMeta) -> None:
    """The manifest describes this template's relations, rules and columns, the data's row counts,
    and exactly the files they need."""
    _need(manifest["output"] == grounder.output, f"its output is {manifest['output']!r}, not {grounder.output!r}")
    files: set[str] = {f"{file_name(w)}.keys.arrow" for w in grounder.stored}
    for name in grounder.order:
        relation = manifest["relations"].get(name)
        _need(relation is not None, f"relation {name} is missing")
        _need(relation["rows"] == grounder.sizes[name],
              f"{name}: {relation['rows']:,} rows, the data has {grounder.sizes[name]:,}")
        _need(set(relation["rules"]) == {str(p.index) for p in grounder.prepared[name]}, f"{name}: other rules")
        for prepared in grounder.prepared[name]:
            files.update(_check_rule_against(relation["rules"][str(prepared.index)], prepared, name, relation["rows"]))
    _need(set(manifest["files"]) == files, "its files are not the ones its relations need")


def _check_rule_against(rule: dict, prepared: PreparedRule, name: str, rows: int) -> list[str]:
    """One rule's description agrees with the template; the files it needs."""
    what, stem = f"{name}: rule {prepared.index}", f"{file_name(name)}.{prepared.index}"
    _need(rule["stem"] == stem and rule["rows"] == rows, f"{what}: another rule's stem or rows")
    coded = set(ir.coded_columns(prepared.rule))
    _need(set(rule["columns"]) == {str(k) for k in range(prepared.rule.n_columns)}, f"{what}: other columns")
    for k, (kind, _width) in rule["columns"].items():
        _need((kind == "code") == (int(k) in coded), f"{what}: column {k} is not {'codes' if int(k) in coded else 'values'}")
    dtypes = rule["dtypes"]
    _need(set(dtypes) == {f"r{j}" for j in range(len(prepared.rule.refs))} | {f"c{k}" for k in range(prepared.rule.n_columns)},
          f"{what}: dtypes of other files")
    texts = {e.column for e in ir.walk(prepared.rule.expr) if isinstance(e, ir.Text)}
    for file, dtype in dtypes.items():
        whole = file[0] == "r" or int(file[1:]) in coded or int(file[1:]) in texts  # ids, codes and tokens are integers
        _need((dtype in INTEGERS) == whole, f"{what}: {file} kept as {dtype}")
    stems = [part["stem"] for part in rule["parts"]]
    _need(len(set(stems)) == len(stems) and all(s == stem or re.fullmatch(re.escape(stem) + r"\.p\d+", s) for s in stems),
          f"{what}: parts of another rule")
    _need(all(part["groundings"] > 0 for part in rule["parts"]), f"{what}: an empty part")
    _need(sum(part["groundings"] for part in rule["parts"]) == rule["groundings"], f"{what}: parts do not add up")
    return [f"{stem}.offsets", *[f for s in stems for f in part_files(s, len(prepared.rule.refs), prepared.rule.n_columns)]]


def verify_files(data: Path, files: dict) -> None:
    """Each file is the one relsql wrote: unchanged since (same inode, size and change time), or
    of the recorded SHA-256 (hashed in full: a copied store, or one changed behind relsql's back)."""
    for name, record in files.items():
        path = data / name
        try:
            info = os.lstat(path)
        except OSError as err:
            raise Damaged(f"{name}: {err.strerror or err}") from None
        _need(stat.S_ISREG(info.st_mode), f"{name} is not a regular file")
        _need(info.st_size == record["bytes"], f"{name} has {info.st_size:,} bytes, not the {record['bytes']:,} written")
        if (info.st_ino, info.st_ctime_ns) != (record["inode"], record["ctime_ns"]):
            _need(hash_file(path) == record["sha256"], f"{name} is not the file relsql wrote (its checksum differs)")
