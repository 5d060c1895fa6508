"""Reading a file relsql takes as text (templates, imports, keys files, manifests), bounded.

A path a user passes may name anything: `/dev/zero`, a FIFO, a folder, a 20 GB log. relsql
reads only regular files, at most `limit` bytes, and says so in a RelsqlError of the caller's
class instead of reading until the kernel stops the process.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from relsql.errors import RelsqlError

TEXT_LIMIT = 16 << 20  # bytes: far above any template or keys file written by hand or by relsql


def open_regular(path: str | os.PathLike, what: str, error: type[RelsqlError] = RelsqlError) -> BinaryIO:
    """`path` opened for binary reading if it is a regular file, else `error` naming it and the fix.
    Opened non-blocking: a FIFO (or a device) is refused by fstat instead of blocking the open until
    some writer appears."""
    path = Path(path)
    if "\x00" in str(path):
        raise error(f"{what} {str(path)!r} has a NUL character, which no file name can hold; check the path")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist, so relsql cannot read it; check the path") from None
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror or err}; check the path and its permissions") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{what} {path} is a folder; pass the file inside it")
        raise error(f"{what} {path} is not a regular file (a device, pipe or socket); pass a file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: str | os.PathLike, what: str, error: type[RelsqlError] = RelsqlError,
               limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or `error` naming the file and the fix."""
    path = Path(path)
    with open_regular(path, what, error) as file:
        try:
            size = os.fstat(file.fileno()).st_size
            if size > limit:
                raise error(f"{what} {path} is {size:,} bytes, more than the {limit:,} relsql reads as text; "
                            "pass the right file (or split it)")
            data = file.read(limit + 1)
        except OSError as err:
            raise error(f"cannot read {what} {path}: {err.strerror or err}; check the file") from None
    if len(data) > limit:  # the file grew while read
        raise error(f"{what} {path} is more than the {limit:,} bytes relsql reads as text; pass the right file")
    return data


def read_text(path: str | os.PathLike, what: str, error: type[RelsqlError] = RelsqlError,
              limit: int = TEXT_LIMIT) -> str:
    """A bounded regular file decoded as UTF-8 (a byte-order mark is allowed)."""
    data = read_bytes(path, what, error, limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise error(f"{what} {path} is not a text file in UTF-8 (byte 0x{data[err.start]:02x} on line {line}); "
                    "save it as UTF-8") from None
