"""Seeded fuzzing of a kept grounding store (issue 27): tampered manifests (fields dropped, altered,
of another type; garbage), tampered files (truncated, extended, zeroed, permuted, flipped, swapped
with another store's, replaced by a link or a folder, deleted), a store folder holding user files
and links. Every case must end in the right groundings or a RelsqlError: never another exception,
never silently different groundings (except where the fuzzer also recomputes relsql's checksums,
as only a deliberate forger could: then only "no other exception" is required), and the user's
files and the file a link points to stay byte-identical."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

import relsql
from relsql.ground.store import MANIFEST, MARK, GroundingStore
from tests.test_store_safety import grounder, hashes, reseal, same, world

pytestmark = pytest.mark.slow  # 300 tampered stores

CASES = 300


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    g, other_g = grounder(world()), grounder(world(shift=1))
    pristine = GroundingStore.open(g, base / "pristine", progress=False)
    other = GroundingStore.open(other_g, base / "other", progress=False)
    rows = np.arange(g.sizes["pred"])
    return base, g, pristine, other, {"all": pristine.ground(rows), "some": pristine.ground(rows[::7], sample=1)}


def _paths(node, path=()):
    """Every (container, key) place in a JSON tree."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        yield node, key, path + (key,)
        yield from _paths(value, path + (key,))


def _odd_value(rng: random.Random, value):
    options = [None, True, 1.5, -1, 0, 2**63, -(2**70), "", "../x", "/etc/passwd", "a/b", "x" * 300, [], {}, [[[[1]]]],
               {"stem": "a"}, "build-0000000000000000", "NaN", float("inf")]
    if isinstance(value, int) and not isinstance(value, bool):
        options += [value + 1, value - 1, value * 2, -value]
    if isinstance(value, str):
        options += [value[:-1], value + "0", value.upper(), value.replace("0", "1")]
    return rng.choice(options)


def _mutate_manifest(rng: random.Random, folder: Path) -> str:
    text = (folder / MANIFEST).read_text(errors="replace")
    kind = rng.choice(["drop", "alter", "alter", "garbage"])
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError):
        manifest, kind = None, "garbage"  # an earlier mutation broke it already
    if not isinstance(manifest, dict | list) or not list(_paths(manifest)):
        kind = "garbage"
    if kind == "garbage":
        (folder / MANIFEST).write_bytes(rng.choice([b"", b"{", b"\xff\xfe\x00", b"[]", b"null", b"[" * 50_000,
                                                    text.encode()[: rng.randrange(max(1, len(text)))],
                                                    b'{"format": "relsql-store-3"}']))
        return "manifest garbage"
    container, key, _ = rng.choice(list(_paths(manifest)))
    if kind == "drop":
        container.pop(key)
    else:
        container[key] = _odd_value(rng, container[key])
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return f"manifest {kind}"


def _mutate_file(rng: random.Random, build: Path, other_build: Path) -> str:
    files = sorted(p for p in build.iterdir() if p.name != ".relsql-build")
    path = rng.choice(files)
    data = path.read_bytes()
    kind = rng.choice(["truncate", "extend", "zero", "permute", "flip", "swap", "link", "folder", "delete"])
    if kind == "truncate":
        path.write_bytes(data[: rng.randrange(max(1, len(data)))])
    elif kind == "extend":
        path.write_bytes(data + bytes(rng.choice([1, 8, 4096])))
    elif kind == "zero":
        start = rng.randrange(max(1, len(data)))
        path.write_bytes(data[:start] + bytes(min(len(data) - start, rng.choice([8, 64, 10**9])))
                         + data[start + 64:][: max(0, len(data) - start - 64)])
    elif kind == "permute" and len(data) >= 16 and len(data) % 8 == 0:
        path.write_bytes(np.random.default_rng(rng.randrange(1000)).permutation(np.frombuffer(data, np.int64)).tobytes())
    elif kind == "flip" and data:
        at = rng.randrange(len(data))
        path.write_bytes(data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1:])
    elif kind == "swap" and (other_build / path.name).exists():
        shutil.copyfile(other_build / path.name, path)
    elif kind == "link":
        path.unlink()
        path.symlink_to(other_build / path.name)
    elif kind == "folder":
        path.unlink()
        path.mkdir()
    else:
        path.unlink()
        kind = "delete"
    return f"file {kind}"


def _mutate_folder(rng: random.Random, folder: Path, outside: Path) -> str:
    kind = rng.choice(["mark garbage", "mark gone", "tmp link", "manifest link"])
    if kind == "mark garbage":
        (folder / MARK).write_text(rng.choice(["", "{}", '{"kind": "relsql grounding store"}', "x" * 10]))
    elif kind == "mark gone":
        (folder / MARK).unlink()
    elif kind == "tmp link":
        (folder / (MANIFEST + ".tmp")).symlink_to(outside)
    else:
        (folder / MANIFEST).unlink()
        (folder / MANIFEST).symlink_to(outside)
    return f"folder {kind}"


def _case(rng: random.Random, stores, index: int) -> tuple[str, str, list[str]]:
    """One tampered store, opened and read: (outcome, detail, what was done)."""
    base, g, pristine, other, expected = stores
    folder = base / f"case{index}"
    shutil.copytree(pristine.folder, folder, symlinks=True)
    outside = base / f"outside{index}.txt"
    outside.write_text(f"a user's file {index}")
    (folder / "notes.txt").write_text("the user's notes")  # placed in the store folder by the user
    (folder / "user_link").symlink_to(outside)
    done = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        area = rng.choice(["manifest", "file", "file", "folder"])
        if area == "manifest" and (folder / MANIFEST).is_file() and not (folder / MANIFEST).is_symlink():
            done.append(_mutate_manifest(rng, folder))
        elif area == "file":
            done.append(_mutate_file(rng, folder / pristine.data.name, other.data))
        elif area == "folder" and (folder / MARK).is_file() and (folder / MANIFEST).is_file():
            done.append(_mutate_folder(rng, folder, outside))
    forged = rng.random() < 0.3 and (folder / MANIFEST).is_file() and not (folder / MANIFEST).is_symlink()
    if forged:
        try:
            reseal(folder)
            done.append("resealed")
        except (ValueError, KeyError, TypeError, AttributeError, OSError, RecursionError):
            forged = False  # the manifest is too broken to forge a seal for
    user = {k: v for k, v in hashes(folder).items() if k in ("notes.txt", "user_link")}
    before = outside.read_bytes()
    try:
        store = GroundingStore.open(g, folder, progress=False)
        results = [same(store.ground(np.arange(g.sizes["pred"])), expected["all"]),
                   same(store.ground(np.arange(g.sizes["pred"])[::7], sample=1), expected["some"])]
        outcome = "ok" if all(results) else ("different (forged)" if forged else "DIFFERENT")
        detail = ""
    except relsql.RelsqlError as err:
        outcome, detail = "RelsqlError", str(err)
    except Exception as err:  # noqa: BLE001 - what the test counts
        outcome, detail = "OTHER", f"{type(err).__name__}: {err}"
    after = {k: v for k, v in hashes(folder).items() if k in ("notes.txt", "user_link")}
    assert after == user and outside.read_bytes() == before, (done, outcome)
    shutil.rmtree(folder)
    return outcome, detail, done


def test_tampered_stores_give_the_right_groundings_or_a_relsql_error(stores, capsys):
    rng = random.Random(27)
    counts: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    bad = []
    for index in range(CASES):
        outcome, detail, done = _case(rng, stores, index)
        counts[outcome] += 1
        for what in done:
            by_kind[(what, outcome)] += 1
        if outcome in ("OTHER", "DIFFERENT"):
            bad.append((done, outcome, detail))
    with capsys.disabled():
        print(f"\nstore fuzz, {CASES} cases by outcome: {dict(sorted(counts.items()))}")
        print("  by tampering: " + ", ".join(f"{w} -> {o}: {n}" for (w, o), n in sorted(by_kind.items())))
    assert not bad, bad[:5]
    assert counts["RelsqlError"] > CASES // 2 and counts["ok"] > 0  # the cases reach both ends


def test_the_fuzzer_is_seeded(stores):
    """The same seed tampers the same way (a failure can be replayed)."""
    digests = []
    for _ in range(2):
        rng = random.Random(5)
        digests.append(hashlib.sha256(repr([_case(rng, stores, 10_000 + i)[2] for i in range(5)]).encode()).hexdigest())
    assert digests[0] == digests[1]
    assert os.path.isdir(stores[2].folder)
