"""The grounding store's files kept small: offsets written in blocks (not a whole heads file at
once), row ids, codes and text tokens in the smallest integer type that holds them, values as
float32 when the net runs in float32. Batches read back equal the int64/float64 store's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import relsql
import relsql.ground.store.read as store_read
from relsql.ground.demand import BatchGrounder
from relsql.ground.narrow import _Narrowed, smallest_integer
from relsql.ground.parts import HashedFile
from relsql.ground.store import GroundingStore
from relsql.ground.store.write import write_offsets


def _naive_offsets(rows: int, heads: np.ndarray) -> np.ndarray:
    """offsets[h] = the groundings whose head is below h (heads of all groundings, ascending)."""
    return np.array([int((heads < h).sum()) for h in range(rows + 1)], dtype=np.int64)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 20])
def test_offsets_written_in_blocks_equal_a_naive_count(tmp_path, block):
    rng = np.random.default_rng(block)
    rows = 200
    heads = np.sort(rng.choice(rows, 400, replace=True))
    heads = heads[heads % 5 != 0]  # runs of rows without groundings, and one long gap:
    heads = heads[(heads < 40) | (heads > 170)]
    cut = int(np.flatnonzero(np.diff(heads) == 0)[len(heads) // 4])  # a head continued from one part into the next
    parts = []
    for i, chunk in enumerate((heads[: cut + 1], heads[cut + 1:])):
        distinct, counts = np.unique(chunk, return_counts=True)
        stem = f"r.0.p{i}"
        with HashedFile(tmp_path / f"{stem}.heads") as file:
            file.write(np.stack([distinct, counts], axis=1).astype(np.int64).tobytes())
        parts.append({"stem": stem, "groundings": len(chunk)})
    assert heads[cut] == heads[cut + 1]
    size, _ = write_offsets(tmp_path, "r.0", rows, parts, block=block)
    written = np.fromfile(tmp_path / "r.0.offsets", dtype=np.int64)
    assert size == (rows + 1) * 8
    assert np.array_equal(written, _naive_offsets(rows, heads))


def test_offsets_of_a_rule_without_groundings_are_zero(tmp_path):
    write_offsets(tmp_path, "r.0", 5, [], block=2)
    assert np.array_equal(np.fromfile(tmp_path / "r.0.offsets", dtype=np.int64), np.zeros(6, np.int64))


# -- compact types ----------------------------------------------------------------------------------
TEMPLATE = """
CREATE TABLE user_h AS SELECT u.user_id, tanh(linear(features(u.age), 4, 'wu') + embed(u.region, 4, 'region')
                                            + text(u.bio, 3, 'bio', buckets={buckets}, tokens=6)) AS h FROM users u;
CREATE TABLE user_items AS SELECT i.user_id, avg(tanh(linear(features(i.x), 4, 'wi'))) AS h FROM item i GROUP BY i.user_id;
CREATE TABLE pred AS
SELECT i.id, linear(tanh(embed(i.user_id, 4, 'user', storage='database') + linear(uh.h, 4, 'wuh') + linear(ui.h, 4, 'wui')),
                    1, 'out') AS h
FROM item i JOIN user_h uh ON uh.user_id = i.user_id JOIN user_items ui ON ui.user_id = i.user_id;
"""


def _world(users: int, regions: int) -> relsql.Database:
    """`users` users in `regions` regions with a short bio (NULL for some); 3,000 items."""
    db = relsql.connect()
    db.execute(f"CREATE TABLE users AS SELECT i AS user_id, (i % 50) * 1.37 AS age, 'r' || (i % {regions}) AS region, "
               "CASE WHEN i % 11 = 0 THEN NULL ELSE 'user ' || (i % 97) || ' likes item ' || (i % 13) END AS bio "
               f"FROM range({users}) t(i)")
    db.execute(f"CREATE TABLE item AS SELECT i AS id, (i * 7919) % {users} AS user_id, (i % 13) * 0.1 + 1 / 3 AS x "
               "FROM range(3000) t(i)")
    return db


def _grounder(db: relsql.Database, buckets: int) -> BatchGrounder:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BatchGrounder(relsql.Template.from_sql(TEMPLATE.format(buckets=buckets)), db, "pred", progress=False)


def _dtypes(store: GroundingStore) -> dict[str, dict[str, str]]:
    return {name: {f: d for rule in relation["rules"].values() for f, d in rule["dtypes"].items()}
            for name, relation in store.manifest["relations"].items()}


def _assert_same(a, b, values=lambda t: t) -> None:
    """Two batch groundings are equal: rows, heads, offsets, row ids, codes and keys exactly, and
    values after `values` (float32 rounding, for a float32 store)."""
    assert set(a.relations) == set(b.relations)
    for name in a.relations:
        assert torch.equal(a.rows[name], b.rows[name]), name
        for x, y in zip(a.relations[name].rules, b.relations[name].rules, strict=True):
            assert torch.equal(x.head, y.head) and torch.equal(x.offsets, y.offsets), name
            assert all(p.dtype == torch.int64 and torch.equal(p, r) for p, r in zip(x.refs, y.refs, strict=True)), name
            assert set(x.columns) == set(y.columns), name
            for k in x.columns:
                assert x.columns[k].dtype == y.columns[k].dtype, (name, k)
                coded = not x.columns[k].is_floating_point()
                assert torch.equal(x.columns[k], y.columns[k] if coded else values(y.columns[k])), (name, k)
    assert {w: k.to_pylist() for w, k in a.embedding_keys.items()} == {w: k.to_pylist() for w, k in b.embedding_keys.items()}


def _batches(g: BatchGrounder) -> list[np.ndarray]:
    return [np.arange(g.sizes["pred"]), np.array([5]), np.random.default_rng(1).choice(g.sizes["pred"], 300, replace=False)]


def test_small_sizes_are_kept_as_int16_and_batches_equal_the_database(tmp_path):
    g = _grounder(_world(users=300, regions=7), buckets=1000)
    store = GroundingStore.open(g, tmp_path / "store", progress=False)
    kinds = _dtypes(store)
    assert kinds["user_h"] == {"c0": "float64", "c1": "int16", "c2": "int16"}  # age; region codes; bio tokens
    assert kinds["pred"] == {"r0": "int16", "r1": "int16", "c0": "int16"}  # user_h and user_items rows; stored codes
    assert kinds["user_items"] == {"c0": "float64"}
    tokens = next(f for f in store.data.iterdir() if f.name.startswith("user_h_") and f.name.endswith(".0.c2"))
    assert tokens.stat().st_size == g.sizes["user_h"] * 6 * 2  # 6 tokens per user, 2 bytes each (was 8)
    for rows in _batches(g):
        _assert_same(store.ground(rows), g.ground(rows))


def test_more_than_32767_rows_codes_or_buckets_switch_to_int32(tmp_path):
    g = _grounder(_world(users=40_000, regions=33_000), buckets=40_000)
    store = GroundingStore.open(g, tmp_path / "store", progress=False)
    kinds = _dtypes(store)
    assert kinds["user_h"] == {"c0": "float64", "c1": "int32", "c2": "int32"}
    assert kinds["pred"]["r0"] == "int32"  # 40,000 users
    assert g.sizes["user_items"] <= 3000 and kinds["pred"]["r1"] == "int16"  # only the users of 3,000 items
    assert kinds["pred"]["c0"] == "int16"  # the stored embedding's codes: those 3,000 items' users
    for rows in _batches(g):
        _assert_same(store.ground(rows), g.ground(rows))
    just = _grounder(_world(users=300, regions=7), buckets=32_767)  # the padding token 32,767 still fits int16
    assert _dtypes(GroundingStore.open(just, tmp_path / "just", progress=False))["user_h"]["c2"] == "int16"


def test_a_float32_store_holds_what_a_float32_net_reads(tmp_path):
    g = _grounder(_world(users=300, regions=7), buckets=1000)
    exact = GroundingStore.open(g, tmp_path / "exact", progress=False)
    narrow = GroundingStore.open(g, tmp_path / "narrow", progress=False, dtype=torch.float32)
    assert _dtypes(narrow)["user_h"] == {"c0": "float32", "c1": "int16", "c2": "int16"}
    assert _dtypes(narrow)["user_items"] == {"c0": "float32"}
    assert sum(v["bytes"] for v in narrow.sizes.values()) < sum(v["bytes"] for v in exact.sizes.values())
    to32 = lambda t: t.to(torch.float32).to(torch.float64)  # noqa: E731
    for rows in _batches(g):
        ours, full = narrow.ground(rows), exact.ground(rows)
        _assert_same(ours, full, values=to32)
        x = full.relations["user_items"].rules[0].columns[0]
        assert not torch.equal(to32(x), x)  # 1/3 is not a float32: the test can tell the two apart
    # a float64 net never reads a float32 store: the same folder is rebuilt as float64
    again = GroundingStore.open(g, tmp_path / "narrow", progress=False)
    assert _dtypes(again)["user_items"] == {"c0": "float64"}
    _assert_same(again.ground(np.arange(40)), exact.ground(np.arange(40)))


def test_a_number_outside_the_chosen_type_is_refused_not_wrapped(tmp_path):
    with HashedFile(tmp_path / "x.r0") as file:
        narrowed = _Narrowed(file, "int64", "int16", "x's row ids")
        narrowed.write(np.array([0, 32767], dtype=np.int64).tobytes())
        with pytest.raises(relsql.RelsqlError, match="outside the int16"):
            narrowed.write(np.array([1, 32768], dtype=np.int64).tobytes())
        tokens = _Narrowed(file, "float64", "int16", "x's tokens")
        with pytest.raises(relsql.RelsqlError, match="fractions"):
            tokens.write(np.array([1.5], dtype=np.float64).tobytes())
    assert np.array_equal(np.fromfile(tmp_path / "x.r0", dtype=np.int16), [0, 32767])
    assert smallest_integer(32767, 0) == "int16" and smallest_integer(32768, 0) == "int32"
    assert smallest_integer(2**31 - 1) == "int32" and smallest_integer(2**31) == "int64"


@pytest.mark.parametrize("window", [8, 64, 1000])
def test_reads_a_window_at_a_time_equal_whole_reads(tmp_path, monkeypatch, window):
    """A batch's rows read WINDOW bytes of a file at a time (resident memory checked in between)
    are the rows read at once, and the database's grounding of the batch."""
    g = _grounder(_world(users=300, regions=7), buckets=1000)
    store = GroundingStore.open(g, tmp_path / "store", progress=False)
    expected = [(rows, store.ground(rows)) for rows in _batches(g)]
    monkeypatch.setattr(store_read, "WINDOW", window)
    store.resident_budget = 0  # every read windowed, pages handed back at every check
    for rows, whole in expected:
        ours = store.ground(rows)
        _assert_same(ours, whole)
        _assert_same(ours, g.ground(rows))
    column = np.arange(40, dtype=np.int16).reshape(20, 2)
    unordered = np.array([19, 0, 7, 7, 3, 18, 1])
    assert np.array_equal(store._take(column, unordered), column[unordered])  # any order: every position read
