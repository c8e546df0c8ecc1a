"""One small database layer under the share store and the rate limiter: SQLite or PostgreSQL.

:func:`open_database` takes the settings' ``database_url``: ``sqlite:///PATH`` opens a SQLite file
(the standard library's ``sqlite3``, WAL mode, one connection per thread), ``postgresql://...`` a
psycopg 3 connection pool (``psycopg_pool``) that several service replicas can point at. Callers
write one SQL text with ``:name`` placeholders and portable types; :class:`Database` converts the
placeholders and names the few dialect differences (:attr:`Database.greatest`, the blob type), so
the store and the limiter are the same code on both.

Everything here is blocking; the service calls it from worker threads, never on the event loop.
Transactions are serialisable per key: :meth:`Database.transaction` with ``lock_key`` takes
SQLite's write lock up front (``BEGIN IMMEDIATE``) or a PostgreSQL transaction-level advisory lock
on the key, so a read-check-write (a quota) is atomic across threads, processes and replicas.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from neurarch_trace.text import install_hint

__all__ = ["Database", "DatabaseError", "open_database"]

#: Seconds a SQLite writer waits for another writer's lock before giving up.
SQLITE_BUSY_TIMEOUT_S = 30.0
#: Connections per replica in the PostgreSQL pool (threads that touch the database at once).
PG_POOL_MAX = 16
#: Seconds the first connection at start may take (libpq's ``connect_timeout``).
PG_CONNECT_TIMEOUT_S = 10
_PLACEHOLDER = re.compile(r"(?<!:):([A-Za-z_][A-Za-z0-9_]*)")


class DatabaseError(Exception):
    """The database could not be opened, read or written; ``str()`` is one sentence."""


class _Cursor:
    """What a transaction yields: ``execute(sql, params)`` and the fetch helpers."""

    def __init__(self, raw: Any, convert: Any) -> None:
        self._raw = raw
        self._convert = convert

    def execute(self, sql: str, params: Mapping[str, Any] = ()) -> _Cursor:  # type: ignore[assignment]
        self._raw.execute(self._convert(sql), dict(params))
        return self

    def one(self) -> Optional[Sequence[Any]]:
        return self._raw.fetchone()

    def all(self) -> list[Sequence[Any]]:
        return list(self._raw.fetchall())

    @property
    def rowcount(self) -> int:
        return int(self._raw.rowcount)


class Database:
    """The common surface; see :class:`SqliteDatabase` and :class:`PostgresDatabase`."""

    #: The SQL name of ``max(a, b)`` over two values.
    greatest = "MAX"
    #: The column type of compressed documents.
    blob = "BLOB"
    #: Where the data lives, for messages (a path; a URL without its password).
    where = ""

    @contextmanager
    def transaction(self, lock_key: Optional[str] = None, write: bool = False) -> Iterator[_Cursor]:
        """A transaction, committed when the block ends and rolled back when it raises. ``write``:
        it will write (SQLite then takes its write lock first, so it queues on the busy timeout
        instead of failing to upgrade a read); ``lock_key``: also serialise it against every other
        transaction with the same key (implies ``write``)."""
        raise NotImplementedError
        yield  # pragma: no cover

    def close(self) -> None:
        raise NotImplementedError


class SqliteDatabase(Database):
    """A SQLite file in WAL mode: readers never wait for the writer, writers queue on a busy
    timeout, and ``synchronous=NORMAL`` keeps every commit through a process crash."""

    def __init__(self, path: Path, *, create_folder: bool = False) -> None:
        """Open (or make) the file ``path``. ``create_folder``: make its missing folders (the
        default file in the user data dir); else a missing folder is an error, so that a typo in
        ``--db`` makes no folders.

        Raises:
            DatabaseError: the folder is missing (``create_folder`` false), or the file cannot be
                opened or put in WAL mode.
        """
        self.path = Path(path)
        self.where = str(self.path)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._closed = False
        if self.path.is_dir():
            raise DatabaseError(f"cannot open the share database {self.path}: it is a folder; give a file in it, "
                                f"such as {self.path / 'shares.sqlite3'}")
        if not create_folder and not self.path.parent.is_dir():
            raise DatabaseError(f"cannot open the share database {self.path}: folder {self.path.parent} does not "
                                "exist; make it first, or give --db a path in a folder that does")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            mode = self._connection().execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise DatabaseError(f"cannot open the share database {self.path}: {exc}") from exc
        if str(mode).lower() != "wal":
            self.close()
            raise DatabaseError(f"cannot use the share database {self.path}: WAL mode is unavailable there")

    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise DatabaseError("the share database is closed")
            conn = sqlite3.connect(str(self.path), timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA synchronous=NORMAL")  # durable with WAL except on power loss
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    @contextmanager
    def transaction(self, lock_key: Optional[str] = None, write: bool = False) -> Iterator[_Cursor]:
        try:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE" if write or lock_key is not None else "BEGIN")
        except sqlite3.Error as exc:
            raise DatabaseError(f"the share database {self.path} is unavailable: {exc}") from exc
        try:
            yield _Cursor(conn.cursor(), lambda sql: sql)
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise DatabaseError(f"the share database {self.path} failed: {exc}") from exc
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise DatabaseError(f"the share database {self.path} could not commit: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            try:
                conn.close()
            except sqlite3.Error:
                pass


class PostgresDatabase(Database):
    """A psycopg 3 connection pool on one PostgreSQL database (any number of replicas may share it).
    Each commit is durable before it returns (PostgreSQL's default ``synchronous_commit``)."""

    greatest = "GREATEST"
    blob = "BYTEA"

    def __init__(self, url: str) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise DatabaseError(f"PostgreSQL needs psycopg ({exc.name} is missing): "
                                + install_hint("'psycopg[binary]' psycopg-pool", "server")) from exc
        from psycopg_pool import PoolTimeout

        self._errors = (psycopg.Error,)
        self._pool_errors = (PoolTimeout,)
        parts = re.sub(r"://([^:@/]*):[^@/]*@", r"://\1:***@", url)
        self.where = parts
        try:  # one connection first: its error says why (the pool's says only that it timed out)
            psycopg.connect(url, connect_timeout=PG_CONNECT_TIMEOUT_S, autocommit=True).close()
        except psycopg.Error as exc:
            raise DatabaseError(f"cannot connect to the share database {parts}: "
                                f"{' '.join(str(exc).split())}") from exc
        try:
            self._pool = ConnectionPool(url, min_size=1, max_size=PG_POOL_MAX, open=False,
                                        kwargs={"autocommit": True})
            self._pool.open(wait=True, timeout=15)
        except Exception as exc:  # the pool wraps connection failures in its own PoolTimeout
            raise DatabaseError(f"cannot connect to the share database {parts}: "
                                f"{' '.join(str(exc).split())}") from exc

    @staticmethod
    def _convert(sql: str) -> str:
        return _PLACEHOLDER.sub(r"%(\1)s", sql.replace("%", "%%"))

    @contextmanager
    def transaction(self, lock_key: Optional[str] = None, write: bool = False) -> Iterator[_Cursor]:
        try:
            with self._pool.connection(timeout=30) as conn, conn.transaction(), conn.cursor() as raw:
                cursor = _Cursor(raw, self._convert)
                if lock_key is not None:
                    cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))", {"k": lock_key})
                yield cursor
        except self._errors as exc:
            raise DatabaseError(f"the share database {self.where} failed: {' '.join(str(exc).split())}") from exc
        except self._pool_errors as exc:
            raise DatabaseError(f"the share database {self.where} is unavailable: "
                                f"{' '.join(str(exc).split())}") from exc

    def close(self) -> None:
        self._pool.close()


def open_database(url: str, *, create_folder: bool = False) -> Database:
    """The database at ``url`` (``sqlite:///PATH`` or ``postgresql://...``); ``create_folder``:
    make a SQLite file's missing folders. Raises :class:`DatabaseError` when it cannot be opened."""
    if url.startswith("sqlite:///"):
        return SqliteDatabase(Path(url[len("sqlite:///"):]), create_folder=create_folder)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(url)
    raise DatabaseError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://...")
