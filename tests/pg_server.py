"""A throwaway PostgreSQL server for the test session: initdb in a temp dir, loopback only.

    server = PostgresServer.start()        # None-safe: PostgresServer.find_bin() is None without binaries
    url = server.createdb("shop")          # postgresql://postgres@127.0.0.1:<port>/shop
    server.stop()

initdb refuses to run as root, so as root every server command runs as the `postgres` user
(`runuser -u postgres --`) in directories owned by it. The server listens on 127.0.0.1 at a
free high port with its socket in the temp dir, trusts local connections, and is stopped (and
its files removed) by `stop()`.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def find_bin() -> Path | None:
    """The bin folder of the newest installed PostgreSQL server (with initdb and pg_ctl)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
                        if Path(p).parent.parent.name.isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    def __init__(self, bindir: Path, root: Path, port: int, run_as: str | None):
        self.bindir = bindir
        self.root = root
        self.port = port
        self.run_as = run_as
        self.user = run_as or pwd.getpwuid(os.getuid()).pw_name
        self.data = root / "data"
        self.socket_dir = root / "sock"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.run_as:
            command = ["runuser", "-u", self.run_as, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    @classmethod
    def start(cls, bindir: Path | None = None) -> PostgresServer:
        bindir = bindir or find_bin()
        if bindir is None:
            raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl); run scripts/setup")
        run_as = "postgres" if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="relsql-pg-"))
        (root / "sock").mkdir()
        if run_as:
            entry = pwd.getpwnam(run_as)
            for path in (root, root / "sock"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        root.chmod(0o755)
        last: Exception | None = None
        for _ in range(3):  # a free port can be taken between probing and binding: retry
            server = cls(bindir, root, _free_port(), run_as)
            try:
                if not server.data.exists():
                    server._run("initdb", "-D", str(server.data), "--auth=trust", "--no-sync", "-U", server.user,
                                "-E", "UTF8", "--locale=C")
                server._run("pg_ctl", "-D", str(server.data), "-l", str(root / "server.log"), "-w", "-t", "60", "-o",
                            f"-p {server.port} -k {server.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
                return server
            except Exception as err:  # noqa: BLE001
                last = err
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {last}")

    def url(self, database: str = "postgres", *, user: str | None = None, password: str | None = None) -> str:
        auth = user or self.user
        if password is not None:
            auth += f":{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def createdb(self, name: str) -> str:
        self._run("createdb", "-h", str(self.socket_dir), "-p", str(self.port), "-U", self.user, name)
        return self.url(name)

    def psql(self, database: str, sql: str) -> str:
        return self._run("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.socket_dir), "-p", str(self.port),
                         "-U", self.user, "-d", database, "-c", sql).stdout

    def stop(self) -> None:
        try:
            if self.data.exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
