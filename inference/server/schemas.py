"""Request and response models of the OpenAI-compatible API; they also make the served OpenAPI schema.

Requests follow OpenAI's chat completions body; fields this server does not use are ignored, as OpenAI-compatible
servers do, except those whose request an answer could not keep (``stop``, ``logprobs``, a forced tool call, a
JSON ``response_format``, ``n`` > 1, a sampling setting other than greedy decoding's): those are refused with 400
naming them. Types are strict, as OpenAI's are (``max_tokens: "5"`` or ``true`` is a 400, not 5 or 1), and every
range is OpenAI's. Self-RAG settings ride as extra top-level fields (``extra_body`` in the ``openai`` client):
``mode``, ``top_k``, ``threshold``, ``relevance_threshold``, ``on_unsupported``, ``on_all_irrelevant``,
``support_bound``, ``use_calibration``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, WithJsonSchema

from selfrag.inference import trace


class _Lenient(BaseModel):
    # NaN and Infinity parse as JSON numbers here; refused as "should be a finite number", not as out of range
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class ContentPart(_Lenient):
    """One part of a multi-part message; only ``text`` parts are understood."""

    type: str = Field(description="part type; only 'text' is supported")
    text: str | None = Field(default=None, description="the text of a 'text' part")


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = Field(default=None, description="text, or a list of text parts")
    name: str | None = None


class StreamOptions(_Lenient):
    include_usage: StrictBool = Field(default=False, description="send a last chunk with token usage before [DONE]")


class ChatCompletionRequest(_Lenient):
    """POST /v1/chat/completions. The question is the last message, which must come from the user."""

    model: str = Field(description="the served model id (GET /v1/models)")
    messages: list[ChatMessage] = Field(min_length=1, description="the conversation; the last is the question")
    stream: StrictBool | None = Field(default=False,
                                      description="send server-sent events, one delta per accepted segment")
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1, description="most new tokens per decode")
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1,
                                                    description="alias of max_tokens (newer clients)")
    n: StrictInt | None = Field(default=1, ge=1, le=1, description="only one choice is supported")
    temperature: StrictFloat | None = Field(
        default=None, ge=0, le=2, description="0 or 1 (OpenAI's default); both decode greedily, as Self-RAG does "
        "(its verdicts are read from greedy decodes): any other value is refused with 400"
    )
    top_p: StrictFloat | None = Field(default=None, ge=0, le=1, description="1 only (greedy decoding samples no "
                                      "nucleus): any other value is refused with 400")
    presence_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2, description="0 only: a non-zero penalty "
                                                 "is refused with 400")
    frequency_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2, description="0 only: a non-zero penalty "
                                                  "is refused with 400")
    logit_bias: dict[str, StrictInt] | None = Field(default=None, description="not supported: a non-empty map is "
                                                    "refused with 400")
    seed: StrictInt | None = Field(default=None, description="accepted: decoding is greedy, so no draw depends on it")
    stop: str | list[str] | None = Field(
        default=None, description="not supported (a Self-RAG answer ends at its own [Utility:k] token): a non-empty "
        "value is refused with 400"
    )
    logprobs: StrictBool | None = Field(default=None, description="not supported: true is refused with 400 (the "
                                        "reflection tokens' probabilities are in selfrag.trace)")
    top_logprobs: StrictInt | None = Field(default=None, description="not supported: refused with 400")
    tools: list[dict[str, Any]] | None = Field(default=None, description="accepted; the model never calls a tool")
    tool_choice: str | dict[str, Any] | None = Field(
        default=None, description="'auto' or 'none'; 'required' or a named function is refused with 400"
    )
    response_format: dict[str, Any] | None = Field(
        default=None, description="type 'text' only; 'json_object' and 'json_schema' are refused with 400"
    )
    mode: Literal["adaptive", "always", "never"] | None = Field(
        default=None, description="Self-RAG: adaptive (the model decides), always or never retrieve"
    )
    top_k: StrictInt | None = Field(default=None, ge=1, description="Self-RAG: passages retrieved and decoded")
    threshold: StrictFloat | None = Field(
        default=None, ge=0, le=1, description="Self-RAG: adaptive mode retrieves when p_retrieve exceeds this"
    )
    relevance_threshold: StrictFloat | None = Field(
        default=None, ge=0, le=1, description="Self-RAG: a passage is judged [Relevant] when its relevance score is at "
        "least this"
    )
    on_unsupported: Literal["abstain", "flag"] | None = Field(
        default=None, description="Self-RAG: abstain, or flag (low_confidence) an unsupported answer"
    )
    on_all_irrelevant: Literal["unsupported", "no_retrieval"] | None = Field(
        default=None, description="Self-RAG: when every retrieved passage is judged [Irrelevant], treat it as "
        "unsupported (re-retrieve, then on_unsupported) or answer without passages (flagged)"
    )
    support_bound: StrictFloat | None = Field(
        default=None, ge=0, le=1, description="Self-RAG: a support score below this counts as unsupported"
    )
    use_calibration: StrictBool | None = Field(
        default=None, description="Self-RAG: false takes the built-in threshold, relevance_threshold and "
        "support_bound (0.2, 0.5, 0.0) where neither the request nor the server sets them, instead of the "
        "model's calibrated values"
    )


class Citation(BaseModel):
    passage_id: str
    title: str
    text: str = Field(description="the passage text")
    relevance: str | None = Field(default=None, description="the model's relevance verdict on the passage: "
                                  "'[Irrelevant]' marks a flagged answer whose text came from a passage the model "
                                  "rejected (null: no verdict recorded)")
    sentences: list[str] = Field(description="the answer text generated from (and supported by) this passage")


def _json_type(hint: Any) -> dict[str, Any]:
    """A trace field's annotation as JSON Schema (an entry's nested records are objects)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return {"type": "null"}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_json_type(arg) for arg in args]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin is tuple:
        return {"type": "array", "items": {"anyOf": [_json_type(arg) for arg in args if arg is not Ellipsis]}}
    if origin is Mapping:
        return {"type": "object", "additionalProperties": _json_type(args[1])}
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return {"type": names[hint]} if hint in names else {"type": "object"}


def trace_entry_schema() -> dict[str, Any]:
    """One trace entry as JSON: one object per entry class of :mod:`selfrag.inference.trace`, its ``step`` the
    discriminator, with exactly the keys its ``to_dict`` writes (docs/runtime.md, "The trace")."""
    kinds = []
    for cls in trace.ENTRY_TYPES:
        hints = typing.get_type_hints(cls, vars(trace))
        properties: dict[str, Any] = {"step": {"const": cls.step}}  # type: ignore[attr-defined]
        required = ["step"]
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            if field.name == "counts":  # a mode's tally, written as fields of their own (the prompted critic's)
                properties["critic_calls"] = {"type": "integer"}
                continue
            schema = _json_type(hints[field.name])
            name = field.metadata.get("under", field.name)
            properties[name] = schema if name == field.name else {"type": "object", "properties": {field.name: schema}}
            if not field.metadata.get("optional"):
                required.append(name)
        kinds.append({"title": cls.__name__, "type": "object", "properties": properties, "required": required,
                      "additionalProperties": False})
    return {"oneOf": kinds}


#: a trace entry as the API sends it: validated as any object, documented by kind in the OpenAPI schema
TraceEntryJson = Annotated[dict[str, Any], WithJsonSchema(trace_entry_schema())]


class SelfragExtension(BaseModel):
    """What Self-RAG adds to every answer: the evidence, the flags and every decision behind them."""

    citations: list[Citation]
    retrieved: bool
    abstained: bool
    low_confidence: bool
    reasons: list[str] = Field(description="every reason the answer is abstained or low-confidence, each prefixed "
                               "with what it caused ('flagged: ...', 'truncated: ...', 'abstained: ...'); empty "
                               "when it is neither")
    trace: list[TraceEntryJson] = Field(description="every decision with its probabilities and reason, one object per "
                                        "kind (step) with its own fields: docs/runtime.md, 'The trace'")
    engine_calls: int
    generated_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    selfrag: SelfragExtension


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "selfrag"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``param`` names the offending request field."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ready", "loading", "failed"]
    model: str | None = None
    queue_depth: int = 0
    detail: str | None = None
