"""Give a model and its tokenizer the 15 reflection tokens, each exactly one id, with mean-initialised rows.

    ids = prepare_tokens(model, tokenizer, "add")   # -> selfrag.reflection.ReflectionIds

Strategy ``add`` appends the strings as special tokens and grows the embeddings; strategy ``reserved``
(Llama-3 style ``<|reserved_special_token_N|>``) is not available yet and says so.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from selfrag.errors import ConfigError, TokenizerError
from selfrag.reflection import TOKENS, ReflectionIds, reflection_ids

logger = logging.getLogger(__name__)

STRATEGIES = ("add", "reserved")


def prepare_tokens(model: Any, tokenizer: Any, strategy: str) -> ReflectionIds:
    """Make every reflection string one id in ``tokenizer`` and give ``model`` a row for it.

    Idempotent: a tokenizer that already holds the strings (a model trained by selfrag) is left as
    it is, and only an embedding matrix that is too small for its ids is grown.
    """
    if strategy not in STRATEGIES:
        raise ConfigError([f"tokens.strategy must be one of {list(STRATEGIES)}, got {strategy!r}"])
    if strategy == "reserved":
        raise ConfigError(
            ["tokens.strategy=reserved is not available yet in this version; use tokens.strategy=add "
             "(then `selfrag export --merge` for vLLM)"]
        )
    return add_reflection_tokens(model, tokenizer)


def add_reflection_tokens(model: Any, tokenizer: Any) -> ReflectionIds:
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
        logger.info("added %d reflection tokens (ids %d..%d), rows set to the mean", added, new_ids[0], new_ids[-1])
    else:
        logger.info("the tokenizer already holds the reflection tokens; left unchanged")
    return token_ids


@torch.no_grad()
def set_rows_to_mean(model: Any, ids: list[int], known_rows: int) -> None:
    """Set rows ``ids`` of the input embeddings (and of an untied output head) to the mean of rows ``[0, known_rows)``."""
    index = torch.tensor(ids, dtype=torch.long)
    matrices = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() != matrices[0].data_ptr():
        matrices.append(head.weight)
    for weight in matrices:
        mean = weight[:known_rows].float().mean(dim=0).to(weight.dtype)  # (hidden,)
        weight[index] = mean.expand(len(ids), -1)


def is_tied(model: Any) -> bool:
    """Whether the output head shares its weight with the input embeddings."""
    head = model.get_output_embeddings()
    return head is not None and head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
