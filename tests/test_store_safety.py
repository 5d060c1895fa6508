"""A kept grounding store's folder is relsql's alone and its contents are checked, not trusted
(issue 27, must-fix 3 and 6): a folder that is neither new, empty nor marked is refused and left
byte-identical; nothing is written through a link; tampered files and manifests are a RelsqlError,
never a silently different grounding or another exception; store I/O failures (a full disk, a
read-only mount, a folder in the way, /proc/self) are RelsqlErrors that leave no partial files;
and the code Spark's executors run to write a store imports no torch."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import relsql
from relsql.ground.demand import BatchGrounder
from relsql.ground.store import MANIFEST, MARK, GroundingStore
from relsql.ground.store.manifest import seal

ROOT = Path(__file__).resolve().parent.parent

TEMPLATE = """
CREATE TABLE user_h AS SELECT u.user_id, tanh(linear(features(u.age), 4, 'wu') + embed(u.region, 4, 'region')) AS h FROM users u;
CREATE TABLE user_items AS SELECT i.user_id, avg(tanh(linear(features(i.x), 4, 'wi'))) AS h FROM item i GROUP BY i.user_id;
CREATE TABLE pred AS
SELECT i.id, linear(tanh(embed(i.user_id, 4, 'user', storage='database') + linear(uh.h, 4, 'wuh') + linear(ui.h, 4, 'wui')),
                    1, 'out') AS h
FROM item i JOIN user_h uh ON uh.user_id = i.user_id JOIN user_items ui ON ui.user_id = i.user_id;
"""


def world(items: int = 2000, shift: int = 0) -> relsql.Database:
    """Items of 300 users in 7 regions: references (user_h, user_items), a grouped rule, an
    in-memory embedding (codes) and a database-stored one (a keys file)."""
    db = relsql.connect()
    db.execute("CREATE TABLE users AS SELECT i AS user_id, (i % 50) * 1.0 AS age, 'r' || (i % 7) AS region FROM range(300) t(i)")
    db.execute(f"CREATE TABLE item AS SELECT i AS id, (i * 7919 + {shift}) % 300 AS user_id, (i % 13) * 0.1 AS x, "
               f"((i * 7919) % 300) % 3 = 0 AS y FROM range({items}) t(i)")
    return db


def grounder(db: relsql.Database) -> BatchGrounder:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BatchGrounder(relsql.Template.from_sql(TEMPLATE), db, "pred", progress=False)


def same(a, b) -> bool:
    """Two batch groundings are equal: rows, and per rule heads, offsets, row ids and values."""
    if set(a.relations) != set(b.relations):
        return False
    for name in a.relations:
        if not torch.equal(a.rows[name], b.rows[name]):
            return False
        for x, y in zip(a.relations[name].rules, b.relations[name].rules, strict=True):
            if not (torch.equal(x.head, y.head) and torch.equal(x.offsets, y.offsets) and set(x.columns) == set(y.columns)):
                return False
            if not all(torch.equal(p, r) for p, r in zip(x.refs, y.refs, strict=True)):
                return False
            if not all(torch.equal(x.columns[k].to(torch.float64), y.columns[k].to(torch.float64)) for k in x.columns):
                return False
    return same_keys(a, b)


def same_keys(a, b) -> bool:
    return set(a.embedding_keys) == set(b.embedding_keys) and all(
        a.embedding_keys[w].to_pylist() == b.embedding_keys[w].to_pylist() for w in a.embedding_keys)


def hashes(folder: Path) -> dict[str, str]:
    """Every file and link under `folder`: its bytes' SHA-256 (a link: its target's name)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(folder))] = "link:" + os.readlink(path)
        elif path.is_file():
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[str(path.relative_to(folder))] = "folder"
    return found


def data_file(store: GroundingStore, suffix: str) -> Path:
    return next(f for f in sorted(store.data.iterdir()) if f.name.endswith(suffix))


def reseal(folder: Path, change=None) -> None:
    """Rewrite the manifest as a hostile user who knows relsql's checksums would: `change(manifest)`,
    then every file's record and the seal recomputed."""
    manifest = json.loads((folder / MANIFEST).read_text())
    if change:
        change(manifest)
    data = folder / manifest["build"]
    for name, record in manifest["files"].items():
        path = data / name
        if path.is_file():
            info = path.stat()
            record.update(bytes=info.st_size, sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                          inode=info.st_ino, ctime_ns=info.st_ctime_ns)
    manifest["seal"] = seal(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def shop():
    db = world()
    return db, grounder(db)


# -- the folder is relsql's alone -------------------------------------------------------------------
def test_a_folder_with_user_files_is_refused_and_left_byte_identical(shop, tmp_path):
    _, g = shop
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / MANIFEST).write_text('{"my": "own manifest"}')
    (folder / "user_4d2b0af5.0.c1").write_bytes(b"named like a store file of an earlier relsql")
    (folder / "data").mkdir()
    (folder / "data" / "rows.csv").write_text("a,b\n1,2\n")
    before = hashes(folder)
    with pytest.raises(relsql.RelsqlError, match=r"project is not empty .*empty or new folder"):
        GroundingStore.open(g, folder, progress=False)
    assert hashes(folder) == before


def test_a_new_or_empty_folder_is_marked_and_a_rebuild_touches_only_relsql_files(tmp_path):
    db = world()
    empty = tmp_path / "empty"
    empty.mkdir()
    GroundingStore.open(grounder(db), empty, progress=False)
    assert (empty / MARK).is_file() and (empty / MANIFEST).is_file()
    folder = tmp_path / "new" / "store"
    first = GroundingStore.open(grounder(db), folder, progress=False)
    old_build = first.data
    (folder / "notes.txt").write_text("the user's notes")  # a user's files placed in the store folder later
    (folder / "pred_a426dfba.0.offsets").write_bytes(b"named like a store file")
    (folder / "build-notes").mkdir()
    user = {k: v for k, v in hashes(folder).items() if not k.startswith(old_build.name) and k not in (MARK, MANIFEST)}
    db.execute("UPDATE item SET x = x + 1 WHERE id = 3")  # other data: rebuilt
    second = GroundingStore.open(grounder(db), folder, progress=False)
    assert second.data != old_build and not old_build.exists()  # the old build went
    after = hashes(folder)
    assert {k: after[k] for k in user} == user


def test_a_link_named_like_a_temporary_file_or_the_mark_is_never_written_through(shop, tmp_path):
    db = world()
    outside = tmp_path / "outside.txt"
    outside.write_text("not relsql's")
    folder = tmp_path / "store"
    GroundingStore.open(grounder(db), folder, progress=False)
    for name in (MANIFEST + ".tmp", "manifest.json.part"):
        (folder / name).symlink_to(outside)
    db.execute("UPDATE item SET x = x + 1 WHERE id = 3")
    GroundingStore.open(grounder(db), folder, progress=False)
    assert outside.read_text() == "not relsql's"
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / MARK).symlink_to(outside)
    with pytest.raises(relsql.RelsqlError, match="not the mark relsql writes"):
        GroundingStore.open(shop[1], linked, progress=False)
    assert outside.read_text() == "not relsql's" and [p.name for p in linked.iterdir()] == [MARK]


def test_the_damaged_message_advises_deleting_only_a_folder_relsql_made(shop, tmp_path):
    _, g = shop
    made = tmp_path / "made"
    given = tmp_path / "given"
    given.mkdir()
    for folder in (made, given):
        store = GroundingStore.open(g, folder, progress=False)
        column = data_file(store, ".c1")
        column.write_bytes(column.read_bytes()[:100])
    with pytest.raises(relsql.RelsqlError, match=r"damaged.*manifest.json.*\(or delete the folder .*made: relsql made it\)"):
        GroundingStore.open(g, made, progress=False)
    with pytest.raises(relsql.RelsqlError, match=r"damaged") as refused:
        GroundingStore.open(g, given, progress=False)
    assert "delete the folder" not in str(refused.value) and "manifest.json and relsql rebuilds" in str(refused.value)
    (given / MANIFEST).unlink()  # the advice works: rebuilt, and correct
    assert same(GroundingStore.open(g, given, progress=False).ground(np.arange(50)), g.ground(np.arange(50)))


# -- contents are checked ---------------------------------------------------------------------------
def _zero_offsets(store, other):
    path = data_file(store, "pred_a426dfba.0.offsets")
    path.write_bytes(bytes(path.stat().st_size))


def _permute_row_ids(store, other):
    path = data_file(store, "pred_a426dfba.0.r0")
    ids = np.fromfile(path, dtype=np.int64)
    path.write_bytes(np.random.default_rng(0).permutation(ids).tobytes())


def _swap_from_another_store(store, other):
    name = "pred_a426dfba.0.r0"
    shutil.copyfile(data_file(other, name), data_file(store, name))


def _truncate(store, other):
    path = data_file(store, ".c1")
    path.write_bytes(path.read_bytes()[:-8])


def _extend(store, other):
    path = data_file(store, "user_items_d199ec51.0.offsets")
    path.write_bytes(path.read_bytes() + bytes(8))


def _swap_keys(store, other):
    keys = data_file(store, ".keys.arrow")
    keys.write_bytes(keys.read_bytes()[:-16] + bytes(16))


@pytest.mark.parametrize("tamper", [_zero_offsets, _permute_row_ids, _swap_from_another_store, _truncate, _extend, _swap_keys])
def test_tampered_files_are_refused(tmp_path, tamper):
    db, other_db = world(), world(shift=1)
    g = grounder(db)
    store = GroundingStore.open(g, tmp_path / "store", progress=False)
    other = GroundingStore.open(grounder(other_db), tmp_path / "other", progress=False)
    tamper(store, other)
    with pytest.raises(relsql.RelsqlError, match="damaged"):
        GroundingStore.open(g, tmp_path / "store", progress=False).ground(np.arange(g.sizes["pred"]))


def _row_id_past_the_end(manifest_folder: Path, store: GroundingStore) -> None:
    path = data_file(store, "pred_a426dfba.0.r1")
    ids = np.fromfile(path, dtype=np.int64)
    ids[5] = 10**9
    path.write_bytes(ids.tobytes())


def _code_past_the_end(manifest_folder: Path, store: GroundingStore) -> None:
    path = data_file(store, "user_h_4d2b0af5.0.c1")  # the in-memory embedding's codes
    codes = np.fromfile(path, dtype=np.int64)
    codes[7] = 12345
    path.write_bytes(codes.tobytes())


def _stored_code_negative(manifest_folder: Path, store: GroundingStore) -> None:
    path = data_file(store, "pred_a426dfba.0.c0")
    codes = np.fromfile(path, dtype=np.int64)
    codes[0] = -3
    path.write_bytes(codes.tobytes())


def _offsets_out_of_order(manifest_folder: Path, store: GroundingStore) -> None:
    path = data_file(store, "user_items_d199ec51.0.offsets")
    offsets = np.fromfile(path, dtype=np.int64)
    offsets[10], offsets[11] = offsets[11] + 5, offsets[10]
    path.write_bytes(offsets.tobytes())


@pytest.mark.parametrize("tamper", [_row_id_past_the_end, _code_past_the_end, _stored_code_negative, _offsets_out_of_order])
def test_values_out_of_range_are_refused_even_with_recomputed_checksums(tmp_path, tamper):
    """A hostile user who rewrites the checksums too: the range checks on what a batch reads
    still turn an impossible row id, code or offset into a RelsqlError (never an IndexError)."""
    db = world()
    g = grounder(db)
    folder = tmp_path / "store"
    tamper(folder, GroundingStore.open(g, folder, progress=False))
    reseal(folder)
    with pytest.raises(relsql.RelsqlError, match="damaged"):
        GroundingStore.open(g, folder, progress=False).ground(np.arange(g.sizes["pred"]))


@pytest.mark.parametrize("stem", ["../other/{build}/{stem}", "/etc/passwd", "a/b", "..", "{stem}/../{stem}", "", 3, None])
def test_a_manifest_stem_outside_its_build_folder_is_refused(shop, tmp_path, stem):
    _, g = shop
    other = GroundingStore.open(g, tmp_path / "other", progress=False)
    folder = tmp_path / "store"
    GroundingStore.open(g, folder, progress=False)

    def point(manifest):
        rule = manifest["relations"]["pred"]["rules"]["0"]
        value = stem.format(build=other.data.name, stem=rule["stem"]) if isinstance(stem, str) else stem
        rule["stem"] = value
        rule["parts"][0]["stem"] = value

    reseal(folder, point)
    with pytest.raises(relsql.RelsqlError, match="damaged.*(stem|plain file name|another rule)"):
        GroundingStore.open(g, folder, progress=False)


def test_a_deeply_nested_or_huge_manifest_is_a_relsql_error(shop, tmp_path):
    _, g = shop
    folder = tmp_path / "store"
    GroundingStore.open(g, folder, progress=False)
    (folder / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(relsql.RelsqlError, match="damaged.*not JSON"):
        GroundingStore.open(g, folder, progress=False)
    with open(folder / MANIFEST, "wb") as handle:
        handle.truncate(20 << 20)
    with pytest.raises(relsql.RelsqlError, match="damaged.*bytes"):
        GroundingStore.open(g, folder, progress=False)


# -- store I/O --------------------------------------------------------------------------------------
FULL_SCRIPT = """
import json, os, resource, sys
sys.path.insert(0, {root!r})
from tests.test_store_safety import world, grounder
from relsql.ground.store import GroundingStore
import relsql
g = grounder(world())
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # a real OS limit: a write past it fails with EFBIG
try:
    GroundingStore.open(g, {folder!r}, progress=False)
    print(json.dumps({{"outcome": "built"}}))
except relsql.RelsqlError as err:
    print(json.dumps({{"outcome": "RelsqlError", "message": str(err)}}))
"""


def test_a_full_disk_while_building_is_a_relsql_error_and_frees_the_partial_files(tmp_path):
    """The file size limit (RLIMIT_FSIZE, set in a subprocess: Python ignores SIGXFSZ, so a write
    past it fails with the real OS error EFBIG) stands in for a full disk without root."""
    folder = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", FULL_SCRIPT.format(root=str(ROOT), folder=str(folder))],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "RelsqlError" and "File too large" in result["message"], result
    assert "store= a folder on a larger disk" in result["message"]
    assert sorted(p.name for p in folder.iterdir()) == [MARK]  # no partial file stays


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_a_full_or_read_only_tmpfs_is_a_relsql_error(shop, tmp_path):
    """A real small tmpfs (ENOSPC, then remounted read-only: EROFS); needs root and mount."""
    _, g = shop
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "48k"):
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        with pytest.raises(relsql.RelsqlError, match="No space left on device.*partial files were removed"):
            GroundingStore.open(g, disk / "store", progress=False)
        assert sorted(p.name for p in (disk / "store").iterdir()) == [MARK]
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        built = GroundingStore.open(g, disk / "store", progress=False).ground(np.arange(20))
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        assert same(GroundingStore.open(g, disk / "store", progress=False).ground(np.arange(20)), built)  # read-only reuse
        with pytest.raises(relsql.RelsqlError, match="Read-only file system.*pass store= a folder you can write"):
            GroundingStore.open(grounder(world(shift=2)), disk / "store", progress=False)  # a rebuild cannot write
        with pytest.raises(relsql.RelsqlError, match="Read-only file system"):
            GroundingStore.open(g, disk / "new", progress=False)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_folders_in_the_way_and_proc_self_are_relsql_errors(shop, tmp_path):
    _, g = shop
    with pytest.raises(relsql.RelsqlError, match="not empty.*empty or new folder"):
        GroundingStore.open(g, "/proc/self", progress=False)
    marked = tmp_path / "marked"
    marked.mkdir()
    (marked / MARK).mkdir()  # a folder named like the mark
    with pytest.raises(relsql.RelsqlError, match="not the mark relsql writes"):
        GroundingStore.open(g, marked, progress=False)
    store = tmp_path / "store"
    GroundingStore.open(g, store, progress=False)
    (store / MANIFEST).unlink()
    (store / MANIFEST).mkdir()  # a folder named like the manifest
    (store / MANIFEST / "keep.txt").write_text("kept")
    with pytest.raises(relsql.RelsqlError, match="damaged.*manifest.json is not a regular file"):
        GroundingStore.open(g, store, progress=False)
    assert (store / MANIFEST / "keep.txt").read_text() == "kept"
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(relsql.RelsqlError, match="is a file"):
        GroundingStore.open(g, a_file, progress=False)
    assert a_file.read_text() == "x"


def test_writing_a_part_imports_no_torch():
    """Spark's executors run relsql.ground.parts; a data cluster's executors rarely have torch."""
    code = ("import sys, relsql.ground.parts, relsql.errors; assert 'torch' not in sys.modules, 'torch was imported'; "
            "from relsql.ground.parts import PartWriter; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    public = ("import relsql; from relsql import " + ", ".join(relsql.__all__) +
              "; assert callable(relsql.compile) and callable(relsql.tune) and relsql.Model.__name__ == 'Model'; print('ok')")
    done = subprocess.run([sys.executable, "-c", public], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_model_refuses_a_user_folder_as_its_store_and_leaves_it_byte_identical(tmp_path):
    """What a user writes (`Model(..., store=folder)`), on a folder holding a project's files."""
    db = world()
    project = tmp_path / "proj"
    project.mkdir()
    (project / MANIFEST).write_text('{"name": "my project"}')
    (project / "pred_a426dfba.0.offsets").write_bytes(b"a user's file named like a store file")
    before = hashes(project)
    with warnings.catch_warnings(), pytest.raises(relsql.RelsqlError, match="proj is not empty"):
        warnings.simplefilter("ignore")
        relsql.Model(db, relsql.Template.from_sql(TEMPLATE), target="item.y", batch_size=500, progress=False, store=project)
    assert hashes(project) == before
