"""The reference plan service: FastAPI on uvicorn, installed by the ``server`` extra.

    >>> from neurarch_trace.server import Settings, create_app
    >>> app = create_app(Settings(database_url="shares.sqlite3"))   # or "postgresql://..."

or from a shell: ``neurarch-trace serve`` (``python -m neurarch_trace.server``). The HTTP contract
is ``shared/spec/plan-api.md``; the card itself comes from :mod:`neurarch_trace.planner`, which
needs none of this. Names are imported lazily, so importing this package (for ``serve_main``)
works without the extra installed and ``serve_main`` can say what is missing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Settings", "create_app", "serve_main"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from neurarch_trace.server.app import create_app

        return create_app
    if name == "Settings":
        from neurarch_trace.server.settings import Settings

        return Settings
    if name == "serve_main":
        from neurarch_trace.server.cli import serve_main

        return serve_main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
