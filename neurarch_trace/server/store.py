"""The share store: shared graphs and their cards in one SQLite file, in WAL mode, thread-safe.

Each thread that touches the store gets its own connection (SQLite connections must not be used
by two threads at once); WAL lets readers run while one writer commits, and a busy timeout makes
concurrent writers queue instead of failing. A share id is :data:`ID_BYTES` random bytes from
``secrets`` (144 bits), URL-safe base64: unguessable, so the link is the only key.

Only what a share stores is ever written: a plan request without ``share`` never reaches this
module.
"""

from __future__ import annotations

import json
import re
import secrets
import sqlite3
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, List, Mapping, Optional

__all__ = ["ID_BYTES", "Share", "ShareStore", "StoreError"]

#: Random bytes per share id: 18 bytes = 144 bits (at least 128 asked for), 24 URL-safe characters.
ID_BYTES = 18
#: What an id can look like; anything else is not looked up at all.
_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")
#: Seconds a writer waits for another writer's lock before giving up.
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS shares (
    id      TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    name    TEXT NOT NULL,
    text    TEXT NOT NULL,
    graph   TEXT NOT NULL,
    plan    TEXT NOT NULL
)
"""


class StoreError(Exception):
    """The store could not be opened or written; ``str()`` is one sentence."""


@dataclass(frozen=True)
class Share:
    """A stored share: ``graph_json`` and ``plan_json`` as stored (JSON text)."""

    id: str
    created: str
    name: str
    text: str
    graph_json: str
    plan_json: str

    @property
    def plan(self) -> Any:
        return json.loads(self.plan_json)


class ShareStore:
    """Open (creating it and its folder if needed) the SQLite file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: List[sqlite3.Connection] = []
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._connection()
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"cannot use the share database {self.path}: WAL mode is unavailable there")
            conn.execute(_SCHEMA)
            conn.execute("PRAGMA user_version = 1")
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise StoreError(f"cannot open the share database {self.path}: {exc}") from exc

    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StoreError("the share store is closed")
            conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA synchronous=NORMAL")  # durable with WAL except on power loss
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def put(self, graph: Mapping[str, Any], plan: Mapping[str, Any], text: str) -> str:
        """Store a share and return its new id."""
        name = graph.get("name")
        row_name = name if isinstance(name, str) else ""
        graph_json = json.dumps(graph, separators=(",", ":"), ensure_ascii=False)
        plan_json = json.dumps(plan, separators=(",", ":"), ensure_ascii=False)
        created = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
        for _ in range(3):  # a collision of 144 random bits never happens; retrying costs nothing
            share_id = secrets.token_urlsafe(ID_BYTES)
            try:
                self._connection().execute(
                    "INSERT INTO shares (id, created, name, text, graph, plan) VALUES (?, ?, ?, ?, ?, ?)",
                    (share_id, created, row_name, text, graph_json, plan_json),
                )
                return share_id
            except sqlite3.IntegrityError:
                continue
            except sqlite3.Error as exc:
                raise StoreError(f"the share could not be stored: {exc}") from exc
        raise StoreError("the share could not be stored: no free id")

    def get(self, share_id: str) -> Optional[Share]:
        """The share with ``share_id``, or ``None`` (also for an id that cannot exist)."""
        if not _ID_PATTERN.fullmatch(share_id):
            return None
        try:
            row = self._connection().execute(
                "SELECT id, created, name, text, graph, plan FROM shares WHERE id = ?", (share_id,)
            ).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"the share store could not be read: {exc}") from exc
        return Share(*row) if row else None

    def close(self) -> None:
        """Close every connection this store opened, from whichever thread."""
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:
            try:
                conn.close()
            except sqlite3.Error:
                pass
