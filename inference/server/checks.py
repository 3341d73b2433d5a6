"""A chat request -> the question and the runtime settings, or one 400 naming the field.

    question = question_of(body, config)      # the last user message, checked
    settings = settings_of(body, config)      # the server's defaults with the request's Self-RAG fields
    refuse_unsupported(body)                  # OpenAI parameters this server cannot honour

OpenAI-compatible servers ignore fields they do not use; a field whose meaning the answer would silently break
(a required tool call, a JSON schema, log-probs, several choices, stop strings, sampling other than greedy
decoding) is refused instead, by name. Each 400 carries ``param`` and OpenAI's ``code`` for the case.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from selfrag.inference.config import InferenceConfig

from .config import ServeConfig
from .errors import ApiError
from .invalid import describe, surrogate_error
from .schemas import ChatCompletionRequest

SETTINGS = ("mode", "top_k", "threshold", "relevance_threshold", "on_unsupported", "on_all_irrelevant", "support_bound",
            "use_calibration")
MAX_STOP = 4  # OpenAI's limit on stop sequences
#: sampling settings and the values greedy decoding honours: 0 or OpenAI's default (temperature 1, top_p 1)
GREEDY = {"temperature": (0, 1), "top_p": (1,), "presence_penalty": (0,), "frequency_penalty": (0,)}


def question_of(body: ChatCompletionRequest, config: ServeConfig) -> str:
    if len(body.messages) > config.max_messages:
        raise ApiError(400, f"messages has {len(body.messages)} entries; at most {config.max_messages} are accepted",
                       param="messages", code="array_above_max_length")
    for index, message in enumerate(body.messages):
        _refuse_surrogates(message.name, f"messages.{index}.name")
        if isinstance(message.content, list):
            for part_index, part in enumerate(message.content):
                _refuse_surrogates(part.text, f"messages.{index}.content.{part_index}.text")
        else:
            _refuse_surrogates(message.content, f"messages.{index}.content")
    index = len(body.messages) - 1
    last = body.messages[index]
    if last.role != "user":
        raise ApiError(400, f"the last message must come from the user (it holds the question), got role "
                       f"{last.role!r}", param=f"messages.{index}.role", code="invalid_value")
    content = last.content
    if isinstance(content, list):
        for part_index, part in enumerate(content):
            param = f"messages.{index}.content.{part_index}"
            if part.type != "text":
                raise ApiError(400, f"only text content parts are supported, got type {part.type!r}; send "
                               '{"type": "text", "text": "..."}', param=param, code="invalid_value")
            if part.text is None:
                raise ApiError(400, f"{param}: the 'text' field is missing from this text part; send "
                               '{"type": "text", "text": "..."}', param=f"{param}.text",
                               code="missing_required_parameter")
        content = "\n".join(part.text or "" for part in content)
    question = (content or "").strip()
    if not question:
        raise ApiError(400, "the last user message is empty; put the question in it", param=f"messages.{index}.content",
                       code="invalid_value")
    if len(question) > config.max_question_chars:
        raise ApiError(400, f"the question has {len(question)} characters; at most {config.max_question_chars}",
                       param=f"messages.{index}.content", code="string_above_max_length")
    return question


def _refuse_surrogates(text: str | None, param: str) -> None:
    """JSON may carry ``\\ud800`` alone; no tokenizer or UTF-8 writer takes it, so it is refused by name."""
    error = surrogate_error(text, param)
    if error is not None:
        raise error


def settings_of(body: ChatCompletionRequest, config: ServeConfig) -> InferenceConfig:
    overrides: dict[str, Any] = {name: getattr(body, name) for name in SETTINGS if getattr(body, name) is not None}
    for name in ("max_completion_tokens", "max_tokens"):
        value = getattr(body, name)
        if value is not None:
            if value > config.max_tokens_limit:
                raise ApiError(400, f"{name}: expected an integer at most {config.max_tokens_limit} (the server's "
                               f"max_tokens_limit), got {describe(value)}", param=name, code="integer_above_max_value")
            overrides["max_tokens"] = value
            break
    if overrides.get("top_k") is not None and overrides["top_k"] > config.max_top_k:
        raise ApiError(400, f"top_k: expected an integer at most {config.max_top_k} (the server's max_top_k), got "
                       f"{describe(overrides['top_k'])}", param="top_k", code="integer_above_max_value")
    settings = dataclasses.replace(config.inference, **overrides)
    problems = settings.validate()
    if problems:
        raise ApiError(400, "; ".join(problems), param=problems[0].split(" ", 1)[0], code="invalid_value")
    return settings


def refuse_unsupported(body: ChatCompletionRequest) -> None:
    """400 for an OpenAI parameter whose request the answer could not keep (each named, with what to send)."""
    if body.tools and _forces_a_tool(body.tool_choice):
        raise ApiError(400, f"tool_choice={body.tool_choice!r} is not supported: this server answers with text and "
                       "never calls tools; omit tool_choice (or send 'auto' / 'none')", param="tool_choice",
                       code="unsupported_value")
    kind = (body.response_format or {}).get("type")
    if kind not in (None, "text"):
        raise ApiError(400, f"response_format type {kind!r} is not supported: the answer is text with citations in "
                       "the 'selfrag' field; omit response_format (or send type 'text')", param="response_format",
                       code="unsupported_value")
    if body.logprobs:
        raise ApiError(400, "logprobs=true is not supported: the reflection tokens' probabilities are in the answer's "
                       "selfrag.trace; omit logprobs", param="logprobs", code="unsupported_parameter")
    if body.top_logprobs is not None:
        raise ApiError(400, "top_logprobs is not supported (logprobs are not returned); omit it", param="top_logprobs",
                       code="unsupported_parameter")
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stops) > MAX_STOP:
        raise ApiError(400, f"stop has {len(stops)} sequences; at most {MAX_STOP} are accepted, and this server "
                       "supports none: omit stop", param="stop", code="unsupported_parameter")
    if stops:
        raise ApiError(400, "stop is not supported: a Self-RAG answer ends at the model's own [Utility:k] token, and "
                       "cutting it would drop its citations' verdicts; omit stop (or lower max_tokens)", param="stop",
                       code="unsupported_parameter")
    _refuse_sampling(body)


def _refuse_sampling(body: ChatCompletionRequest) -> None:
    """400 for a sampling setting greedy decoding does not honour: Self-RAG reads its verdicts (the reflection
    tokens' probabilities) from greedy decodes, so the server samples nothing."""
    for name, honoured in GREEDY.items():
        value = getattr(body, name)
        if value is not None and value not in honoured:
            allowed = " or ".join(str(number) for number in honoured)
            raise ApiError(400, f"{name}={value:g} is not supported: Self-RAG decodes greedily (its relevance and "
                           f"support verdicts are read from greedy decodes), so nothing is sampled; omit {name} (or "
                           f"send {allowed})", param=name, code="unsupported_value")
    if body.logit_bias:
        raise ApiError(400, "logit_bias is not supported: Self-RAG decodes greedily and its reflection tokens must "
                       "stay unbiased for their verdicts to mean anything; omit logit_bias (or send {})",
                       param="logit_bias", code="unsupported_value")


def _forces_a_tool(choice: str | dict[str, Any] | None) -> bool:
    """``required`` or a named function forces a call; ``auto`` and ``none`` let the model answer in text."""
    return choice not in (None, "auto", "none")
