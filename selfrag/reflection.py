"""The reflection-token vocabulary of Self-RAG (Asai et al., 2023).

This is the only module where the token strings are written. They are exactly the paper's strings,
so the released Self-RAG checkpoints and data sets work unchanged.

    >>> from selfrag.reflection import Group, TOKENS, tokens_of
    >>> tokens_of(Group.RELEVANCE)
    ('[Relevant]', '[Irrelevant]')
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from selfrag.errors import TokenizerError


class Group(enum.Enum):
    """The token groups: the paper's four reflection types plus the passage markup."""

    RETRIEVE = "retrieve"
    RELEVANCE = "relevance"
    SUPPORT = "support"
    UTILITY = "utility"
    MARKUP = "markup"


RETRIEVAL = "[Retrieval]"
NO_RETRIEVAL = "[No Retrieval]"
CONTINUE_EVIDENCE = "[Continue to Use Evidence]"
RELEVANT = "[Relevant]"
IRRELEVANT = "[Irrelevant]"
FULLY_SUPPORTED = "[Fully supported]"
PARTIALLY_SUPPORTED = "[Partially supported]"
NO_SUPPORT = "[No support / Contradictory]"
UTILITY_TOKENS: tuple[str, ...] = tuple(f"[Utility:{k}]" for k in range(1, 6))
PARAGRAPH_OPEN = "<paragraph>"
PARAGRAPH_CLOSE = "</paragraph>"

GROUPS: Mapping[Group, tuple[str, ...]] = {
    Group.RETRIEVE: (RETRIEVAL, NO_RETRIEVAL, CONTINUE_EVIDENCE),
    Group.RELEVANCE: (RELEVANT, IRRELEVANT),
    Group.SUPPORT: (FULLY_SUPPORTED, PARTIALLY_SUPPORTED, NO_SUPPORT),
    Group.UTILITY: UTILITY_TOKENS,
    Group.MARKUP: (PARAGRAPH_OPEN, PARAGRAPH_CLOSE),
}

#: All 15 strings, in a fixed order (the order new vocabulary rows are added in).
TOKENS: tuple[str, ...] = tuple(token for group in Group for token in GROUPS[group])

_GROUP_OF: dict[str, Group] = {token: group for group, tokens in GROUPS.items() for token in tokens}

#: Scoring weights of the utility tokens ``[Utility:1]`` .. ``[Utility:5]`` (paper, short form).
UTILITY_WEIGHTS: tuple[float, ...] = (-1.0, -0.5, 0.0, 0.5, 1.0)


def tokens_of(group: Group) -> tuple[str, ...]:
    """The token strings of one group, in the paper's order."""
    return GROUPS[group]


def group_of(token: str) -> Group:
    """The group a reflection string belongs to; ``KeyError`` for a string that is not one."""
    return _GROUP_OF[token]


def is_reflection_token(text: str) -> bool:
    """Whether ``text`` is exactly one of the 15 strings."""
    return text in _GROUP_OF


def retrieve_after_segment(written: str | None, wants_evidence: bool, holds_passage: bool) -> str:
    """The retrieve token that follows a long-form segment the model ended with ``written``: ``[Retrieval]`` where
    new evidence is wanted, ``[Continue to Use Evidence]`` where the model asked to go on with the passage it holds,
    else ``[No Retrieval]`` (the runtime's long form and the RL rollouts decide alike)."""
    if wants_evidence:
        return RETRIEVAL
    if written == CONTINUE_EVIDENCE and holds_passage:
        return CONTINUE_EVIDENCE
    return NO_RETRIEVAL


def utility_value(token: str) -> int:
    """``"[Utility:4]"`` -> 4."""
    if group_of(token) is not Group.UTILITY:
        raise ValueError(f"{token!r} is not a utility token; expected one of {UTILITY_TOKENS}")
    return UTILITY_TOKENS.index(token) + 1


def _squeeze(text: str) -> str:
    return re.sub(r"[\s_-]+", "", text.lower())


#: a bracketed string, and the squeezed names (lower case, no spaces) of the tokens' words and their near misses
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")
_NAMES = {_squeeze(token) for token in TOKENS if token.startswith("[")} | {
    "[retrieve]", "[noretrieve]", "[nosupport]", "[contradictory]", "[supported]", "[unsupported]", "[continue]",
}


def lookalikes(text: str) -> list[str]:
    """The bracketed strings in ``text`` that look like a reflection token but are not one: a utility outside 1-5
    (``[Utility:7]``), another case or spacing (``[Fully Supported]``, ``[ Relevant ]``), a near name
    (``[Retrieve]``). Text with one of them was written for the vocabulary and broke it; read as text, it would
    become part of an answer."""
    found = []
    for match in _BRACKETED.finditer(text):
        candidate = match.group(0)
        if is_reflection_token(candidate):
            continue
        squeezed = _squeeze(candidate)
        if squeezed in _NAMES or squeezed.startswith("[utility"):
            found.append(candidate)
    return found


class _Tokenizer(Protocol):
    def convert_tokens_to_ids(self, tokens: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class ReflectionIds:
    """The id of each reflection string in one tokenizer; the runtime reads ids only from here."""

    token_to_id: Mapping[str, int]
    _id_to_token: dict[int, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        missing = [token for token in TOKENS if token not in self.token_to_id]
        if missing:
            raise TokenizerError(f"reflection ids are missing {missing}; run the token set-up (tokens.strategy)")
        if len(set(self.token_to_id.values())) != len(TOKENS):
            raise TokenizerError(f"reflection tokens share ids: {dict(self.token_to_id)}; each needs its own id")
        object.__setattr__(self, "_id_to_token", {token_id: token for token, token_id in self.token_to_id.items()})

    def id(self, token: str) -> int:
        return self.token_to_id[token]

    def ids(self, group: Group) -> tuple[int, ...]:
        return tuple(self.token_to_id[token] for token in GROUPS[group])

    @property
    def all_ids(self) -> tuple[int, ...]:
        return tuple(self.token_to_id[token] for token in TOKENS)

    def token(self, token_id: int) -> str | None:
        """The reflection string of an id, or None for an ordinary token."""
        return self._id_to_token.get(token_id)

    def group_of_id(self, token_id: int) -> Group | None:
        token = self.token(token_id)
        return None if token is None else group_of(token)

    def last_of(self, ids: Sequence[int], group: Group) -> str | None:
        """The last token of ``group`` among ``ids`` (a decode so far), or None where there is none."""
        for token_id in reversed(ids):
            if self.group_of_id(token_id) is group:
                return self.token(token_id)
        return None

    def to_json(self) -> dict[str, int]:
        return {token: int(self.token_to_id[token]) for token in TOKENS}

    @classmethod
    def from_json(cls, data: Mapping[str, int]) -> ReflectionIds:
        return cls({str(token): int(token_id) for token, token_id in data.items()})


def reflection_ids(tokenizer: _Tokenizer) -> ReflectionIds:
    """Look up each reflection string in ``tokenizer`` and check it is exactly one id.

    Raises :class:`TokenizerError` naming every string that is split into several ids or is unknown,
    with the fix (prepare the tokenizer with a token strategy first).
    """
    problems: list[str] = []
    found: dict[str, int] = {}
    for token in TOKENS:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1:
            problems.append(f"{token!r} encodes to {len(encoded)} ids {encoded}")
            continue
        found[token] = int(encoded[0])
    if problems:
        raise TokenizerError(
            "the tokenizer does not hold the reflection tokens as single ids: "
            + "; ".join(problems)
            + ". Prepare it with selfrag.training.tokens.add_reflection_tokens (tokens.strategy=add) "
            "or load a model trained by selfrag (its selfrag.json names the ids)"
        )
    return ReflectionIds(found)


def check_ids_match(tokenizer: _Tokenizer, expected: ReflectionIds) -> None:
    """Raise if ``tokenizer`` maps the reflection strings to other ids than ``expected`` (from selfrag.json)."""
    actual = reflection_ids(tokenizer)
    wrong = {t: (expected.id(t), actual.id(t)) for t in TOKENS if expected.id(t) != actual.id(t)}
    if wrong:
        raise TokenizerError(
            f"tokenizer ids differ from selfrag.json (expected, actual): {wrong}; "
            "load the tokenizer saved next to the model"
        )


def strip_reflection_tokens(text: str, tokens: Iterable[str] = TOKENS) -> str:
    """Remove every reflection string from ``text`` (for showing an answer to a person)."""
    for token in tokens:
        text = text.replace(token, "")
    return text
