"""Give a model and its tokenizer the 15 reflection tokens, each exactly one id, with mean-initialised rows.

    ids = prepare_tokens(model, tokenizer, "add")   # -> selfrag.reflection.ReflectionIds

Strategy ``add`` appends the strings as special tokens and grows the embeddings; their rows are trained
through PEFT ``trainable_token_indices``, an adapter vLLM cannot load, so it is served merged.

Strategy ``reserved`` renames 15 unused Llama-3 style ``<|reserved_special_token_N|>`` tokens to the
reflection strings. The vocabulary size and the base weights stay as they are, so the result must be a
*plain* LoRA adapter that vLLM's multi-LoRA loader accepts: ``lora_A``/``lora_B`` of linear layers and
``lora_embedding_A``/``lora_embedding_B`` of ``embed_tokens``, LoRA on ``lm_head``, nothing else (vLLM's
``parse_fine_tuned_lora_name`` rejects ``trainable_tokens_delta`` and full ``modules_to_save`` weights). The
reflection rows get their values through those two LoRA modules only (:func:`init_reserved_lora`):

* ``embed_tokens`` LoRA: row ``t`` of the embedding moves by ``scaling * B @ A[:, t]``. ``A``'s columns other
  than the reflection ids start at zero and their gradient is masked, so every other row stays exactly the
  base row, in training, in the saved adapter and in vLLM.
* ``lm_head`` LoRA: row ``t`` of the head moves by ``scaling * B[t] @ A``. ``B``'s rows other than the
  reflection ids start at zero and their gradient is masked.
* At the start, the first components of both are set (by an SVD) so that the reflection rows *are* the mean
  of the real rows, as ``add`` starts them: an untrained reserved row is not a useful start.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Literal

import torch

from selfrag.errors import ConfigError, TokenizerError
from selfrag.loading import embedding_rows, grow_embeddings
from selfrag.reflection import TOKENS, ReflectionIds, reflection_ids

logger = logging.getLogger(__name__)

STRATEGIES = ("add", "reserved")
#: ``auto`` picks ``reserved`` where a tokenizer has at least this many unused reserved tokens.
RESERVED_NEEDED = len(TOKENS)
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
    strategy = resolve_strategy(tokenizer, strategy)
    if init not in INITS:
        raise ConfigError([f"tokens.init must be one of {list(INITS)}, got {init!r}"])
    if strategy == "reserved":
        return map_reserved_tokens(model, tokenizer)
    return add_reflection_tokens(model, tokenizer, init)


def resolve_strategy(tokenizer: Any, strategy: str) -> Literal["add", "reserved"]:
    """``auto`` -> ``reserved`` where the tokenizer has >= 15 unused reserved tokens (or already holds the
    reflection strings on reserved ids), else ``add``; other values are checked and returned."""
    if strategy not in (*STRATEGIES, "auto"):
        raise ConfigError([f"tokens.strategy must be one of {[*STRATEGIES, 'auto']}, got {strategy!r}"])
    if strategy == "add":
        return "add"
    if strategy == "reserved":
        return "reserved"
    if _already_prepared(tokenizer):
        # A tokenizer saved by selfrag: one that still holds unused reserved tokens had them to spare.
        return "reserved" if reserved_tokens(tokenizer) else "add"
    return "reserved" if len(reserved_tokens(tokenizer)) >= RESERVED_NEEDED else "add"


def reserved_tokens(tokenizer: Any) -> list[tuple[int, int]]:
    """``(N, id)`` of every ``<|reserved_special_token_N|>`` the tokenizer holds, by N."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return sorted(
        (int(match.group(1)), token_id) for token_id, added in decoder.items()
        if (match := RESERVED_PATTERN.match(str(added.content if hasattr(added, "content") else added)))
    )


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
    grow_embeddings(model, embedding_rows(tokenizer, token_ids))  # as the loader grows a base for the adapter
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
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise TokenizerError("tokens.strategy=reserved needs a fast tokenizer; use tokens.strategy=add")
    reserved = reserved_tokens(tokenizer)
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
    # The base rows are left as they are: vLLM serves the adapter on the unchanged base, so the start
    # values (the mean) are put into the LoRA weights by init_reserved_lora.
    logger.info("mapped the reflection tokens onto reserved ids %s", ids)
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
    if head is None:
        return False
    weight, embedding = head.weight, model.get_input_embeddings().weight
    # on the meta device every data_ptr() is 0: only the same Parameter object counts as tied there
    return weight is embedding or (weight.device.type != "meta" and weight.data_ptr() == embedding.data_ptr())


# --- Strategy reserved: the reflection rows through plain LoRA modules ---------------------------------


def embedding_module_names(model: Any) -> tuple[str, str | None]:
    """Last name parts of the input embedding and the output head (``embed_tokens``, ``lm_head``) of a model."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    names = {id(module): name.rsplit(".", 1)[-1] for name, module in model.named_modules()}
    return names[id(embedding)], names.get(id(head)) if head is not None else None


def linear_module_names(model: Any) -> list[str]:
    """Last name parts of the model's linear layers, the output head excluded (PEFT's ``all-linear``)."""
    head = model.get_output_embeddings()
    names = {
        name.rsplit(".", 1)[-1] for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    }
    return sorted(names)


@torch.no_grad()
def init_reserved_lora(model: Any, token_ids: ReflectionIds, known_rows: int) -> None:
    """Start the reflection rows at the mean through the LoRA weights, and keep every other row exactly base.

    ``model`` is the PEFT model with LoRA on the input embedding and the output head; ``known_rows`` is the
    number of real (non-added) rows the mean is taken over. Registers gradient masks so that only the
    reflection columns of the embedding's ``A`` and the reflection rows of the head's ``B`` ever move.
    """
    ids = torch.tensor(sorted(token_ids.all_ids), dtype=torch.long)
    embedding, head = _lora_module(model, "input"), _lora_module(model, "output")
    base_embedding = embedding.get_base_layer().weight
    for layer, base, kind in ((embedding, base_embedding, "embedding"), (head, head.get_base_layer().weight, "head")):
        adapter = layer.active_adapters[0]
        target = base[:known_rows].float().mean(dim=0) - base[ids].float()  # (15, hidden): where the rows must go
        factor_ids, factor_hidden, residual = _factorise(target / layer.scaling[adapter], layer.r[adapter])
        rank = factor_ids.shape[1]
        if kind == "embedding":
            a, b = layer.lora_embedding_A[adapter], layer.lora_embedding_B[adapter]  # (r, vocab), (hidden, r)
            a.zero_()  # PEFT starts A at zero and B random: components past `rank` stay trainable
            a[:rank, ids] = factor_ids.T.to(a.dtype)
            b[:, :rank] = factor_hidden.T.to(b.dtype)
            mask = torch.zeros(1, a.shape[1], dtype=a.dtype, device=a.device)
            mask[0, ids] = 1
            a.register_hook(lambda grad, mask=mask: grad * mask)
        else:
            a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight  # (r, hidden), (vocab, r)
            b.zero_()  # PEFT starts B at zero and A random: components past `rank` stay trainable
            b[ids, :rank] = factor_ids.to(b.dtype)
            a[:rank] = factor_hidden.to(a.dtype)
            mask = torch.zeros(b.shape[0], 1, dtype=b.dtype, device=b.device)
            mask[ids, 0] = 1
            b.register_hook(lambda grad, mask=mask: grad * mask)
        if residual > 1e-3:
            logger.warning(
                "LoRA rank %d cannot hold the reserved rows' start values exactly (%s relative error %.3f); "
                "raise lora.r to >= %d for an exact mean start", layer.r[adapter], kind, residual, len(ids),
            )


def reserved_row_deltas(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(embedding, head)`` row deltas (vocab, hidden) that the LoRA weights add to the base, for checks."""
    deltas = []
    for side in ("input", "output"):
        layer = _lora_module(model, side)
        deltas.append(layer.get_delta_weight(layer.active_adapters[0]).detach())
    return deltas[0], deltas[1]


def _lora_module(model: Any, side: str) -> Any:
    module = model.get_input_embeddings() if side == "input" else model.get_output_embeddings()
    if not hasattr(module, "get_base_layer") or not hasattr(module, "r"):
        raise TokenizerError(
            f"tokens.strategy=reserved needs LoRA on the {side} embeddings; the model has {type(module).__name__}"
        )
    return module


def _factorise(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(left (n, k), right (k, hidden), relative error)`` with ``left @ right ~= target`` and k <= rank."""
    left, values, right = torch.linalg.svd(target, full_matrices=False)
    norm = float(target.norm())
    tolerance = values.max() * max(target.shape) * torch.finfo(values.dtype).eps if values.numel() else 0
    k = min(rank, int((values > tolerance).sum()))
    root = values[:k].sqrt()
    left_k, right_k = left[:, :k] * root, root[:, None] * right[:k]
    residual = float((target - left_k @ right_k).norm()) / norm if norm > 0 else 0.0
    return left_k, right_k, residual
