"""A throwaway PostgreSQL cluster for tests, benchmarks and sample captures.

`PgCluster` runs ``initdb`` in a fresh temporary directory, configures it for
logical decoding (``wal_level=logical``, a free loopback port, a Unix socket in
the same directory, durability off), starts it with ``pg_ctl`` and removes it
all on `stop`. It reads pgoutput through the SQL interface
(``pg_logical_slot_peek_binary_changes`` / ``..._get_...``) with a server-side
cursor, so a capture of millions of messages streams through bounded memory::

    with PgCluster.debian(15) as pg:
        pg.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR ALL TABLES")
        pg.create_slot("s")
        pg.execute("INSERT INTO t VALUES (1)")
        messages = pg.peek_pgoutput("s", publications=["p"], proto_version=1)

`standby` makes a hot standby of a started cluster (``pg_basebackup``, then streaming
replication; `wait_replayed` waits for it to catch up), which `promote` turns into a primary.

The server refuses to run as root, so when we are root every server binary
runs as the ``postgres`` OS user and the directory is chowned to it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psycopg

from .capture_files import CapturedMessage
from ..slot.options import StreamingMode, flatten_options, pgoutput_options, quote_ident

__all__ = ["CapturedMessage", "PgCluster", "PgClusterError", "pgserver_bindir", "unpack_pgserver"]

_log = logging.getLogger(__name__)

_SERVER_USER = "postgres"
_LOG_TAIL_LINES = 40
# What a base backup leaves out (as pg_basebackup does): these folders' files, and these files.
_BACKUP_EMPTIED = {(name,) for name in ("pg_wal", "pg_stat_tmp", "pg_replslot", "pg_dynshmem", "pg_notify",
                                        "pg_serial", "pg_snapshots", "pg_subtrans")}
_BACKUP_SKIPPED = {"postmaster.pid", "postmaster.opts", "pg_internal.init", "backup_label", "tablespace_map",
                   "current_logfiles"}
_MAX_SOCKET_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
#: The pgserver release whose PostgreSQL 16 binaries serve (the dev extra pins the same).
PGSERVER = "pgserver==0.1.4"
#: Where `pgserver_bindir` unpacks those binaries for a Python pgserver has no build for.
_UNPACKED = Path(sys.prefix) / "share" / "pgoutput-spark" / PGSERVER.replace("==", "-")
_WHEEL_BINDIR = Path("pgserver", "pginstall", "bin")

# synchronous_commit stays on: logical decoding reads WAL only up to the flush
# pointer, so with asynchronous commit a transaction that just committed is
# invisible to a peek for up to wal_writer_delay. With fsync off a flush is a
# plain write() to the page cache, so synchronous commit costs next to nothing.
_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_prepared_transactions": "20",
    "logical_decoding_work_mem": "'64kB'",
    "max_replication_slots": "100",
    "max_wal_senders": "30",
    "fsync": "off",
    "full_page_writes": "off",
    "listen_addresses": "'127.0.0.1'",
    "track_commit_timestamp": "on",
}


class PgClusterError(RuntimeError):
    """The throwaway cluster could not be set up, started, stopped or used."""


def free_port() -> int:
    """A TCP port on loopback that nothing listened on a moment ago (the system's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pgserver_bindir(*, unpack: bool = False) -> Path:
    """The directory of the PostgreSQL 16 server binaries the ``pgserver`` wheel ships.

    Those of the installed ``pgserver`` package; where it is not installed (Python 3.13, for
    which pgserver has no build), those `unpack_pgserver` unpacked into this environment's
    ``share/pgoutput-spark``, and with `unpack` it unpacks them there first if it has not yet
    (``./dev test`` does that).
    """
    package = _installed_pgserver()
    if package is not None:
        return package / "pginstall" / "bin"
    bindir = _UNPACKED / _WHEEL_BINDIR
    if (bindir / "postgres").is_file():
        return bindir
    if not unpack:
        raise PgClusterError(
            f"PostgreSQL 16's binaries not found: the pgserver package is not installed"
            f" (pip install '{PGSERVER}'; it is in the dev extra: pip install -e '.[dev]'),"
            f" and none were unpacked from its wheel into {_UNPACKED} (on a Python pgserver has"
            " no build for, `./dev test` unpacks them: python -c 'from pgoutput_spark.testing.pgcluster"
            " import pgserver_bindir; pgserver_bindir(unpack=True)')"
        )
    return unpack_pgserver(_UNPACKED)


def _installed_pgserver() -> Path | None:
    """The installed pgserver package's folder (None: not installed); only looked up, not imported."""
    spec = importlib.util.find_spec("pgserver")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def unpack_pgserver(root: Path) -> Path:
    """Fetch pgserver's Python 3.12 wheel and unpack its PostgreSQL 16 into `root` (which must
    not exist yet); return the directory of its server binaries.

    The binaries are no Python extension: only the wheel's tag names a Python, so they serve
    any. pip fetches the wheel (its index and settings apply); nothing of pgserver's Python is
    unpacked, only the server and the libraries it links (``pgserver.libs``), in the wheel's
    layout, which their relative RUNPATHs need.
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        fetch = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                 "--python-version", "3.12", "--platform", f"manylinux2014_{platform.machine()}",
                 "--dest", tmp, PGSERVER]
        fetched = subprocess.run(fetch, capture_output=True, text=True)
        if fetched.returncode:
            raise PgClusterError(f"could not fetch the {PGSERVER} wheel: {' '.join(fetch)}"
                                 f" exited {fetched.returncode}: {fetched.stderr.strip()[-2000:]}")
        (wheel,) = Path(tmp).glob("pgserver-*.whl")
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheel) as zipped:
            for member in zipped.infolist():
                if member.filename.startswith(("pgserver/pginstall/", "pgserver.libs/")) and not member.is_dir():
                    path = Path(zipped.extract(member, unpacked))
                    mode = member.external_attr >> 16 & 0o777  # zipfile leaves modes out
                    if mode:
                        path.chmod(mode)
        unpacked.chmod(0o755)
        os.replace(unpacked, root)
    return root / _WHEEL_BINDIR


class PgCluster:
    """One throwaway PostgreSQL cluster in a temporary directory (see module docstring)."""

    def __init__(self, bindir: str | Path, *, base_dir: str | Path | None = None,
                 settings: Mapping[str, str] | None = None, client_bindir: str | Path | None = None) -> None:
        """`bindir` holds initdb, pg_ctl and postgres; the cluster directory is
        created under `base_dir` (default: the system temp dir), which the
        ``postgres`` OS user must be able to traverse when we run as root.
        `settings` override the server settings (``{"wal_level": "replica"}``).
        `client_bindir`: where the client programs `bindir` lacks are (``pgbench``), for a
        server-only build (its standbys' base backups are taken without ``pg_basebackup``)."""
        self._bindir = Path(bindir)
        self._client_bindir = Path(client_bindir) if client_bindir is not None else None
        self._settings = {**_SETTINGS, **(settings or {})}
        for tool in ("initdb", "pg_ctl", "postgres"):
            if not (self._bindir / tool).is_file():
                raise PgClusterError(f"{tool} not found in {self._bindir}")
        self._base_dir = Path(base_dir) if base_dir is not None else None
        self._primary: PgCluster | None = None
        self._root: Path | None = None
        self._port: int | None = None
        self._version_num: int | None = None

    # -- construction -------------------------------------------------------------

    @classmethod
    def debian(cls, version: int = 15, base_dir: str | Path | None = None,
               settings: Mapping[str, str] | None = None) -> PgCluster:
        """A cluster from the Debian ``postgresql-<version>`` binaries."""
        bindir = Path(f"/usr/lib/postgresql/{version}/bin")
        if not (bindir / "postgres").is_file():
            raise PgClusterError(
                f"PostgreSQL {version} server binaries not found in {bindir}: "
                f"`.ci/run` installs them, or run `apt-get install postgresql-{version}`"
                " (`apt-get install postgresql` on Debian 12 gives 15)"
            )
        return cls(bindir, base_dir=base_dir, settings=settings)

    @classmethod
    def pgserver(cls, base_dir: str | Path | None = None) -> PgCluster:
        """A cluster from the PostgreSQL 16 binaries in the ``pgserver`` wheel (see `pgserver_bindir`).

        Only the package location is looked up; pgserver's own server is not started.
        """
        return cls(pgserver_bindir(), base_dir=base_dir)

    # -- properties ---------------------------------------------------------------

    @property
    def bindir(self) -> Path:
        return self._bindir

    @property
    def port(self) -> int:
        return self._require_started()[1]

    @property
    def host(self) -> str:
        """The Unix socket directory (libpq treats a path as host)."""
        return str(self._require_started()[0])

    @property
    def data_dir(self) -> Path:
        return self._require_started()[0] / "data"

    @property
    def log_file(self) -> Path:
        return self._require_started()[0] / "server.log"

    @property
    def version_num(self) -> int:
        """``server_version_num``, e.g. 150018 for 15.18."""
        if self._version_num is None:
            self._version_num = int(self.query("SHOW server_version_num")[0][0])
        return self._version_num

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user={_SERVER_USER} dbname={dbname}"

    def standby(self, settings: Mapping[str, str] | None = None) -> PgCluster:
        """A cluster that `start` makes a hot standby of this started one: a ``pg_basebackup``
        of it (or, for a build without one, a copy of its files between ``pg_backup_start`` and
        ``pg_backup_stop``), then streaming replication from it (same binaries; its settings and
        `settings`)::

            with primary.standby({"hot_standby_feedback": "on"}) as replica:
                replica.query("SELECT pg_is_in_recovery()")  # [(True,)]
        """
        self._require_started()
        replica = PgCluster(self._bindir, base_dir=self._base_dir, settings={**self._settings, **(settings or {})},
                            client_bindir=self._client_bindir)
        replica._primary = self
        return replica

    def _require_started(self) -> tuple[Path, int]:
        if self._root is None or self._port is None:
            raise PgClusterError("the cluster is not started: call start() or use `with`")
        return self._root, self._port

    # -- lifecycle ----------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """initdb in a fresh temporary directory (a standby's: a base backup of its primary),
        configure and start the server."""
        if self._root is not None:
            raise PgClusterError(f"the cluster in {self._root} is already started")
        root = Path(tempfile.mkdtemp(prefix="pgcluster-", dir=self._base_dir))
        self._root = root
        try:
            if len(str(root / ".s.PGSQL.65535")) > _MAX_SOCKET_PATH:
                raise PgClusterError(f"{root} is too long for a Unix socket path: pick a shorter base_dir")
            self._chown(root)
            settings = self._settings
            if self._primary is None:
                self._initdb(root / "data")
            else:
                self._base_backup(root / "data", self._primary)
                settings = {**settings, "primary_conninfo": f"'{self._primary.conninfo()}'"}
            for attempt in range(3):
                self._port = free_port()
                self._write_settings(root / "data", root, self._port, settings)
                result = self._run_tool(
                    "pg_ctl", "-D", str(root / "data"), "-l", str(root / "server.log"),
                    "-w", "-t", "120", "start",
                )  # fmt: skip
                if result.returncode == 0:
                    break
                if attempt < 2 and "already in use" in self._log_tail():
                    _log.warning("port %d was taken, retrying with another", self._port)
                    continue
                raise PgClusterError(
                    f"pg_ctl start failed ({self._bindir}):\n{result.stdout}\n"
                    f"--- server log ---\n{self._log_tail()}"
                )
        except BaseException:
            self._pg_ctl_stop(root, "immediate")  # e.g. pg_ctl timed out on a live server
            self._remove(root)
            raise
        _log.info("started PostgreSQL from %s on port %d in %s", self._bindir, self._port, root)
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory. Idempotent."""
        root = self._root
        if root is None:
            return
        try:
            self._pg_ctl_stop(root, "fast")
        finally:
            self._remove(root)

    def wait_replayed(self, timeout: float = 60) -> None:
        """Wait until this standby has replayed all the WAL its primary has written so far, an open
        transaction's too (a commit on the primary flushes it first: only flushed WAL is sent)."""
        if self._primary is None:
            raise PgClusterError(f"{self} is not a standby: make one with standby()")
        _, lsn = self._primary.query("SELECT pg_current_xact_id(), pg_current_wal_insert_lsn()::text")[0]
        deadline = time.monotonic() + timeout
        while not self.query("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn])[0][0]:
            if time.monotonic() > deadline:
                raise PgClusterError(f"the standby did not replay up to {lsn} in {timeout} s:\n{self._log_tail()}")
            time.sleep(0.05)

    def promote(self) -> None:
        """Make this standby a primary (``pg_ctl promote``, waiting until it is one)."""
        root, _ = self._require_started()
        result = self._run_tool("pg_ctl", "-D", str(root / "data"), "-w", "-t", "120", "promote")
        if result.returncode != 0:
            raise PgClusterError(f"pg_ctl promote failed:\n{result.stdout}\n--- server log ---\n{self._log_tail()}")

    def _pg_ctl_stop(self, root: Path, mode: str) -> None:
        if (root / "data" / "postmaster.pid").exists():
            result = self._run_tool("pg_ctl", "-D", str(root / "data"), "-m", mode, "-w", "stop")
            if result.returncode != 0:
                _log.warning("pg_ctl stop -m %s failed:\n%s", mode, result.stdout)

    def _remove(self, root: Path) -> None:
        shutil.rmtree(root, ignore_errors=True)
        self._root = None
        self._port = None
        self._version_num = None

    def _initdb(self, data: Path) -> None:
        base = ["initdb", "-D", str(data), "-U", _SERVER_USER, "--auth=trust", "-E", "UTF8"]
        result = self._run_tool(*base, "--locale=C.UTF-8")
        if result.returncode != 0:
            _log.info("initdb --locale=C.UTF-8 failed, retrying with --no-locale:\n%s", result.stdout)
            shutil.rmtree(data, ignore_errors=True)
            result = self._run_tool(*base, "--no-locale")
        if result.returncode != 0:
            raise PgClusterError(f"initdb failed ({self._bindir}):\n{result.stdout}")

    def _base_backup(self, data: Path, primary: PgCluster) -> None:
        if (self._bindir / "pg_basebackup").is_file():
            result = self._run_tool("pg_basebackup", "-D", str(data), "-h", primary.host, "-p", str(primary.port),
                                    "-U", _SERVER_USER, "-X", "stream", "-c", "fast")
            if result.returncode != 0:
                raise PgClusterError(f"pg_basebackup of {primary} failed:\n{result.stdout}")
        else:  # a server-only build: an older pg_basebackup refuses a newer server
            self._copy_backup(data, primary)
        (data / "standby.signal").touch()

    def _copy_backup(self, data: Path, primary: PgCluster) -> None:
        """What ``pg_basebackup -X none`` does, through the server's backup functions (15+): the
        files copied between ``pg_backup_start`` and ``pg_backup_stop``, whose label goes into
        ``backup_label``; the standby streams the WAL from its primary."""
        source = primary.data_dir

        def leave_out(directory: str, names: list[str]) -> set[str]:
            if Path(directory).relative_to(source).parts in _BACKUP_EMPTIED:
                return set(names)
            return _BACKUP_SKIPPED.intersection(names)

        with primary.connect() as conn:
            conn.execute("SELECT pg_backup_start('pgcluster standby', true)")
            try:
                shutil.copytree(source, data, ignore=leave_out)
            except shutil.Error as exc:
                raise PgClusterError(f"copying {primary}'s files for a standby failed: {exc}") from None
            label = conn.execute("SELECT labelfile FROM pg_backup_stop(false)").fetchone()[0]  # type: ignore[index]
        (data / "backup_label").write_text(label)
        (data / "pg_wal" / "archive_status").mkdir(exist_ok=True)
        for directory, _, files in os.walk(data):
            self._chown(Path(directory))
            for name in files:
                self._chown(Path(directory, name))

    @staticmethod
    def _write_settings(data: Path, socket_dir: Path, port: int, settings: Mapping[str, str]) -> None:
        lines = [f"{name} = {value}" for name, value in settings.items()]
        lines += [f"port = {port}", f"unix_socket_directories = '{socket_dir}'"]
        # postgresql.auto.conf is read last, so it overrides the initdb defaults.
        (data / "postgresql.auto.conf").write_text("\n".join(lines) + "\n")

    def _log_tail(self) -> str:
        if self._root is None:
            return ""
        try:
            lines = (self._root / "server.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        return "\n".join(lines[-_LOG_TAIL_LINES:])

    # -- running binaries as the server user --------------------------------------

    @staticmethod
    def _run_as() -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        entry = pwd.getpwnam(_SERVER_USER)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    @staticmethod
    def _chown(path: Path) -> None:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(_SERVER_USER)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _run_tool(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a binary of `bindir`; stdout and stderr merged; never raises on exit code.

        Output goes through a file, not a pipe: ``pg_ctl start`` leaves the
        postmaster running, and a pipe it inherited would never reach EOF.
        """
        cwd = self._root or Path(tempfile.gettempdir())
        env = {**os.environ, "HOME": str(cwd), "LC_ALL": "C"}
        with tempfile.TemporaryFile("w+") as out:
            program = self._bindir / tool
            if not program.exists() and self._client_bindir is not None:
                program = self._client_bindir / tool
            result = subprocess.run(
                [str(program), *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=cwd, env=env, text=True, check=False, **self._run_as(),
            )  # fmt: skip
            out.seek(0)
            return subprocess.CompletedProcess(result.args, result.returncode, out.read())

    def run_pgbench(self, args: Sequence[str], dbname: str = "postgres") -> str:
        """Run this cluster's own ``pgbench`` against it; return its stdout."""
        result = self._run_tool(
            "pgbench", "-h", self.host, "-p", str(self.port), "-U", _SERVER_USER, *args, dbname
        )
        if result.returncode != 0:
            raise PgClusterError(f"pgbench {' '.join(args)} failed:\n{result.stdout}")
        return result.stdout

    # -- SQL --------------------------------------------------------------------

    def connect(self, dbname: str = "postgres", autocommit: bool = True) -> psycopg.Connection[Any]:
        """A new psycopg connection as ``postgres`` over the Unix socket."""
        return psycopg.connect(
            host=self.host, port=self.port, user=_SERVER_USER, dbname=dbname, autocommit=autocommit
        )

    def execute(self, sql: str, params: Sequence[Any] | None = None, dbname: str = "postgres") -> None:
        """Run one statement, or several separated by ``;`` when `params` is None.

        The connection is in autocommit mode; several statements sent together
        form one implicit transaction unless they contain BEGIN/COMMIT.
        """
        with self.connect(dbname) as conn:
            conn.execute(sql, params)

    def query(
        self, sql: str, params: Sequence[Any] | None = None, dbname: str = "postgres"
    ) -> list[tuple[Any, ...]]:
        """Run one statement and return all its rows."""
        with self.connect(dbname) as conn:
            return conn.execute(sql, params).fetchall()

    def create_database(self, name: str) -> str:
        self.execute(f"CREATE DATABASE {quote_ident(name)}")
        return name

    # -- slots and decoding -----------------------------------------------------

    def create_slot(
        self, name: str, plugin: str = "pgoutput", *, two_phase: bool = False, dbname: str = "postgres"
    ) -> int:
        """Create a permanent logical slot; return its consistent point as an int LSN."""
        rows = self.query(
            "SELECT (lsn - '0/0'::pg_lsn)::int8"
            " FROM pg_create_logical_replication_slot(%s, %s, false, %s)",
            (name, plugin, two_phase),
            dbname=dbname,
        )
        return int(rows[0][0])

    def drop_slot(self, name: str, dbname: str = "postgres") -> None:
        self.execute("SELECT pg_drop_replication_slot(%s)", (name,), dbname=dbname)

    def iter_pgoutput(
        self,
        slot: str,
        *,
        publications: Sequence[str],
        proto_version: int,
        streaming: StreamingMode | None = None,
        two_phase: bool = False,
        messages: bool = False,
        binary: bool = False,
        origin: str | None = None,
        consume: bool = False,
        seq_start: int = 0,
        chunk_rows: int = 10_000,
        dbname: str = "postgres",
    ) -> Iterator[CapturedMessage]:
        """Yield the slot's pending pgoutput messages, numbered from `seq_start`.

        Rows come through a server-side cursor `chunk_rows` at a time. With
        `consume` the slot advances past everything pending as soon as the
        first row is fetched (the server materializes the whole result), even
        if the caller stops early.

        The server decodes WAL only up to its flush pointer: a non-transactional
        ``pg_logical_emit_message`` does not flush, so it shows up only after
        the next commit.
        """
        options = pgoutput_options(
            publications=publications, proto_version=proto_version, streaming=streaming,
            two_phase=two_phase, messages=messages, binary=binary, origin=origin,
        )  # fmt: skip
        function = "pg_logical_slot_get_binary_changes" if consume else "pg_logical_slot_peek_binary_changes"
        sql = (
            "SELECT (lsn - '0/0'::pg_lsn)::int8, xid::text::int8, data"
            f" FROM {function}(%s, NULL, NULL, VARIADIC %s::text[])"
        )
        seq = seq_start
        with (
            self.connect(dbname, autocommit=False) as conn,
            conn.cursor("pgoutput_capture", binary=True) as cursor,
        ):
            cursor.itersize = chunk_rows
            cursor.execute(sql, (slot, options))
            for lsn, xid, data in cursor:
                yield CapturedMessage(seq, lsn, xid, bytes(data))
                seq += 1

    def peek_pgoutput(
        self,
        slot: str,
        *,
        publications: Sequence[str],
        proto_version: int,
        streaming: StreamingMode | None = None,
        two_phase: bool = False,
        messages: bool = False,
        binary: bool = False,
        origin: str | None = None,
        seq_start: int = 0,
        dbname: str = "postgres",
    ) -> list[CapturedMessage]:
        """The slot's pending pgoutput messages, without consuming them."""
        captured = self.iter_pgoutput(
            slot, publications=publications, proto_version=proto_version,
            streaming=streaming, two_phase=two_phase, messages=messages, binary=binary,
            origin=origin, consume=False, seq_start=seq_start, dbname=dbname,
        )  # fmt: skip
        return list(captured)

    def get_pgoutput(
        self,
        slot: str,
        *,
        publications: Sequence[str],
        proto_version: int,
        streaming: StreamingMode | None = None,
        two_phase: bool = False,
        messages: bool = False,
        binary: bool = False,
        origin: str | None = None,
        seq_start: int = 0,
        dbname: str = "postgres",
    ) -> list[CapturedMessage]:
        """The slot's pending pgoutput messages; the slot advances past them."""
        captured = self.iter_pgoutput(
            slot, publications=publications, proto_version=proto_version,
            streaming=streaming, two_phase=two_phase, messages=messages, binary=binary,
            origin=origin, consume=True, seq_start=seq_start, dbname=dbname,
        )  # fmt: skip
        return list(captured)

    def peek_test_decoding(
        self,
        slot: str,
        *,
        options: Mapping[str, str] | None = None,
        consume: bool = False,
        dbname: str = "postgres",
    ) -> list[tuple[int, int, str]]:
        """(lsn, xid, text) rows of a ``test_decoding`` slot (peeked unless `consume`)."""
        function = "pg_logical_slot_get_changes" if consume else "pg_logical_slot_peek_changes"
        rows = self.query(
            "SELECT (lsn - '0/0'::pg_lsn)::int8, xid::text::int8, data"
            f" FROM {function}(%s, NULL, NULL, VARIADIC %s::text[])",
            (slot, flatten_options(options)),
            dbname=dbname,
        )
        return [(int(lsn), int(xid), str(text)) for lsn, xid, text in rows]

    def __repr__(self) -> str:
        state = f"port {self._port} in {self._root}" if self._root else "stopped"
        return f"PgCluster({self._bindir}, {state})"
