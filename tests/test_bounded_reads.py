"""Files relsql reads as text are regular files of bounded size (issue #27, must-fix 4).

Before, `relsql.connect(keys="/dev/zero")` read until the kernel killed the process at 23.8 GB,
and a template path naming a FIFO blocked forever. Each case here must end in a RelsqlError
quickly; the child-process cases would hang or be killed on the old code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import relsql
from relsql import textfile
from relsql.errors import RelsqlError, SchemaError, SourceError, TemplateError


def _in_child(code: str, tmp_path, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with a 2 GB address-space cap: a read of /dev/zero
    without a bound dies there instead of exhausting the machine."""
    script = tmp_path / "child.py"
    script.write_text("import resource\nresource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n" + textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(os.path.dirname(__file__)))


def test_keys_from_dev_zero_is_refused(tmp_path):
    done = _in_child("""
        import relsql
        try:
            relsql.connect(keys="/dev/zero")
        except relsql.RelsqlError as err:
            print("refused:", err)
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout and "/dev/zero" in done.stdout and "not a regular file" in done.stdout


def test_template_from_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "template.sql"
    os.mkfifo(fifo)
    done = _in_child(f"""
        import relsql
        try:
            relsql.Template.from_file({str(fifo)!r})
        except relsql.RelsqlError as err:
            print("refused:", type(err).__name__, err)
    """, tmp_path, timeout=30)
    assert "refused: TemplateError" in done.stdout and "not a regular file" in done.stdout


def test_keys_naming_a_folder_is_refused(tmp_path):
    with pytest.raises(SchemaError, match="is a folder"):
        relsql.connect(keys=str(tmp_path))


def test_keys_with_a_nul_character_is_refused():
    with pytest.raises(RelsqlError, match="NUL"):
        relsql.connect(keys="\x00")


def test_a_template_over_the_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.sql"
    with open(big, "wb") as out:  # sparse: the size is what counts, not the bytes on disk
        out.truncate(textfile.TEXT_LIMIT + 1)
    with pytest.raises(TemplateError, match="more than the"):
        relsql.Template.from_file(big)


def test_a_datalog_import_of_a_device_is_refused(tmp_path):
    main = tmp_path / "main.txt"
    os.symlink("/dev/zero", tmp_path / "zero.txt")
    main.write_text("import ./zero.txt\n")
    with pytest.raises(TemplateError, match=r":1: imported file .*not a regular file"):
        relsql.Template.from_file(main)


def test_a_file_within_the_limit_reads_as_before(tmp_path):
    keys = tmp_path / "keys.sql"
    keys.write_bytes("\ufeffPRIMARY KEY (t.id);\n".encode())
    assert textfile.read_text(keys, "keys file") == "PRIMARY KEY (t.id);\n"
    with pytest.raises(SourceError, match="line 2"):
        textfile.read_text(_write(tmp_path / "bad.txt", b"ok\n\xff"), "data file", SourceError)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path
