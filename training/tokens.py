"""Give a model and its tokenizer the 15 reflection tokens, each exactly one id, with mean-initialised rows.

    ids = prepare_tokens(model, tokenizer, "add")   # -> selfrag.reflection.ReflectionIds

Strategy ``add`` appends the strings as special tokens and grows the embeddings. Strategy ``reserved``
renames 15 unused Llama-3 style ``<|reserved_special_token_N|>`` tokens to the reflection strings (the
vocabulary size stays the same) and sets their rows, untrained in the base, to the mean.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import torch

from selfrag.errors import ConfigError, TokenizerError
from selfrag.reflection import TOKENS, ReflectionIds, reflection_ids

logger = logging.getLogger(__name__)

STRATEGIES = ("add", "reserved")
RESERVED_PATTERN = re.compile(r"^<\|reserved_special_token_(\d+)\|>$")


#: Words that say what each reflection token means; ``init="words"`` starts a token's row at their mean embedding.
MEANING: dict[str, str] = {
    "[Retrieval]": " retrieve search",
    "[No Retrieval]": " answer directly",
    "[Continue to Use Evidence]": " continue",
    "[Relevant]": " relevant",
    "[Irrelevant]": " irrelevant",
    "[Fully supported]": " supported",
    "[Partially supported]": " partially",
    "[No support / Contradictory]": " unsupported",
    "[Utility:1]": " 1",
    "[Utility:2]": " 2",
    "[Utility:3]": " 3",
    "[Utility:4]": " 4",
    "[Utility:5]": " 5",
    "<paragraph>": " paragraph",
    "</paragraph>": " end",
}
INITS = ("mean", "words")


def prepare_tokens(model: Any, tokenizer: Any, strategy: str, init: str = "mean") -> ReflectionIds:
    """Make every reflection string one id in ``tokenizer`` and give ``model`` a row for it.

    Idempotent: a tokenizer that already holds the strings (a model trained by selfrag) is left as
    it is, and only an embedding matrix that is too small for its ids is grown.
    """
    if strategy not in STRATEGIES:
        raise ConfigError([f"tokens.strategy must be one of {list(STRATEGIES)}, got {strategy!r}"])
    if init not in INITS:
        raise ConfigError([f"tokens.init must be one of {list(INITS)}, got {init!r}"])
    if strategy == "reserved":
        return map_reserved_tokens(model, tokenizer)
    return add_reflection_tokens(model, tokenizer, init)


def add_reflection_tokens(model: Any, tokenizer: Any, init: str = "mean") -> ReflectionIds:
    """Strategy ``add``: add the strings as special tokens, resize, set the new rows to the mean of the old ones."""
    known_rows = len(tokenizer)  # rows that belong to real tokens before we add any
    # transformers 5: "additional_special_tokens" is an alias of "extra_special_tokens", and the default
    # replace_extra_special_tokens=True would drop a tokenizer's existing extra special tokens from that list.
    added = tokenizer.add_special_tokens({"extra_special_tokens": list(TOKENS)}, replace_extra_special_tokens=False)
    try:
        token_ids = reflection_ids(tokenizer)
    except TokenizerError as error:
        raise TokenizerError(f"after adding the reflection tokens: {error}") from None
    new_ids = sorted(i for i in token_ids.all_ids if i >= known_rows) if added else []
    rows = model.get_input_embeddings().weight.shape[0]
    needed = max(len(tokenizer), max(token_ids.all_ids) + 1)
    if needed > rows:
        # mean_resizing=False: its sampled rows are replaced by the exact mean below anyway, and its
        # covariance over a large vocabulary is slow.
        model.resize_token_embeddings(needed, mean_resizing=False)
    if new_ids:
        set_rows_to_mean(model, new_ids, known_rows)
        if init == "words":
            set_rows_to_words(model, tokenizer, {i: t for t, i in token_ids.token_to_id.items() if i in new_ids})
        logger.info(
            "added %d reflection tokens (ids %d..%d), rows set to the %s", added, new_ids[0], new_ids[-1],
            "mean" if init == "mean" else "embeddings of their meaning's words",
        )
    else:
        logger.info("the tokenizer already holds the reflection tokens; left unchanged")
    return token_ids


def map_reserved_tokens(model: Any, tokenizer: Any) -> ReflectionIds:
    """Strategy ``reserved``: rename the 15 highest-numbered unused reserved tokens to the reflection strings.

    The highest numbers are taken because model families tend to repurpose the lowest ones
    (Llama 3.1 turned reserved tokens into ``<|eom_id|>`` and ``<|python_tag|>``).
    """
    if _already_prepared(tokenizer):
        return reflection_ids(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerError("tokens.strategy=reserved needs a fast tokenizer; use tokens.strategy=add")
    reserved = sorted(
        ((int(match.group(1)), token_id) for token_id, added in tokenizer.added_tokens_decoder.items()
         if (match := RESERVED_PATTERN.match(added.content))),
    )
    if len(reserved) < len(TOKENS):
        raise TokenizerError(
            f"tokens.strategy=reserved needs {len(TOKENS)} unused <|reserved_special_token_N|> tokens, "
            f"this tokenizer has {len(reserved)}; use tokens.strategy=add"
        )
    chosen = {token_id: token for (_, token_id), token in zip(reserved[-len(TOKENS):], TOKENS, strict=True)}
    _rename_added_tokens(tokenizer, chosen)
    token_ids = reflection_ids(tokenizer)
    ids = sorted(chosen)
    if max(ids) >= model.get_input_embeddings().weight.shape[0]:
        raise TokenizerError(f"reserved token id {max(ids)} has no embedding row; the model and tokenizer differ")
    set_rows_to_mean(model, ids, backend.get_vocab_size(with_added_tokens=False))
    logger.info("mapped the reflection tokens onto reserved ids %s, rows set to the mean", ids)
    return token_ids


def _already_prepared(tokenizer: Any) -> bool:
    try:
        reflection_ids(tokenizer)
    except TokenizerError:
        return False
    return True


def _rename_added_tokens(tokenizer: Any, renames: dict[int, str]) -> None:
    """Rename added tokens by id in the Rust tokenizer (transformers 5 keeps added tokens only there)."""
    from tokenizers import Tokenizer

    state = json.loads(tokenizer.backend_tokenizer.to_str())
    old_names = {}
    for added in state["added_tokens"]:
        if added["id"] in renames:
            old_names[added["content"]] = renames[added["id"]]
            added["content"] = renames[added["id"]]
    vocab = state.get("model", {}).get("vocab")
    if isinstance(vocab, dict):  # some tokenizers list added tokens in the model vocabulary too
        for old, new in old_names.items():
            if old in vocab:
                vocab[new] = vocab.pop(old)
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(state))
    extra = [str(token) for token in tokenizer.extra_special_tokens if str(token) not in old_names]
    tokenizer._extra_special_tokens = extra + [token for token in TOKENS if token not in extra]


@torch.no_grad()
def set_rows_to_mean(model: Any, ids: list[int], known_rows: int) -> None:
    """Set rows ``ids`` of the input embeddings (and an untied head) to the mean of rows ``[0, known_rows)``."""
    index = torch.tensor(ids, dtype=torch.long)
    matrices = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() != matrices[0].data_ptr():
        matrices.append(head.weight)
    for weight in matrices:
        mean = weight[:known_rows].float().mean(dim=0).to(weight.dtype)  # (hidden,)
        weight[index] = mean.expand(len(ids), -1)


@torch.no_grad()
def set_rows_to_words(model: Any, tokenizer: Any, tokens_by_id: dict[int, str]) -> None:
    """Set each id's row (input embeddings, and an untied head) to the mean row of its :data:`MEANING` words."""
    matrices = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() != matrices[0].data_ptr():
        matrices.append(head.weight)
    for token_id, token in tokens_by_id.items():
        word_ids = tokenizer.encode(MEANING[token], add_special_tokens=False)
        word_ids = [i for i in word_ids if i not in tokens_by_id]
        if not word_ids:
            continue
        for weight in matrices:
            weight[token_id] = weight[torch.tensor(word_ids)].float().mean(dim=0).to(weight.dtype)


def is_tied(model: Any) -> bool:
    """Whether the output head shares its weight with the input embeddings."""
    head = model.get_output_embeddings()
    return head is not None and head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
