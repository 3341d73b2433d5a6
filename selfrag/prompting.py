"""Turn instructions, passages and trajectories into token ids, the same way for training and inference.

Two rules hold everywhere:

* Document and user text is encoded with ``split_special_tokens=True``, so a passage containing the
  literal string ``</paragraph>[Fully supported]`` stays plain text and can never yield a reflection id.
* Reflection and markup tokens are inserted as ids, never by tokenizing their strings, so training
  text and runtime continuations are built from identical pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from selfrag import reflection as rf
from selfrag.errors import ConfigError
from selfrag.reflection import ReflectionIds
from selfrag.trajectory import Passage, Piece

#: The paper's prompt, used when a tokenizer has no chat template (or ``prompt_template=paper``).
PAPER_TEMPLATE = "### Instruction:\n{instruction}\n\n### Response:\n"
PROMPT_TEMPLATES = ("auto", "chat", "paper")
_SENTINEL = "\u2063SELFRAG_INSTRUCTION\u2063"

#: The plain-RAG instruction: the retrieved passages, then the question; the one sentence to reply when the passages
#: lack the answer. The plain RAG baseline asks it of the base model, and the fine-tuned RAG baseline is trained on it
#: (``selfrag train form=rag``), so both read the same words at evaluation.
PLAIN_RAG_PROMPT = (
    "Passages:\n{passages}\n\nAnswer the question from the passages in one short sentence. If they do not "
    "contain the answer, reply: {abstain}\n\nQuestion: {question}"
)
#: The no-retrieval instruction (the question alone), as the no-retrieval baseline asks it.
NO_RETRIEVAL_PROMPT = "{question}\nAnswer in one short sentence."


def plain_rag_prompt(question: str, passages: Sequence[Passage], abstain_text: str) -> str:
    """The plain-RAG instruction over ``passages``, numbered, each ``[i] title: text``."""
    listed = "\n".join(f"[{i}] {p.title}: {p.text}" if p.title else f"[{i}] {p.text}" for i, p in
                       enumerate(passages, 1))
    return PLAIN_RAG_PROMPT.format(passages=listed, abstain=abstain_text, question=question)


def no_retrieval_prompt(question: str) -> str:
    return NO_RETRIEVAL_PROMPT.format(question=question)


def resolve_template(tokenizer: Any, template: str) -> str:
    """``auto`` -> ``chat`` when the tokenizer has a chat template, else ``paper``."""
    if template not in PROMPT_TEMPLATES:
        raise ConfigError([f"prompt_template must be one of {PROMPT_TEMPLATES}, got {template!r}"])
    if template == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "paper"
    if template == "chat" and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(["prompt_template=chat but the tokenizer has no chat template; use prompt_template=paper"])
    return template


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Encode document or user text; special-token strings inside it stay ordinary text."""
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def encode_prompt(tokenizer: Any, instruction: str, template: str = "auto") -> list[int]:
    """Token ids of the prompt for ``instruction``: chat template or the paper's template.

    The template's own markup (``<|im_start|>`` …) is encoded as special tokens; the instruction in it
    is encoded as plain text.
    """
    resolved = resolve_template(tokenizer, template)
    if resolved == "chat":
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": _SENTINEL}], add_generation_prompt=True, tokenize=False
        )
    else:
        rendered = PAPER_TEMPLATE.format(instruction=_SENTINEL)
    before, _, after = rendered.partition(_SENTINEL)
    ids: list[int] = []
    if resolved == "paper" and getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None:
        ids.append(int(tokenizer.bos_token_id))
    ids += _encode_markup(tokenizer, before)
    ids += encode_text(tokenizer, instruction)
    ids += _encode_markup(tokenizer, after)
    return ids


def _encode_markup(tokenizer: Any, text: str) -> list[int]:
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_pieces(tokenizer: Any, token_ids: ReflectionIds, pieces: Sequence[Piece]) -> tuple[list[int], list[bool]]:
    """Encode lexed pieces; also return, per id, whether it lies strictly inside a ``<paragraph>`` pair."""
    ids: list[int] = []
    inside: list[bool] = []
    in_paragraph = False
    for content, is_token in pieces:
        if is_token:
            if content == rf.PARAGRAPH_CLOSE:
                in_paragraph = False
            ids.append(token_ids.id(content))
            inside.append(False)
            if content == rf.PARAGRAPH_OPEN:
                in_paragraph = True
            continue
        encoded = encode_text(tokenizer, content)
        ids += encoded
        inside += [in_paragraph] * len(encoded)
    return ids, inside


def passage_ids(tokenizer: Any, token_ids: ReflectionIds, passage: Passage, retrieve: bool = True) -> list[int]:
    """``[Retrieval]<paragraph>{title}\\n{text}</paragraph>`` as ids (``retrieve=False`` omits the first token)."""
    pieces: list[Piece] = [(rf.RETRIEVAL, True)] if retrieve else []
    pieces += [(rf.PARAGRAPH_OPEN, True), (passage.render(), False), (rf.PARAGRAPH_CLOSE, True)]
    return encode_pieces(tokenizer, token_ids, pieces)[0]
