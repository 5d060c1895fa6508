"""Files relsql writes where a user points it: a model and its metrics plot, a template, a file of
predictions or recommendations. One rule for all of them, the rule tables already follow
(Database.replaceable): relsql creates a new file, or replaces a file it wrote itself, recognised
by a mark it can check; never a user's file, not even with --replace.

Why a mark, and which: a name alone proves nothing (`relsql train --model notes.pt` must not
destroy notes.pt), so relsql recognises its own files by what is in them.

- a saved model or training checkpoint: its own format header (`relsql-model-N` as the first
  value of the pickle inside torch's zip), read from the first bytes only;
- Parquet: relsql's mark in the footer's metadata (relsql.data.duckdb.with_mark);
- PNG: a `relsql` text chunk before the image data;
- text and CSV, which have no room for a mark a reader would ignore: a sidecar `.<name>.relsql`
  beside the file, holding the kind and the SHA-256 of the bytes relsql wrote. A file whose
  bytes changed since (an edited template, a user's file saved under that name) no longer
  matches, and is refused like any other.

Anything else that exists there, a symlink, a FIFO or device included, is refused unread with an
error naming the file and the fix. Writes go to a temporary file in the same folder and are
renamed into place; a file that appears meanwhile is not replaced (a hard link creates the name
only if it is free).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from relsql.errors import RelsqlError

WRITTEN_BY = "written by relsql: "  # the same words as a table's mark (relsql.data.duckdb.WRITTEN_BY)
SIDECAR = ".relsql"
KINDS = {"model": "saved model", "checkpoint": "training checkpoint", "metrics plot": "metrics plot",
         "template": "template", "predictions": "file of predictions", "recommendations": "file of recommendations"}
_FORMATS = {b"relsql-model-": "model", b"relsql-checkpoint-": "checkpoint"}
_PNG = b"\x89PNG\r\n\x1a\n"
_PNG_KEY = b"relsql"
_SIDECAR_BYTES = 4096  # a sidecar is a line of JSON; a bigger file of that name is not relsql's


class FileNotOwned(RelsqlError):
    """A file exists where relsql would write, and relsql did not write it: it is left as it is."""


def sidecar(path: Path) -> Path:
    """Where the mark of a text or CSV file goes: `.<name>.relsql` beside it."""
    return path.with_name(f".{path.name}{SIDECAR}")


def _format_mark(path: Path) -> str | None:
    """The kind of a relsql model or checkpoint file, from the first bytes of its pickle."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(names) != 1:
                return None
            with archive.open(names[0]) as pickle:
                head = pickle.read(64)
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError, NotImplementedError):
        return None
    if b"format" not in head[:24]:
        return None
    return next((kind for prefix, kind in _FORMATS.items() if prefix in head), None)


def _png_mark(path: Path) -> str | None:
    """The kind in a PNG's `relsql` text chunk (chunks before the image data only, a few at most)."""
    try:
        with open(path, "rb") as file:
            if file.read(8) != _PNG:
                return None
            for _ in range(32):
                head = file.read(8)
                if len(head) < 8:
                    return None
                size, kind = int.from_bytes(head[:4], "big"), head[4:]
                if kind in (b"IDAT", b"IEND") or size > 1 << 16:
                    return None
                data = file.read(size + 4)[:size]
                key, _, value = data.partition(b"\0")
                if kind == b"tEXt" and key == _PNG_KEY:
                    return _kind(value.decode("latin-1"))
    except OSError:
        return None
    return None


def _kind(text: str) -> str | None:
    return (text[len(WRITTEN_BY):].strip() or None) if text.startswith(WRITTEN_BY) else None


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sidecar_record(path: Path) -> dict | None:
    """The sidecar's record, if a relsql sidecar is there (a small regular file of relsql's JSON)."""
    mark = sidecar(path)
    try:
        status = os.lstat(mark)
        if not stat.S_ISREG(status.st_mode) or status.st_size > _SIDECAR_BYTES:
            return None
        record = json.loads(mark.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("written_by") != "relsql":
        return None
    return record


def _sidecar_mark(path: Path, size: int) -> tuple[str | None, bool]:
    """(kind, unchanged) from the sidecar: unchanged when the file still holds the bytes relsql wrote."""
    record = _sidecar_record(path)
    if record is None or not isinstance(record.get("kind"), str):
        return None, False
    try:
        unchanged = record.get("size") == size and record.get("sha256") == _digest(path)
    except OSError:
        unchanged = False
    return record["kind"], unchanged


def refusal(path: str | Path, kind: str) -> str | None:
    """Why relsql may not write `path` as a file of `kind` (None: nothing is there, or a file of
    that kind relsql wrote). Reads at most a file's first bytes, except a sidecar's hash."""
    path = Path(path)
    name = KINDS[kind]
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot check {path}: {err.strerror or err}"
    if not stat.S_ISREG(status.st_mode):  # a link, folder, FIFO or device is never relsql's: not opened
        return f"{path} exists and is not a regular file (a link, folder, FIFO or device)"
    if kind in ("model", "checkpoint"):
        found = _format_mark(path)
    elif path.suffix.lower() == ".parquet":
        from relsql.data.duckdb import parquet_mark

        found = parquet_mark(path)
    elif kind == "metrics plot":
        found = _png_mark(path)
    else:
        found, unchanged = _sidecar_mark(path, status.st_size)
        if found == kind and not unchanged:
            return f"{path} was changed since relsql wrote it (it is no longer the {name} relsql wrote)"
    if found == kind:
        return None
    return f"{path} exists and is not a {name} relsql wrote" + (f" (it is a {KINDS.get(found, found)})" if found else "")


def check(path: str | Path, kind: str, fix: str) -> Path:
    """`path`, if relsql may write a file of `kind` there; else FileNotOwned naming it and `fix`."""
    why = refusal(path, kind)
    if why is not None:
        raise FileNotOwned(f"{why}; relsql never replaces a file it did not write: {fix}")
    mark = sidecar(Path(path))
    if kind not in ("model", "checkpoint", "metrics plot") and Path(path).suffix.lower() != ".parquet" \
            and os.path.lexists(mark) and _sidecar_record(Path(path)) is None:
        raise FileNotOwned(f"{mark} (where relsql marks {path} as its own) exists and is not relsql's; relsql never "
                           f"replaces a file it did not write: {fix}")
    return Path(path)


@contextlib.contextmanager
def temporary(path: Path) -> Iterator[Path]:
    """A temporary file beside `path` (yielded); removed unless it was moved into place."""
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        yield Path(name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def place(written: Path, path: Path, kind: str, fix: str) -> None:
    """Move the finished temporary file `written` to `path`: onto a free name only if it is still
    free, onto an existing file only if it is relsql's (checked again now, just before the rename)."""
    if not os.path.lexists(path):
        try:
            os.link(written, path)  # fails if `path` appeared since: no check-then-write race
            os.unlink(written)
            return
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not os.path.lexists(path):
                os.replace(written, path)
                return
    check(path, kind, fix)
    os.replace(written, path)


def _mark_beside(path: Path, kind: str, size: int, digest: str) -> None:
    """The sidecar recording that `path` holds `size` bytes with SHA-256 `digest`, written by relsql."""
    record = json.dumps({"written_by": "relsql", "kind": kind, "size": size, "sha256": digest,
                         "note": f"relsql wrote {path.name}; it replaces that file only while it holds these bytes"})
    mark = sidecar(path)
    with temporary(mark) as partial:
        partial.write_text(record + "\n", encoding="utf-8")
        os.replace(partial, mark)


def _identical(path: Path, data: bytes) -> bool:
    """Whether `path` is a regular file holding exactly `data` (replacing it changes nothing)."""
    try:
        status = os.lstat(path)
        if not stat.S_ISREG(status.st_mode) or status.st_size != len(data):
            return False
        return path.read_bytes() == data
    except OSError:
        return False


def write_marked(path: str | Path, kind: str, fix: str, fill) -> Path:
    """Write a file of `kind` at `path` through `fill(temporary_path)`, atomically, with its mark:
    in-band for models, Parquet and PNG (`fill` writes it), a sidecar for the rest. Refuses first
    (FileNotOwned) when `path` holds a file relsql did not write; an OSError becomes a RelsqlError."""
    path = Path(path)
    check(path, kind, fix)
    in_band = kind in ("model", "checkpoint", "metrics plot") or path.suffix.lower() == ".parquet"
    try:
        with temporary(path) as partial:
            fill(partial)
            digest, size = (None, 0) if in_band else (_digest(partial), partial.stat().st_size)
            place(partial, path, kind, fix)
        if not in_band:
            _mark_beside(path, kind, size, digest)
    except OSError as err:
        raise RelsqlError(f"cannot write the {KINDS[kind]} {path}: {err.strerror or err}; {fix}") from None
    return path


def write_text(path: str | Path, text: str, kind: str, fix: str) -> Path:
    """`text` (UTF-8) as `path`, marked as relsql's `kind`. A file already holding exactly these
    bytes is left as it is (and marked): writing it again would change nothing."""
    path, data = Path(path), text.encode("utf-8")
    if _identical(path, data) and (not os.path.lexists(sidecar(path)) or _sidecar_record(path) is not None):
        try:
            _mark_beside(path, kind, len(data), hashlib.sha256(data).hexdigest())
        except OSError as err:
            raise RelsqlError(f"cannot mark the {KINDS[kind]} {path}: {err.strerror or err}; {fix}") from None
        return path
    return write_marked(path, kind, fix, lambda partial: partial.write_bytes(data))


def png_metadata(kind: str = "metrics plot") -> dict[str, str]:
    """Matplotlib's savefig(metadata=) for a PNG that bears relsql's mark."""
    return {_PNG_KEY.decode(): WRITTEN_BY + kind}


def save_figure(figure, path: str | Path, fix: str, **options) -> Path:
    """A matplotlib figure as a PNG at `path`, marked, atomically; never over a user's file."""
    return write_marked(path, "metrics plot", fix,
                        lambda partial: figure.savefig(partial, format="png", metadata=png_metadata(), **options))
