"""Request and response bodies of ``plan-api.md``, as pydantic models (they also feed OpenAPI).

:class:`Graph`, :class:`Component` and :class:`Connection` publish the ``.neurarch.json``
structure (``shared/spec/neurarch-graph.md``) in the OpenAPI document, so clients and schema-driven
fuzzers build graphs that reach the planner. The request itself keeps ``model`` a plain object:
the planner's own checks say what is wrong with a graph in one sentence naming the component,
which a schema validator cannot.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

__all__ = ["Component", "Connection", "ErrorBody", "Graph", "Health", "PlanRequest", "PlanResponse", "Source"]

class Component(BaseModel):
    """One layer call (or the ``input``/``output`` node) of the graph."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(..., min_length=1, description="unique in the graph")
    name: str = Field(..., min_length=1, description="unique in the graph; diffs match by name")
    type: str = Field(..., description="vocabulary type (linear, conv2d, layerNorm, input, output, ...)",
                      examples=["input", "linear", "relu", "output"])
    params: dict[str, Any] = Field(..., description="hyperparameters by their camelCase keys; {} when none",
                                   examples=[{"inFeatures": 784, "outFeatures": 256}])
    scope: Optional[str] = Field(None, description="dotted path of the parent module")
    inputShape: Optional[list[int]] = Field(None, description="batchless input shape, positive ints")  # noqa: N815
    outputShape: Optional[list[int]] = Field(None, description="batchless output shape, positive ints")  # noqa: N815


class Connection(BaseModel):
    """A data-flow edge; both ends must be component ids."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str = Field(..., min_length=1)
    from_: str = Field(..., alias="from", description="producer component id")
    to: str = Field(..., description="consumer component id")
    fromPort: Optional[str] = Field(None, examples=["bottom"])  # noqa: N815
    toPort: Optional[str] = Field(None, examples=["top"])  # noqa: N815


class Graph(BaseModel):
    """A ``.neurarch.json`` document as the tracer writes it; unknown fields are kept."""

    model_config = ConfigDict(extra="allow")

    id: Optional[str] = None
    name: Optional[str] = Field(None, description="the model's name, shown on the card")
    description: Optional[str] = None
    components: list[Component]
    connections: list[Connection]


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

    model: dict[str, Any] = Field(..., description="the .neurarch.json graph (schema: Graph)")
    share: StrictBool = Field(False, description="store the graph and card at an unguessable URL")
    source: Optional[Source] = None
    base: Optional[dict[str, Any]] = Field(None, description="the graph being changed from (schema: Graph): "
                                                             "adds a diff")
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
    plan: dict[str, Any] = Field(..., description="the card's facts, machine-readable")


class ErrorBody(BaseModel):
    """Every non-2xx answer."""

    error: str = Field(..., description="one sentence")


class Health(BaseModel):
    status: str
    version: str
