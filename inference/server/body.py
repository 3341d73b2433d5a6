"""Why a request body is not one JSON object, as OpenAI's 400 ``invalid_json`` naming the problem and its fix.

    error = body_error(raw, request.headers.get("content-type"))   # None: a JSON object (or invalid JSON
                                                                    # syntax, which app.py points into)
    error = depth_error(raw)                                        # None: nested at most MAX_DEPTH levels

``body_error`` is called only after FastAPI refused a body, so a valid request never pays for it. FastAPI's own
words for these cases ("Field required", "There was an error parsing the body", "Input should be a valid
dictionary") name no field, no code and no fix. An integer longer than Python's limit on integer digits (4,300)
is one of them: FastAPI cannot parse the body, and this names the field that holds it. ``depth_error`` runs on
every chat request (FastAPI parses JSON far deeper than the documented limit); it scans only a body with more than
MAX_DEPTH brackets, which a chat request rarely has.
"""

from __future__ import annotations

import email.message
import json
import sys
from typing import Any

from .errors import ApiError
from .invalid import FIELDS

#: deeper nesting is refused before parsing (a chat request with tools' JSON schemas stays far below it)
MAX_DEPTH = 100
FIX = "send one JSON object with Content-Type: application/json"


def body_error(body: bytes | None, content_type: str | None) -> ApiError | None:
    """The 400 for a body that is not one JSON object; None where the body is one, or is JSON with a syntax error
    (the caller reports where that one stops being JSON)."""
    if not _is_json(content_type):
        shown = "no Content-Type header" if not content_type else f"Content-Type {content_type!r}"
        return _invalid(f"the request body must be JSON, got {shown}; {FIX} (curl: -H 'Content-Type: "
                        "application/json')")
    if body is None or not body.strip():
        return _invalid(f"the request body is empty; {FIX}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        line, column = _line_column(body[: error.start].decode("utf-8", "replace"))
        return _invalid(f"the request body is not valid JSON: byte 0x{body[error.start]:02x} at byte {error.start} "
                        f"(line {line}, column {column}) is not UTF-8; encode the body as UTF-8 and {FIX}")
    too_deep = _depth_error(text)
    if too_deep is not None:
        return too_deep
    try:
        value = json.loads(text, parse_int=_integer)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    huge = _huge_integer_at(value, ())
    if huge is not None:
        return _too_many_digits(*huge)
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        return _invalid(f"the request body must be one JSON object {{...}}, got {kind}; {FIX}")
    return None


def depth_error(body: bytes | None) -> ApiError | None:
    """400 ``invalid_json`` when ``body`` nests arrays or objects deeper than :data:`MAX_DEPTH`, else None."""
    if not body or body.count(b"[") + body.count(b"{") <= MAX_DEPTH:
        return None
    return _depth_error(body.decode("utf-8", "replace"))


def _depth_error(text: str) -> ApiError | None:
    too_deep = _too_deep_at(text)
    if too_deep is None:
        return None
    line, column = _line_column(text[:too_deep])
    return _invalid(f"the request body nests arrays or objects more than {MAX_DEPTH} levels deep (at line "
                    f"{line}, column {column}); a chat request needs a few: {FIX}")


class _HugeInteger:
    """An integer literal longer than Python converts (``sys.get_int_max_str_digits()``): its digit count."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _integer(literal: str) -> int | _HugeInteger:
    limit = sys.get_int_max_str_digits()
    digits = len(literal.lstrip("-"))
    return _HugeInteger(digits) if limit and digits > limit else int(literal)


def _huge_integer_at(value: Any, path: tuple[str, ...]) -> tuple[tuple[str, ...], int] | None:
    """The path to the first integer too long to convert, and its digit count; None if there is none."""
    if isinstance(value, _HugeInteger):
        return path, value.digits
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _huge_integer_at(item, (*path, str(key)))
        if found is not None:
            return found
    return None


def _too_many_digits(path: tuple[str, ...], digits: int) -> ApiError:
    param = ".".join(path) or "body"
    unknown = next((part for part in path if part not in FIELDS and not part.isdigit()), None)
    ignored = "" if unknown is None else f" ({unknown} is not a field this server reads: omit it)"
    return ApiError(400, f"{param}: an integer of {digits:,} digits; at most {sys.get_int_max_str_digits():,} "
                    f"digits are read: send a smaller number{ignored}", param=param, code="integer_above_max_value")


def _invalid(message: str) -> ApiError:
    return ApiError(400, message, param="body", code="invalid_json")


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule: ``application/json`` or ``application/*+json``, parameters (charset) allowed."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _too_deep_at(text: str) -> int | None:
    """The character index where arrays/objects first nest deeper than :data:`MAX_DEPTH` (strings skipped)."""
    depth = 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return index
        elif char in "]}":
            depth -= 1
    return None


def _line_column(before: str) -> tuple[int, int]:
    """1-based line and column of the character after ``before``."""
    return before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
