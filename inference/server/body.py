"""Why a request body is not one JSON object, as OpenAI's 400 ``invalid_json`` naming the problem and its fix.

    error = body_error(raw, request.headers.get("content-type"))   # None: a JSON object (or invalid JSON
                                                                    # syntax, which app.py points into)

Called only after FastAPI refused a body, so a valid request never pays for it. FastAPI's own words for these
cases ("Field required", "There was an error parsing the body", "Input should be a valid dictionary") name no
field, no code and no fix.
"""

from __future__ import annotations

import email.message
import json

from .errors import ApiError

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
    too_deep = _too_deep_at(text)
    if too_deep is not None:
        line, column = _line_column(text[:too_deep])
        return _invalid(f"the request body nests arrays or objects more than {MAX_DEPTH} levels deep (at line "
                        f"{line}, column {column}); a chat request needs a few: {FIX}")
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        return _invalid(f"the request body must be one JSON object {{...}}, got {kind}; {FIX}")
    return None


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
