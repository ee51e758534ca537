"""A real PostgreSQL (Debian's `postgresql` package) in a temporary directory on a free port, for the
shared-database tests: `initdb` + `pg_ctl`, trust authentication on 127.0.0.1 and a socket in the
directory. initdb refuses root, so as root every server command runs as the `postgres` user the
package creates. Durability per statement is kept (synchronous commit, so a killed server keeps what it
acknowledged); fsync is off, since the tests kill the server, never the machine.

Fixtures: `postgres` (one server per test session; never stop it) and `postgres_url` (a fresh,
empty database on it per test). A fault test that stops, starts or kills the server makes its own with
`postgres_server()`."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.process import free_port

USER = "eg"
RUN_AS = "postgres"  # the package's user; root's commands run as it
START_TIMEOUT_S = 60


def postgres_bin() -> Path:
    """The folder of initdb/pg_ctl/createdb: ENGINEGATE_POSTGRES_BIN, else Debian's newest; skip (or fail
    under ENGINEGATE_REQUIRE_REAL_ENGINES) when there is none."""
    explicit = os.environ.get("ENGINEGATE_POSTGRES_BIN")
    found = [explicit] if explicit else sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                                key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0)
    for folder in reversed(found):
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    reason = "PostgreSQL is not installed (apt-get install postgresql: initdb and pg_ctl under /usr/lib/postgresql/*/bin)"
    if os.environ.get("ENGINEGATE_REQUIRE_REAL_ENGINES"):
        pytest.fail(reason)
    pytest.skip(reason)


def _run_as() -> dict[str, Any]:
    """subprocess arguments that run a server command as `postgres` when this process is root."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam(RUN_AS)
    except KeyError:
        pytest.fail(f"running as root and there is no {RUN_AS!r} user to run PostgreSQL as (initdb refuses root)")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


@dataclass
class PostgresServer:
    bindir: Path
    folder: Path
    port: int

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def _cmd(self, *args: str, check: bool = True, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=timeout,
                              cwd=self.folder, **_run_as())

    def init(self) -> None:
        self._cmd(str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust",
                  "--no-sync", "-E", "UTF8", "--locale=C")

    def running(self) -> bool:
        return self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "status", check=False).returncode == 0

    def start(self) -> None:
        """Start it (again, on the same port and data); a running server is left as it is."""
        if self.running():
            return
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c full_page_writes=off -c shared_buffers=16MB -c max_connections=200")
        result = self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options,
                           "-l", str(self.folder / "log"), "-w", "-t", str(START_TIMEOUT_S), "start", check=False)
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {result.stdout}{result.stderr}\n{self.log()}")

    def stop(self) -> None:
        """A clean, fast stop: clients are disconnected, the port refuses connections until start()."""
        self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL the postmaster (its backends exit when they see it gone)."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)

    def createdb(self, name: str | None = None) -> str:
        """A fresh empty database; returns its URL."""
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        self._cmd(str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name)
        return self.url(name)

    def psql(self, database: str, sql: str) -> str:
        return self._cmd(str(self.bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
                         "-d", database, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql).stdout

    def log(self) -> str:
        try:
            return (self.folder / "log").read_text(errors="replace")
        except OSError:
            return ""


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A started server in a new temporary directory; stopped (killed if need be) and removed at exit."""
    bindir = postgres_bin()
    folder = Path(tempfile.mkdtemp(prefix="enginegate-pg-"))
    run_as = _run_as()
    if run_as:
        os.chown(folder, run_as["user"], run_as["group"])
    server = PostgresServer(bindir, folder, free_port())
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop()
        server.kill()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    return postgres.createdb()
