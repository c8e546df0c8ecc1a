"""One router per resource: ``plan`` (POST /api/v1/plan), ``shares`` (/p/<id>), ``health``."""

from neurarch_trace.server.routers import health, plan, shares

__all__ = ["health", "plan", "shares"]
