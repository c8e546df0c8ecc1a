"""``GET /api/v1/health``: the service is up (no rate limit, no store access)."""

from __future__ import annotations

from fastapi import APIRouter

from neurarch_trace._version import __version__
from neurarch_trace.server.schemas import Health

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/api/v1/health", response_model=Health, summary="Liveness")
async def health() -> Health:
    return Health(status="ok", version=__version__)
