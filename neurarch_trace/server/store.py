"""The share store: one gzip-compressed JSON document per share, in SQLite or PostgreSQL.

A share is stored once: the exact bytes ``GET /p/<id>.json`` serves (``{"id", "created", "text",
"graph", "plan"}``, strict JSON), gzip-compressed by the worker that planned it. The page is
rendered from that document, and a client that accepts gzip gets the stored bytes as they are.

A share id is :data:`ID_BYTES` random bytes from ``secrets`` (144 bits), URL-safe base64:
unguessable, so the link is the only key. Each share row also holds the client it counts against
(an IP bucket or a key's digest, never the request), its compressed size, and when it expires.
:meth:`ShareStore.put` checks the client's quota and inserts in one transaction that holds a lock
on that client, so the quota holds across threads, processes and replicas on one database.

Only what a share stores is ever written: a plan request without ``share`` never reaches this
module.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from neurarch_trace.server.db import Database, DatabaseError, SqliteDatabase

__all__ = ["ID_BYTES", "QuotaExceeded", "Share", "ShareStore", "StoreError", "strict_json"]

log = logging.getLogger("neurarch_trace.server")

#: Random bytes per share id: 18 bytes = 144 bits (at least 128 asked for), 24 URL-safe characters.
ID_BYTES = 18
#: What an id can look like; anything else is not looked up at all.
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")
#: Expired shares deleted per write at most (the rest go with later writes).
PURGE_BATCH = 200
SCHEMA_VERSION = 2

StoreError = DatabaseError


class QuotaExceeded(Exception):
    """The client's share quota is used up; ``str()`` is one sentence."""


def strict_json(value: Any) -> str:
    """Compact JSON that every parser reads: non-finite numbers raise ``ValueError``."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True)
class Share:
    """A stored share: ``doc_gz`` is the gzip-compressed JSON document."""

    id: str
    created: float
    doc_gz: bytes

    def document(self) -> bytes:
        """The JSON document, uncompressed (UTF-8)."""
        return gzip.decompress(self.doc_gz)


def _schema(db: Database) -> str:
    return f"""
CREATE TABLE IF NOT EXISTS shares (
    id      TEXT PRIMARY KEY,
    created DOUBLE PRECISION NOT NULL,
    expires DOUBLE PRECISION,
    client  TEXT NOT NULL,
    size    BIGINT NOT NULL,
    doc     {db.blob} NOT NULL
);
CREATE INDEX IF NOT EXISTS shares_client_created ON shares (client, created);
CREATE INDEX IF NOT EXISTS shares_expires ON shares (expires) WHERE expires IS NOT NULL;
CREATE TABLE IF NOT EXISTS rate_buckets (
    bucket TEXT PRIMARY KEY,
    tat    DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS rate_buckets_tat ON rate_buckets (tat);
"""


def _finite(value: Any) -> Any:
    """``value`` with non-finite floats as ``null`` (only old rows can hold them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _migrate_v1(db: SqliteDatabase) -> None:
    """Version 1 kept graph, plan and text as three text columns; each row becomes one compressed
    strict-JSON document (a non-finite number it held becomes ``null``)."""
    with db.transaction(lock_key="schema") as cur:
        columns = [row[1] for row in cur.execute("PRAGMA table_info(shares)").all()]
        if "graph" not in columns:
            return
        cur.execute("ALTER TABLE shares RENAME TO shares_v1")
        for statement in _schema(db).split(";"):
            if statement.strip():
                cur.execute(statement)
        rows = cur.execute("SELECT id, created, text, graph, plan FROM shares_v1").all()
        for share_id, created, text, graph, plan in rows:
            stamp = datetime.fromisoformat(created).timestamp()
            doc = strict_json({"id": share_id, "created": created, "text": text,
                               "graph": _finite(json.loads(graph)), "plan": _finite(json.loads(plan))})
            blob = gzip.compress(doc.encode("utf-8"), mtime=0)
            cur.execute("INSERT INTO shares (id, created, expires, client, size, doc) "
                        "VALUES (:id, :c, NULL, 'v1', :n, :d)", {"id": share_id, "c": stamp, "n": len(blob), "d": blob})
        cur.execute("DROP TABLE shares_v1")
    log.info("share database migrated to version %d (%d shares)", SCHEMA_VERSION, len(rows))


class ShareStore:
    """Shares in ``db`` (the schema is created, or migrated from version 1, when missing)."""

    def __init__(self, db: Database, *, ttl_s: Optional[float] = None, quota_bytes: int = 0,
                 quota_window_s: float = 86400.0) -> None:
        self.db = db
        self.ttl_s = ttl_s
        self.quota_bytes = quota_bytes
        self.quota_window_s = quota_window_s
        if isinstance(db, SqliteDatabase):
            _migrate_v1(db)
        with db.transaction(lock_key="schema") as cur:
            for statement in _schema(db).split(";"):
                if statement.strip():
                    cur.execute(statement)

    def put(self, share_id: str, created: float, doc_gz: bytes, client: str) -> None:
        """Store a share. Raises :class:`QuotaExceeded` when ``client`` has stored
        ``quota_bytes`` or more in the last ``quota_window_s``; :class:`StoreError` when the
        database fails (nothing is stored then)."""
        now = time.time()
        expires = now + self.ttl_s if self.ttl_s else None
        with self.db.transaction(lock_key="quota:" + client) as cur:
            if self.quota_bytes:
                used = cur.execute("SELECT COALESCE(SUM(size), 0) FROM shares WHERE client = :c AND created > :t",
                                   {"c": client, "t": now - self.quota_window_s}).one()
                if int(used[0]) + len(doc_gz) > self.quota_bytes:
                    raise QuotaExceeded(_quota_sentence(self.quota_bytes, self.quota_window_s))
            cur.execute("INSERT INTO shares (id, created, expires, client, size, doc) "
                        "VALUES (:id, :c, :e, :cl, :n, :d)",
                        {"id": share_id, "c": created, "e": expires, "cl": client, "n": len(doc_gz), "d": doc_gz})
        if self.ttl_s:
            self.purge_expired(now)

    def get(self, share_id: str) -> Optional[Share]:
        """The share with ``share_id``, or ``None`` (also for an id that cannot exist, or expired)."""
        if not ID_PATTERN.fullmatch(share_id):
            return None
        with self.db.transaction() as cur:
            row = cur.execute("SELECT id, created, doc FROM shares WHERE id = :id AND "
                              "(expires IS NULL OR expires > :now)", {"id": share_id, "now": time.time()}).one()
        return Share(row[0], float(row[1]), bytes(row[2])) if row else None

    def purge_expired(self, now: Optional[float] = None) -> int:
        """Delete up to :data:`PURGE_BATCH` expired shares; how many went."""
        with self.db.transaction(write=True) as cur:
            return cur.execute(
                "DELETE FROM shares WHERE id IN (SELECT id FROM shares WHERE expires IS NOT NULL "
                f"AND expires <= :now LIMIT {PURGE_BATCH})", {"now": time.time() if now is None else now}).rowcount

    def close(self) -> None:
        self.db.close()


def _quota_sentence(quota_bytes: int, window_s: float) -> str:
    size = f"{quota_bytes / 2**20:g} MiB" if quota_bytes >= 2**20 else f"{quota_bytes:,} bytes"
    window = f"{window_s / 3600:g} hours" if window_s != 86400 else "day"
    return (f"this client's share quota ({size} compressed per {window}) is used up; "
            "the plan was not stored")
