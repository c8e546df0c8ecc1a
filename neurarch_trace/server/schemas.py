"""Request and response bodies of ``plan-api.md``, as pydantic models (they also feed OpenAPI)."""

from __future__ import annotations

from typing import Any, Dict, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

__all__ = ["ErrorBody", "Health", "PlanRequest", "PlanResponse", "Source"]


class Source(BaseModel):
    """Where the graph came from (shown on the card: the target's file or module)."""

    model_config = ConfigDict(extra="allow")

    kind: Optional[StrictStr] = Field(None, description="'trace' for neurarch-trace")
    target: Optional[StrictStr] = Field(None, description="the target string as typed")
    input: Optional[StrictStr] = Field(None, description="the --input specs joined by one space")
    tool: Optional[StrictStr] = Field(None, description="'neurarch-trace/<version>'")


class PlanRequest(BaseModel):
    """``POST /api/v1/plan`` body. Unknown fields are ignored (other clients may send more)."""

    model_config = ConfigDict(extra="ignore")

    model: Dict[str, Any] = Field(..., description="the .neurarch.json graph")
    share: StrictBool = Field(False, description="store the graph and card at an unguessable URL")
    source: Optional[Source] = None
    base: Optional[Dict[str, Any]] = Field(None, description="the graph being changed from: adds a diff")
    seq_len: Optional[StrictInt] = Field(None, ge=1, le=2**31, description="tokens per sample for sizing")
    attention: Optional[Literal["sdpa", "flash", "eager"]] = Field(
        None, description="only eager stores the attention score matrix")
    finetune: Optional[Literal["full", "lora", "qlora"]] = Field(
        None, description="what fit and cost size: full training (default), LoRA or QLoRA fine-tuning")
    context: Optional[StrictInt] = Field(None, ge=1, le=2**31, description="tokens of context for serving")
    gpu: Optional[StrictStr] = Field(None, max_length=64,
                                     description="plan for this card or cluster only: NAME or NAMExN, e.g. H100x8")
    usd_per_hour: Optional[StrictFloat] = Field(
        None, gt=0, le=10_000, description="price per GPU-hour of the gpu asked for (cards without a list price)")


class PlanResponse(BaseModel):
    """The 200 answer."""

    text: str = Field(..., description="the card, plain text, at most 68 columns")
    url: Optional[str] = Field(None, description="share URL, present when share was asked and stored")
    share_error: Optional[str] = Field(None, description="why no URL came back although share was asked")
    plan: Dict[str, Any] = Field(..., description="the card's facts, machine-readable")


class ErrorBody(BaseModel):
    """Every non-2xx answer."""

    error: str = Field(..., description="one sentence")


class Health(BaseModel):
    status: str
    version: str
