"""The folder a store lives in: claimed with relsql's mark (only a new or empty folder becomes a
store), locked while a build writes it (builds of one folder take turns), cleared of old builds
before a rebuild; a torchrun rank other than 0 waits for the store rank 0 writes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from pathlib import Path

from relsql.errors import RelsqlError
from relsql.ground.parts import io_error
from relsql.ground.store.layout import BUILD, BUILD_MARK, MANIFEST, MARK
from relsql.ground.store.manifest import current, read_manifest
from relsql.textfile import read_text

_MARK_KIND = "relsql grounding store"


def follower() -> bool:
    """This process is a rank other than 0 of a torchrun group (relsql's own ranks attach instead)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("RANK", "0") != "0" and "RELSQL_RANK" not in os.environ


def wait_for(folder: Path, mark: str, timeout: float = 3600.0) -> dict:
    """The manifest rank 0 writes for this data (`mark`), once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        manifest = read_manifest(folder, False) if (folder / MARK).is_file() else None
        if current(manifest, mark):
            return manifest
        time.sleep(0.5)
    raise RelsqlError(f"grounding store {folder}: rank 0 did not write it within {timeout:.0f}s; a kept store shared by "
                      "torchrun's ranks must be on storage every rank can read")


def claim(folder: Path) -> bool:
    """Make `folder` a store (it is new or empty: relsql writes its mark there) or confirm it is one
    (it has the mark); refuse any other folder. True when relsql made the folder."""
    created = False
    if not os.path.lexists(folder):
        try:
            folder.mkdir(parents=True)
            created = True
        except FileExistsError:
            pass
        except OSError as err:
            raise io_error(err, folder, "create the folder") from None
    if not folder.is_dir():
        raise RelsqlError(f"store {str(folder)!r} is a file; give a folder for the grounding store (made if missing)")
    marked = _read_mark(folder)
    if marked is not None:
        return marked
    try:
        entries = sorted(os.listdir(folder))
    except OSError as err:
        raise io_error(err, folder, "list the folder") from None
    if entries:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3:,} more" if len(entries) > 3 else "")
        raise RelsqlError(f"store folder {folder} is not empty ({shown}) and is not a grounding store relsql made; "
                          "relsql keeps a store only in a folder of its own: pass store= an empty or new folder")
    try:
        fd = os.open(folder / MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except FileExistsError:  # another process claimed it at the same time
        return bool(_read_mark(folder))
    except OSError as err:
        raise io_error(err, folder / MARK, "create") from None
    try:
        os.write(fd, json.dumps({"kind": _MARK_KIND, "created": created}).encode())
    except OSError as err:
        raise io_error(err, folder / MARK, "write") from None
    finally:
        os.close(fd)
    return created


def _read_mark(folder: Path) -> bool | None:
    """None without a mark; else whether relsql made the folder. A mark that is not relsql's is refused."""
    path = folder / MARK
    for _ in range(50):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise io_error(err, path, "read") from None
        if not stat.S_ISREG(info.st_mode):
            break
        text = read_text(path, "grounding store mark", limit=4096)
        if text:
            try:
                mark = json.loads(text)
            except (ValueError, RecursionError):
                break
            if isinstance(mark, dict) and mark.get("kind") == _MARK_KIND and isinstance(mark.get("created"), bool):
                return mark["created"]
            break
        time.sleep(0.01)  # an empty mark: another process is writing it
    raise RelsqlError(f"store folder {folder} has a {MARK} that is not the mark relsql writes; relsql keeps a store "
                      "only in a folder of its own: pass store= an empty or new folder")


@contextlib.contextmanager
def locked(folder: Path):
    """Builds of one store take turns: an exclusive lock on its mark, released when the process ends."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here: concurrent builds write separate build folders
        yield
        return
    try:
        fd = os.open(folder / MARK, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise io_error(err, folder / MARK, "lock") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def clear(folder: Path) -> None:
    """Remove the store's old manifest and every build folder (under the lock: none is being written)."""
    try:
        if os.path.lexists(folder / MANIFEST):
            os.unlink(folder / MANIFEST)
        for entry in os.scandir(folder):
            if (BUILD.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)
                    and os.path.isfile(os.path.join(entry.path, BUILD_MARK))):
                shutil.rmtree(entry.path)
    except OSError as err:
        raise io_error(err, err.filename or folder, "remove the old store's") from None
