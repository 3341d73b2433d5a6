"""Trajectory records: the on-disk schema, rendering to the paper's text, and parsing text back.

A record is one training example: an instruction and a list of segments, each with its reflection
labels (and every label's provenance), then one utility label. Rendered (paper format)::

    [Retrieval]<paragraph>{title}\\n{text}</paragraph>[Relevant]{sentence}[Fully supported][Utility:5]
    [No Retrieval]{answer}[Utility:4]

``parse_trajectory`` turns generated text (or token ids) back into segments; ``render_segments``
turns them into text again, and the round trip is exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from selfrag import reflection as rf
from selfrag.errors import InputError, TrajectoryParseError
from selfrag.reflection import Group, ReflectionIds

SCHEMA_VERSION = 1

# A piece of a rendered trajectory: a reflection/markup token, or plain text.
Piece = tuple[str, bool]  # (content, is_token)


# ---------------------------------------------------------------------------------------------
# Record schema
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Passage:
    """One retrievable passage. ``id`` is stable across runs (used for citations and caching)."""

    id: str
    title: str
    text: str

    def render(self) -> str:
        """The passage as it appears between ``<paragraph>`` and ``</paragraph>``."""
        return f"{self.title}\n{self.text}" if self.title else self.text

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "text": self.text}


@dataclass(frozen=True)
class Label:
    """A reflection label and where it came from (labeler kind, teacher model, prompt hash)."""

    value: str
    labeler: str
    model: str | None = None
    prompt_hash: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "labeler": self.labeler, "model": self.model, "prompt_hash": self.prompt_hash}


@dataclass(frozen=True)
class Segment:
    """One segment: optional retrieve decision, optional passage with its relevance, text, support."""

    text: str
    retrieve: Label | None = None
    passage: Passage | None = None
    relevance: Label | None = None
    support: Label | None = None


@dataclass(frozen=True)
class Record:
    """One trajectory as stored in JSONL (``schema_version`` 1)."""

    id: str
    instruction: str
    segments: tuple[Segment, ...]
    utility: Label | None
    source: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "id": self.id,
            "instruction": self.instruction,
            "source": self.source,
            "segments": [_segment_to_json(segment) for segment in self.segments],
            "utility": None if self.utility is None else self.utility.to_json(),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        """Build a record from its JSON form; raises ``InputError`` naming the bad field."""
        return _record_from_json(data)

    def render(self) -> str:
        """The target text of this record (everything after the prompt)."""
        return render_segments(to_parsed(self))

    def pieces(self) -> list[Piece]:
        """The target as token/text pieces, for encoding (see :func:`trajectory_pieces`)."""
        return trajectory_pieces(to_parsed(self))


_SLOTS: dict[str, Group] = {
    "retrieve": Group.RETRIEVE,
    "relevance": Group.RELEVANCE,
    "support": Group.SUPPORT,
}


def _segment_to_json(segment: Segment) -> dict[str, Any]:
    data: dict[str, Any] = {"text": segment.text}
    data["passage"] = None if segment.passage is None else segment.passage.to_json()
    for slot in _SLOTS:
        label = getattr(segment, slot)
        data[slot] = None if label is None else label.to_json()
    return data


def _label_from_json(data: Any, where: str, group: Group) -> Label | None:
    if data is None:
        return None
    if not isinstance(data, Mapping) or not isinstance(data.get("value"), str) or "labeler" not in data:
        raise InputError(f"{where}: expected null or an object with 'value' and 'labeler', got {data!r}")
    if data["value"] not in rf.tokens_of(group):
        raise InputError(
            f"{where}.value: {data['value']!r} is not a {group.value} token; use one of {rf.tokens_of(group)}"
        )
    return Label(str(data["value"]), str(data["labeler"]), data.get("model"), data.get("prompt_hash"))


def _record_from_json(data: Mapping[str, Any]) -> Record:
    if not isinstance(data, Mapping):
        raise InputError(f"a record must be a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError(
            f"schema_version: expected {SCHEMA_VERSION}, got {version!r}; regenerate with `selfrag generate`"
        )
    for key in ("id", "instruction"):
        if not isinstance(data.get(key), str):
            raise InputError(f"{key}: expected a string, got {data.get(key)!r}")
    raw_segments = data.get("segments")
    if not isinstance(raw_segments, list) or not raw_segments:
        raise InputError(f"segments: expected a non-empty list, got {raw_segments!r}")
    segments = []
    for index, raw in enumerate(raw_segments):
        where = f"segments[{index}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("text"), str):
            raise InputError(f"{where}.text: expected a string, got {raw!r}")
        passage = raw.get("passage")
        if passage is not None:
            if not isinstance(passage, Mapping) or not all(
                isinstance(passage.get(k), str) for k in ("id", "title", "text")
            ):
                raise InputError(f"{where}.passage: expected null or an object with string id, title, text")
            passage = Passage(passage["id"], passage["title"], passage["text"])
        labels = {slot: _label_from_json(raw.get(slot), f"{where}.{slot}", group) for slot, group in _SLOTS.items()}
        segments.append(Segment(text=raw["text"], passage=passage, **labels))
    return Record(
        id=data["id"],
        instruction=data["instruction"],
        segments=tuple(segments),
        utility=_label_from_json(data.get("utility"), "utility", Group.UTILITY),
        source=str(data.get("source", "")),
        meta=dict(data.get("meta") or {}),
    )


# ---------------------------------------------------------------------------------------------
# Parsed trajectories (what a model generates) and rendering
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedSegment:
    """A segment as read from text: token strings (or None) and the raw passage content."""

    text: str
    retrieve: str | None = None
    passage: str | None = None
    relevance: str | None = None
    support: str | None = None


@dataclass(frozen=True)
class Trajectory:
    """Segments plus the final utility token, and the problems that make it malformed (if any)."""

    segments: tuple[ParsedSegment, ...]
    utility: str | None
    problems: tuple[str, ...] = ()
    trailing: str = ""  # whatever followed the utility token (kept so rendering is exact)

    @property
    def well_formed(self) -> bool:
        return not self.problems

    @property
    def answer(self) -> str:
        """The generated text with every reflection token and passage removed; where a token stood between two
        words (``is[Fully supported]Madrid``), a space keeps them apart."""
        text = ""
        for segment in self.segments:
            if text and segment.text and not text[-1].isspace() and not segment.text[0].isspace():
                text += " "
            text += segment.text
        return text.strip()

    def render(self) -> str:
        return render_segments(self)


def to_parsed(record: Record) -> Trajectory:
    """The trajectory a record describes, in the form the parser produces."""
    segments = tuple(
        ParsedSegment(
            text=segment.text,
            retrieve=None if segment.retrieve is None else segment.retrieve.value,
            passage=None if segment.passage is None else segment.passage.render(),
            relevance=None if segment.relevance is None else segment.relevance.value,
            support=None if segment.support is None else segment.support.value,
        )
        for segment in record.segments
    )
    return Trajectory(segments, None if record.utility is None else record.utility.value)


def render_segments(trajectory: Trajectory) -> str:
    """Render segments in the paper's format; the inverse of :func:`parse_trajectory`."""
    return "".join(content for content, _ in trajectory_pieces(trajectory))


def trajectory_pieces(trajectory: Trajectory) -> list[Piece]:
    """The rendered trajectory as pieces, built from its structure (never by re-lexing text).

    A passage or sentence that contains a literal reflection string stays one plain-text piece, so
    encoding these pieces (``selfrag.prompting.encode_pieces``) cannot produce a reflection id from it.
    """
    pieces: list[Piece] = []
    for segment in trajectory.segments:
        if segment.retrieve:
            pieces.append((segment.retrieve, True))
        if segment.passage is not None:
            pieces += [(rf.PARAGRAPH_OPEN, True), (segment.passage, False), (rf.PARAGRAPH_CLOSE, True)]
        if segment.relevance:
            pieces.append((segment.relevance, True))
        pieces.append((segment.text, False))
        if segment.support:
            pieces.append((segment.support, True))
    if trajectory.utility:
        pieces.append((trajectory.utility, True))
    if trajectory.trailing:
        pieces.append((trajectory.trailing, False))
    return [(content, is_token) for content, is_token in pieces if is_token or content]


_TOKEN_PATTERN = re.compile("|".join(re.escape(token) for token in sorted(rf.TOKENS, key=len, reverse=True)))


def lex_text(text: str) -> list[Piece]:
    """Split text into reflection/markup tokens and the plain text between them."""
    pieces: list[Piece] = []
    position = 0
    for match in _TOKEN_PATTERN.finditer(text):
        if match.start() > position:
            pieces.append((text[position : match.start()], False))
        pieces.append((match.group(0), True))
        position = match.end()
    if position < len(text):
        pieces.append((text[position:], False))
    return pieces


def lex_ids(ids: Sequence[int], token_ids: ReflectionIds, decode: Callable[[list[int]], str]) -> list[Piece]:
    """Split token ids at reflection ids; only real reflection ids count as tokens (never decoded text)."""
    pieces: list[Piece] = []
    run: list[int] = []
    for token_id in ids:
        token = token_ids.token(int(token_id))
        if token is None:
            run.append(int(token_id))
            continue
        if run:
            pieces.append((decode(run), False))
            run = []
        pieces.append((token, True))
    if run:
        pieces.append((decode(run), False))
    return pieces


def parse_trajectory(source: str | Iterable[Piece]) -> Trajectory:
    """Parse generated text (or pieces from :func:`lex_ids`) into segments.

    Never raises: a malformed trajectory comes back with ``problems`` listing what is wrong, and with
    the best reading of its segments (so a runtime can still show the text). Use
    :func:`require_well_formed` to raise instead.
    """
    pieces = lex_text(source) if isinstance(source, str) else list(source)
    return _Parser(pieces).parse()


def require_well_formed(source: str | Iterable[Piece]) -> Trajectory:
    trajectory = parse_trajectory(source)
    if trajectory.problems:
        raise TrajectoryParseError("malformed trajectory: " + "; ".join(trajectory.problems))
    return trajectory


class _Parser:
    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces = pieces
        self.segments: list[ParsedSegment] = []
        self.problems: list[str] = []
        self.current: dict[str, str | None] | None = None
        self.utility: str | None = None
        self.trailing = ""

    def parse(self) -> Trajectory:
        index = 0
        while index < len(self.pieces):
            content, is_token = self.pieces[index]
            if not is_token:
                self._text(content)
            elif content == rf.PARAGRAPH_OPEN:
                index = self._paragraph(index)
            else:
                self._token(content)
            index += 1
        self._close()
        if self.utility is None:
            self.problems.append("no utility token at the end")
        if not self.segments:
            self.problems.append("no segment")
        return Trajectory(tuple(self.segments), self.utility, tuple(self.problems), self.trailing)

    def _open(self) -> dict[str, str | None]:
        if self.current is None:
            self.current = {"retrieve": None, "passage": None, "relevance": None, "text": None, "support": None}
        return self.current

    def _close(self) -> None:
        current = self.current
        if current is None:
            return
        where = f"segment {len(self.segments) + 1}"
        if current["retrieve"] is None:
            self.problems.append(f"{where} has no retrieve token")
        if current["passage"] is not None and current["retrieve"] != rf.RETRIEVAL:
            self.problems.append(f"{where} has a passage without {rf.RETRIEVAL}")
        if current["passage"] is not None and current["relevance"] is None:
            self.problems.append(f"{where} has a passage but no relevance token")
        if current["passage"] is not None and current["support"] is None:
            self.problems.append(f"{where} has a passage but no support token")
        if current["relevance"] is not None and current["passage"] is None:
            self.problems.append(f"{where} has a relevance token without a passage")
        evidence = current["passage"] is not None or current["retrieve"] == rf.CONTINUE_EVIDENCE
        if current["support"] is not None and not evidence:
            self.problems.append(f"{where} has a support token without evidence")
        if not (current["text"] or "").strip():
            self.problems.append(f"{where} has no text")
        self.segments.append(
            ParsedSegment(
                text=current["text"] or "",
                retrieve=current["retrieve"],
                passage=current["passage"],
                relevance=current["relevance"],
                support=current["support"],
            )
        )
        self.current = None

    def _after_utility(self, what: str, raw: str) -> bool:
        """Anything after the utility token is kept verbatim in ``trailing`` (and is a problem)."""
        if self.utility is not None:
            self.problems.append(f"{what} after the utility token")
            self.trailing += raw
            return True
        return False

    def _text(self, content: str) -> None:
        if self.utility is not None:
            if content.strip():
                self.problems.append("text after the utility token")
            self.trailing += content
            return
        current = self._open()
        if current["support"] is not None:
            self._close()
            current = self._open()  # a segment with no retrieve token: _close reports it once
        current["text"] = (current["text"] or "") + content

    def _paragraph(self, index: int) -> int:
        """Read ``<paragraph> text </paragraph>`` starting at ``index``; return the index of the close."""
        content = ""
        end = index + 1
        while end < len(self.pieces) and self.pieces[end] != (rf.PARAGRAPH_CLOSE, True):
            content += self.pieces[end][0]
            end += 1
        if end >= len(self.pieces):
            self.problems.append(f"{rf.PARAGRAPH_OPEN} is never closed")
        raw = "".join(content for content, _ in self.pieces[index : end + 1])
        if self._after_utility("a passage", raw):
            return end
        current = self._open()
        if current["passage"] is not None or current["text"] is not None:
            self._close()
            current = self._open()
        current["passage"] = content
        return end

    def _token(self, token: str) -> None:
        if token == rf.PARAGRAPH_CLOSE:
            self.problems.append(f"{rf.PARAGRAPH_CLOSE} without {rf.PARAGRAPH_OPEN}")
            return
        group = rf.group_of(token)
        if self._after_utility(token, token):
            return
        if group is Group.UTILITY:
            self._close()
            self.utility = token
            return
        slot = group.value
        current = self._open()
        # A retrieve token always opens a new segment; a repeated label closes the current one.
        if current["text"] is not None and group is Group.RETRIEVE or current[slot] is not None:
            self._close()
            current = self._open()
        elif group is Group.RELEVANCE and current["text"] is not None:
            self.problems.append(f"{token} after the segment's text")
        current[slot] = token
