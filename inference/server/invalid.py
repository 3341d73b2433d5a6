"""A request body that failed validation, as one OpenAI 400 naming the user's field, what it expected and a code.

    error = invalid_fields(validation_error.errors())   # ApiError(400, "max_tokens: expected an integer, got
                                                         # the string \"5\"", param="max_tokens", code="invalid_type")

``param`` is the field's path as the user wrote it (``messages.0.content``): pydantic's union members
(``messages.0.content.str``) and validator names never reach the client. ``code`` is OpenAI's for the case:
``invalid_type``, ``invalid_value``, ``missing_required_parameter``, ``integer_below_min_value`` /
``integer_above_max_value`` / ``decimal_below_min_value`` / ``decimal_above_max_value``, ``empty_array``,
``invalid_unicode``.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from .errors import ApiError
from .schemas import ChatCompletionRequest, ChatMessage, ContentPart, StreamOptions

_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionRequest, ChatMessage, ContentPart, StreamOptions)
#: every name a path of the request may hold; anything else in pydantic's location is a union member or validator
FIELDS = frozenset(name for model in _MODELS for name in model.model_fields)


def _holds_int(annotation: Any) -> bool:
    return annotation is int or any(_holds_int(arg) for arg in typing.get_args(annotation))


#: fields whose values are integers (a bound on them is an integer's: integer_above_max_value, not decimal_...)
INTEGER_FIELDS = frozenset(name for model in _MODELS for name, field in model.model_fields.items()
                           if _holds_int(field.annotation))

_EXPECTED = {
    "string_type": "a string", "list_type": "an array", "dict_type": "an object", "model_type": "an object",
    "model_attributes_type": "an object", "int_type": "an integer", "int_parsing": "an integer",
    "int_from_float": "an integer", "float_type": "a number", "float_parsing": "a number", "bool_type": "a boolean",
    "bool_parsing": "a boolean",
}
_UNION_MEMBERS = {"list[ContentPart]": "an array of text parts", "list[str]": "an array of strings",
                  "dict[str,any]": "an object"}
_BOUNDS = {"greater_than_equal": ("ge", "at least", "below_min_value"),
           "greater_than": ("gt", "above", "below_min_value"),
           "less_than_equal": ("le", "at most", "above_max_value"),
           "less_than": ("lt", "below", "above_max_value")}


def invalid_fields(errors: Sequence[Any]) -> ApiError:
    """The 400 for pydantic's ``errors`` (FastAPI's ``RequestValidationError.errors()``): the first field's code and
    path, every field's problem in the message."""
    located = [(_user_path(item.get("loc", ())), _union_member(item.get("loc", ())), item) for item in errors]
    # a union tried member by member: where one member got further (the value is a list of parts, one part is wrong),
    # its deeper error is the user's; the others only say the value is not of their type
    located = [entry for entry in located if not (entry[1] is not None and any(
        len(other[0]) > len(entry[0]) and other[0][: len(entry[0])] == entry[0] for other in located))]
    merged: dict[tuple[str, ...], list[tuple[str | None, dict[str, Any]]]] = {}
    for path, member, item in located:
        merged.setdefault(path, []).append((member, item))
    problems = [_problem(".".join(path), items) for path, items in merged.items()]
    if not problems:
        return ApiError(400, "invalid request body", param="body", code="invalid_value")
    message = "; ".join(text for text, _ in problems)
    first = next(iter(merged))
    return ApiError(400, message, param=".".join(first) or "body", code=problems[0][1])


def describe(value: Any) -> str:
    """The value as the user sent it, short: ``the string "5"``, ``true``, ``null``, ``2.5``, ``an array``."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 24 else f"an integer of {len(text.lstrip('-')):,} digits"
    if isinstance(value, float):
        return json.dumps(value) if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:39] + "…"
        return f"the string {json.dumps(shown)}"
    return "an array" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def surrogate_error(text: str | None, param: str) -> ApiError | None:
    """400 ``invalid_unicode`` where ``text`` holds a lone UTF-16 surrogate (JSON may carry ``\\ud800`` alone; no
    tokenizer or UTF-8 writer takes it), else None."""
    if not isinstance(text, str):
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return ApiError(400, f"{param} holds a lone UTF-16 surrogate (\\u{ord(text[error.start]):04x}) at character "
                        f"{error.start}; send valid Unicode (a high surrogate must be followed by a low one)",
                        param=param, code="invalid_unicode")
    return None


def _user_path(location: Sequence[Any]) -> tuple[str, ...]:
    """pydantic's location without ``body``, union members and validator names: ``('messages', '0', 'content')``."""
    return tuple(str(part) for part in location if _users(part))


def _union_member(location: Sequence[Any]) -> str | None:
    """The union member an error ends at (``messages.0.content`` is not a ``list[ContentPart]``), or None."""
    last = location[-1] if location else None
    return last if isinstance(last, str) and last != "body" and not _users(last) else None


def _users(part: Any) -> bool:
    """Whether a location part is the user's: an index, a field, or an object's key that is a number (logit_bias)."""
    return isinstance(part, int) or part in FIELDS or (isinstance(part, str) and part.isdigit())


def _problem(param: str, items: list[tuple[str | None, dict[str, Any]]]) -> tuple[str, str]:
    """The message (``param: what was expected, got what``) and OpenAI's code for one field's errors."""
    member, item = items[0]
    kind, value, context = item.get("type", ""), item.get("input"), item.get("ctx") or {}
    where = param or "the request body"
    unicode = surrogate_error(value, param or "body")
    if unicode is not None:
        return unicode.message, "invalid_unicode"
    expected = [_UNION_MEMBERS.get(str(m), _EXPECTED[i.get("type", "")]) for m, i in items
                if i.get("type") in _EXPECTED]
    if expected:
        return f"{where}: expected {' or '.join(dict.fromkeys(expected))}, got {describe(value)}", "invalid_type"
    if kind == "missing":
        return f"{where}: missing; this field is required", "missing_required_parameter"
    if kind == "literal_error":
        return f"{where}: expected one of {context.get('expected')}, got {describe(value)}", "invalid_value"
    if kind == "finite_number":
        return f"{where}: {json.dumps(value)} is not a finite number; send a JSON number", "invalid_value"
    if kind in _BOUNDS:
        key, words, suffix = _BOUNDS[kind]
        number = "integer" if param.rsplit(".", 1)[-1] in INTEGER_FIELDS else "decimal"
        bound = context.get(key)
        shown = f"{bound:g}" if isinstance(bound, float) else str(bound)
        noun = "an integer" if number == "integer" else "a number"
        return f"{where}: expected {noun} {words} {shown}, got {describe(value)}", f"{number}_{suffix}"
    if kind == "too_short":
        least = context.get("min_length")
        return (f"{where}: expected at least {least} item{'s' if least != 1 else ''}, got {describe(value)} of "
                f"{context.get('actual_length')}", "empty_array" if not value else "array_below_min_length")
    if kind == "too_long":
        return f"{where}: expected at most {context.get('max_length')} items", "array_above_max_length"
    return f"{where}: {item.get('msg', 'invalid value')}", "invalid_value"
