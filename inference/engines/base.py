"""The engine protocol: token ids in, token ids (with the log-probs of chosen ids) out.

The Self-RAG algorithm talks to a model only through :class:`Engine`, so it never imports torch,
transformers or vLLM. A backend decodes a batch of :class:`GenerationRequest` and returns one
:class:`Generation` per request, in order. A backend that can also read many prefixes of one record in one forward
pass (teacher-forced scoring: :class:`PrefixScoreRequest`) is a :class:`PrefixScorer` as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from selfrag.reflection import ReflectionIds

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class GenerationRequest:
    """One decode.

    ``prompt_ids`` are the ids to continue (already encoded, reflection tokens inserted as ids);
    decoding stops after ``max_tokens`` new ids, at an id in ``stop_token_ids`` (which is kept as the
    last generated id) or at the model's end-of-sequence id. ``temperature`` 0 means greedy.
    ``score_token_ids`` are the ids whose log-probs the engine reports at every generated position
    (the reflection ids; never the whole vocabulary). ``adapter`` names a LoRA adapter where the
    backend serves several; None means the engine's own model.

    Constraints (the reported log-probs stay the model's own, before them): ``banned_token_ids`` are never
    generated; ``min_tokens`` ids come before a stop id or end-of-sequence may be generated (vLLM's
    ``min_tokens``). The runtime's answer after a forced ``[No Retrieval]`` uses both, so that the model writes
    an answer rather than another decision.
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    score_token_ids: tuple[int, ...] = ()
    adapter: str | None = None
    #: a hint: the caller will send prompts that extend this one (the runtime's passage branches extend its decision's
    #: question; pruning's continuation adds the token decoded here), so an engine that keeps prompt KV between calls
    #: (the hf engine's PrefixCache) keeps this one; others ignore it
    keep_prefix: bool = False
    banned_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be between 0 and max_tokens ({self.max_tokens}), got {self.min_tokens}")
        if set(self.banned_token_ids) & set(self.stop_token_ids):
            raise ValueError("a banned id cannot also be a stop id; use min_tokens to delay a stop")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}; use 0 for greedy decoding")
        if not self.prompt_ids:
            raise ValueError("prompt_ids is empty; encode a prompt with selfrag.prompting.encode_prompt")

    @property
    def decode_key(self) -> tuple[Any, ...]:
        """Requests with equal keys can share one batch."""
        return (self.max_tokens, self.stop_token_ids, self.temperature, self.score_token_ids, self.adapter,
                self.banned_token_ids, self.min_tokens)


@dataclass(frozen=True)
class Generation:
    """What one request produced.

    ``text`` keeps special tokens (reflection tokens are visible). ``score_logprobs`` holds one dict
    per generated position: the log-prob of each requested score id; an id the backend could not
    report (e.g. outside its top-k) is absent. ``finish_reason``: ``stop`` (a stop id, kept as the
    last token), ``eos`` (end-of-sequence id, kept as the last token) or ``length``.

    ``score_bounds`` is empty when every score id was scored exactly. A backend that can only return the top-k
    log-probs (an older vLLM, an OpenAI server without ``logprob_token_ids``) leaves ids outside the top k absent
    and records here, per position, the k-th log-prob: an upper bound on every absent id's log-prob.

    ``computed_prompt_tokens``: the prompt ids the backend computed for this request, fewer than ``prompt_tokens``
    where it reused the KV of a prompt it had seen (the hf engine's :class:`PrefixCache`, vLLM's prefix caching);
    None where the backend does not say (count the whole prompt: :attr:`prompt_tokens_computed`).
    """

    token_ids: tuple[int, ...]
    text: str
    score_logprobs: tuple[dict[int, float], ...]
    finish_reason: FinishReason
    prompt_tokens: int
    seconds: float
    score_bounds: tuple[float, ...] = ()
    computed_prompt_tokens: int | None = None

    @property
    def prompt_tokens_computed(self) -> int:
        """The prompt ids this request cost: ``computed_prompt_tokens`` where the backend reported it, else all."""
        return self.prompt_tokens if self.computed_prompt_tokens is None else self.computed_prompt_tokens


@dataclass(frozen=True)
class PrefixScoreRequest:
    """Teacher-forced scoring of one record: what a one-token decode after each of some of its prefixes reports.

    ``prompt_ids`` is the record (a prompt and the ids forced after it); ``prefix_lengths`` the lengths of the
    prefixes to read, each in ``1..len(prompt_ids)``. For each length the engine reports the log-prob of every
    ``score_token_ids`` id as the id after ``prompt_ids[:length]``: the ``score_logprobs[0]`` of
    ``GenerationRequest(prompt_ids[:length], max_tokens=1, score_token_ids=...)``, from one forward pass over the
    record instead of one prefill per prefix. Ids after the longest prefix are not read.
    """

    prompt_ids: tuple[int, ...]
    prefix_lengths: tuple[int, ...]
    score_token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids is empty; encode a prompt with selfrag.prompting.encode_prompt")
        wrong = [length for length in self.prefix_lengths if not 1 <= length <= len(self.prompt_ids)]
        if not self.prefix_lengths or wrong:
            raise ValueError(f"prefix_lengths must be one or more lengths in 1..{len(self.prompt_ids)} (the record's "
                             f"length), got {self.prefix_lengths}")


@runtime_checkable
class PrefixScorer(Protocol):
    """An engine that scores :class:`PrefixScoreRequest` records (the hf engine). ``score_prefixes`` returns, per
    request in order, one dict per prefix length (in the request's order): the log-prob of each score id. A caller
    checks ``isinstance(engine, PrefixScorer)`` and otherwise sends one :class:`GenerationRequest` per prefix."""

    def score_prefixes(self, requests: Sequence[PrefixScoreRequest]) -> list[tuple[dict[int, float], ...]]: ...


@runtime_checkable
class Engine(Protocol):
    """A backend that decodes batches of requests.

    ``tokenizer`` is a transformers-compatible tokenizer (``decode``, ``__call__``, chat template);
    ``token_ids`` the reflection ids of the served model (from its ``selfrag.json``);
    ``prompt_template`` ``auto``/``chat``/``paper`` as the model was trained; ``calibration`` the runtime values
    ``selfrag calibrate`` measured for the model (its ``selfrag.json``'s ``calibration``; None: not calibrated) —
    every backend reads it from the model's metadata, so every engine and every replica decides alike;
    ``name`` is for logs.
    """

    tokenizer: Any
    token_ids: ReflectionIds
    prompt_template: str
    name: str

    @property
    def calibration(self) -> Mapping[str, Any] | None: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]: ...


def concat_generations(first: Generation, rest: Generation) -> Generation:
    """One generation from a decode and its continuation (e.g. a pruning step and the rest of its branch).

    Where one part was scored exactly and the other by top-k, the exact part's bounds are 0.0 (log p <= 0: no
    information), so the bounds stay one per position.
    """
    bounds: tuple[float, ...] = ()
    if first.score_bounds or rest.score_bounds:
        bounds = (first.score_bounds or (0.0,) * len(first.token_ids)) + (
            rest.score_bounds or (0.0,) * len(rest.token_ids)
        )
    return Generation(
        token_ids=first.token_ids + rest.token_ids,
        text=first.text + rest.text,
        score_logprobs=first.score_logprobs + rest.score_logprobs,
        finish_reason=rest.finish_reason,
        prompt_tokens=first.prompt_tokens,
        seconds=first.seconds + rest.seconds,
        score_bounds=bounds,
        computed_prompt_tokens=first.prompt_tokens_computed + rest.prompt_tokens_computed,
    )


def build_generation(
    tokenizer: Any,
    request: GenerationRequest,
    tokens: Sequence[int],
    positions: Sequence[Mapping[int, float]],
    exact: bool,
    eos_ids: Sequence[int],
    seconds: float,
    cached_tokens: int | None = None,
) -> Generation:
    """A :class:`Generation` from a remote or batched backend's raw output (the vllm and openai engines).

    ``tokens`` are cut exactly where the hf engine stops (the first stop id or eos, kept); ``positions`` are the
    log-probs the backend returned per generated position (any ids: the requested score ids are picked out).
    With ``exact`` false (top-k log-probs only), each position's lowest returned log-prob is its bound.
    ``cached_tokens``: the prompt ids the backend's prefix cache served (None: it does not say).
    """
    tokens = [int(token_id) for token_id in tokens]
    finish: FinishReason = "length"
    for index, token_id in enumerate(tokens):
        reason = finish_reason_of(token_id, request.stop_token_ids, eos_ids)
        if reason is not None:
            tokens, finish = tokens[: index + 1], reason
            break
    scores: list[dict[int, float]] = []
    bounds: list[float] = []
    for index in range(len(tokens)):
        values = positions[index] if index < len(positions) and positions[index] else {}
        scores.append({t: float(values[t]) for t in request.score_token_ids if t in values})
        if request.score_token_ids and not exact:
            bounds.append(min(values.values()) if values else float("-inf"))
    return Generation(
        token_ids=tuple(tokens),
        text=tokenizer.decode(tokens, skip_special_tokens=False),
        score_logprobs=tuple(scores),
        finish_reason=finish,
        prompt_tokens=len(request.prompt_ids),
        seconds=seconds,
        score_bounds=tuple(bounds),
        computed_prompt_tokens=None if cached_tokens is None else len(request.prompt_ids) - int(cached_tokens),
    )


#: The logit bias that bans an id on an OpenAI-compatible server (the API's lower limit) and in vLLM.
BAN_BIAS = -100.0


def sampling_fields(
    request: GenerationRequest, eos_ids: Sequence[int], seed: int, exact: bool, top_logprobs: int
) -> dict[str, Any]:
    """vLLM's sampling parameters for ``request``: ``SamplingParams``' keywords (the vllm engine) and the same fields
    of a ``/completions`` body (the openai engine). eos is a stop id, so that finish reasons and kept tokens match
    the hf engine exactly; ``min_tokens`` holds back stop ids and eos until then; the score ids are asked exactly
    (``logprob_token_ids``) where ``exact``, else as the top ``top_logprobs`` log-probs."""
    fields: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "stop_token_ids": list(dict.fromkeys([*request.stop_token_ids, *eos_ids])),
        "ignore_eos": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }
    if request.banned_token_ids:
        fields["logit_bias"] = {int(i): BAN_BIAS for i in request.banned_token_ids}
    if request.min_tokens:
        fields["min_tokens"] = request.min_tokens
    if request.temperature > 0:
        fields["seed"] = seed
    score_ids = list(dict.fromkeys(request.score_token_ids))
    if score_ids and exact:
        fields["logprob_token_ids"] = score_ids
    elif score_ids:
        fields["logprobs"] = top_logprobs
    return fields


def finish_reason_of(token_id: int, stop_ids: Sequence[int], eos_ids: Sequence[int]) -> FinishReason | None:
    """Why decoding ends after ``token_id`` (None: it goes on). A stop id wins over eos."""
    if token_id in stop_ids:
        return "stop"
    if token_id in eos_ids:
        return "eos"
    return None


def context_limit(engine: Any) -> int | None:
    """The most prompt + generated tokens ``engine``'s model takes, or None where unknown (a remote server).

    Optional on the protocol: an engine may expose ``max_context`` (the hf engine reads the model config's
    ``max_position_embeddings``, the vllm engine its ``max_model_len``).
    """
    limit = getattr(engine, "max_context", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def context_problem(prompt_tokens: int, max_tokens: int, limit: int | None) -> str | None:
    """Why a question of ``prompt_tokens`` cannot be answered within ``limit``, or None when it fits."""
    if limit is None or prompt_tokens + max_tokens <= limit:
        return None
    return (
        f"the question is {prompt_tokens} tokens as a prompt; with max_tokens={max_tokens} it exceeds the model's "
        f"context of {limit} tokens; shorten the question (at most {max(limit - max_tokens, 0)} prompt tokens) or "
        "lower max_tokens"
    )

