"""OpenAI-compatible backend: a remote completions server (``vllm serve``, another selfrag server, ...).

    engine = OpenAIEngine("runs/model", base_url="http://127.0.0.1:8000/v1")   # tokenizer + selfrag.json local

Prompts go as token ids (``prompt: [ids]``), so reflection ids are sent as ids and never re-tokenized; tokens come
back as ids (vLLM's ``return_tokens_as_token_ids``). Reflection scores: ``logprob_token_ids`` (exact, vLLM) where
the server honours it, else the ``logprobs`` top-k list with absent ids and the k-th log-prob as their bound
(``Generation.score_bounds``); which one is found out on the first scored request and remembered. Requests run
``concurrency`` at a time; timeouts, 429, 5xx, connection errors and malformed JSON are retried under the project's
one policy (:mod:`selfrag.retries`: exponential back-off, full jitter, Retry-After) up to ``max_retries`` times, then
raise :class:`RemoteEngineError`. The API key is read
from the environment variable ``api_key_env`` (never from a config file).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from selfrag.errors import SelfragError
from selfrag.loading import describe_model, eos_ids_of
from selfrag.retries import RETRY_STATUS, RetriesExhausted, Retryable, RetryPolicy, call_with_retries, retry_after

from .base import Generation, GenerationRequest, build_generation, sampling_fields
from .options import EngineOptions, resolve_options

logger = logging.getLogger(__name__)

BACKOFF_MAX_S = 30.0  # the longest wait between two tries, Retry-After included


class RemoteEngineError(SelfragError, RuntimeError):
    """The server kept failing (or refused the request) after every retry."""


class OpenAIEngine:
    """An :class:`~selfrag.inference.engines.base.Engine` over an OpenAI-compatible ``/completions`` endpoint."""

    def __init__(self, model_dir: str | Path, options: EngineOptions | None = None, **settings: Any) -> None:
        """``options`` (or ``settings`` as the ``engine_options.*`` keys spell them: ``base_url=...``): the fields
        :meth:`EngineOptions.names` lists for ``openai``."""
        options = resolve_options("openai", options, settings)
        served = describe_model(model_dir)
        self.tokenizer = served.tokenizer
        self.token_ids = served.meta.token_ids
        self.prompt_template = served.meta.prompt_template
        self.calibration = served.meta.calibration  # read here from the model folder, not asked of the server
        self.options = options
        self.base_url = options.base_url.rstrip("/")
        self.name = f"openai:{self.base_url}"
        self.adapters = dict(options.adapters)  # name -> served model name of the adapter on the server
        self.eos_ids = eos_ids_of(self.tokenizer, served.directory)
        self._api_key = os.environ.get(options.api_key_env) if options.api_key_env else None
        self._exact: bool | None = None  # does the server honour logprob_token_ids? (None: not asked yet)
        self._lock = threading.Lock()
        self.retries = 0  # retried attempts so far (for logs and tests)
        self._random = random.Random(options.seed)
        self.served_model, self._max_context = self._served(options.served_model, served.directory)

    @property
    def max_context(self) -> int | None:
        """Longest prompt + output the server accepts: the model card's ``max_model_len`` (vLLM lists it on
        ``/v1/models``), else the local model folder's ``max_position_embeddings``, else None (not checked)."""
        return self._max_context

    # -- protocol ---------------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        if self._exact is None and any(r.score_token_ids for r in requests):
            first = next(i for i, r in enumerate(requests) if r.score_token_ids)
            results: dict[int, Generation] = {first: self._one(requests[first])}  # learns self._exact
        else:
            results = {}
        rest = [i for i in range(len(requests)) if i not in results]
        with ThreadPoolExecutor(max_workers=min(self.options.concurrency, max(1, len(rest)))) as pool:
            for index, generation in zip(rest, pool.map(lambda i: self._one(requests[i]), rest), strict=True):
                results[index] = generation
        return [results[i] for i in range(len(requests))]

    # -- one request ------------------------------------------------------------------------------------

    def _one(self, request: GenerationRequest) -> Generation:
        started = time.monotonic()
        exact = self._exact is not False and bool(request.score_token_ids)
        body = self._body(request, exact)
        tokens, positions = self._request("POST", "/completions", body, _read_completion)
        if exact and request.score_token_ids:
            honoured = all(any(t in p for t in request.score_token_ids) for p in positions) and bool(positions)
            with self._lock:
                if self._exact is None:
                    self._exact = honoured
                    if not honoured:
                        logger.warning("server ignores logprob_token_ids: scoring from its top-%d log-probs",
                                       self.options.top_logprobs)
            if not honoured:
                return self._one(request)
        return self._generation(request, tokens, positions, exact, time.monotonic() - started)

    def _body(self, request: GenerationRequest, exact: bool) -> dict[str, Any]:
        return {
            "model": self.adapters.get(request.adapter, request.adapter) if request.adapter else self.served_model,
            "prompt": list(request.prompt_ids),
            "return_tokens_as_token_ids": True,
            "logprobs": 1,  # tokens come back as ids through the log-prob entries (more where scores are asked)
            **sampling_fields(request, self.eos_ids, self.options.seed, exact, self.options.top_logprobs),
        }

    def _generation(
        self,
        request: GenerationRequest,
        tokens: list[int],
        positions: list[dict[int, float]],
        exact: bool,
        seconds: float,
    ) -> Generation:
        return build_generation(self.tokenizer, request, tokens, positions, exact, self.eos_ids, seconds)

    # -- HTTP -------------------------------------------------------------------------------------------

    def _served(self, served_model: str, directory: Path) -> tuple[str, int | None]:
        """The served model's name (the first listed where none is set) and its context limit."""
        data = self._request("GET", "/models", None)
        cards = data.get("data") if isinstance(data, dict) else None
        cards = [card for card in cards if isinstance(card, dict) and "id" in card] if isinstance(cards, list) else []
        if not served_model and not cards:
            raise RemoteEngineError(
                f"{self.base_url}/models lists no model ({str(data)[:200]}); set inference.engine_options.served_model"
            )
        name = served_model or str(cards[0]["id"])
        card: dict[str, Any] = next((card for card in cards if str(card["id"]) == name), {})
        limit = card.get("max_model_len")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return name, limit
        return name, _local_context(directory)

    def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None, parse: Callable[[Any], Any] = lambda d: d
    ) -> Any:
        """One call under the project's retry policy (:mod:`selfrag.retries`), Retry-After honoured.

        ``parse`` turns the JSON into the result and raises :class:`~selfrag.retries.Retryable` when it is malformed.
        """

        def retried(retry: int, reason: str, delay: float) -> None:
            with self._lock:
                self.retries += 1
            logger.info("%s %s failed (%s); retry %d/%d in %.2f s", method, path, reason, retry,
                        self.options.max_retries, delay)

        policy = RetryPolicy(self.options.max_retries, self.options.backoff, BACKOFF_MAX_S)
        try:
            return call_with_retries(lambda: parse(self._attempt(method, path, body)), policy, self._random,
                                     on_retry=retried)
        except RetriesExhausted as error:
            raise RemoteEngineError(
                f"{method} {self.base_url}{path} failed {error.attempts} times, last: {error.reason}; check the server "
                "or raise inference.engine_options.max_retries / .timeout"
            ) from None

    def _attempt(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        payload = json.dumps(body).encode("utf-8") if body is not None else None
        http = urllib.request.Request(self.base_url + path, data=payload, headers=headers, method=method)
        try:
            with urllib.request.urlopen(http, timeout=self.options.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read()[:300].decode("utf-8", "replace")
            if error.code in RETRY_STATUS:
                raise Retryable(f"HTTP {error.code}: {detail}", retry_after(error.headers.get("Retry-After"))) from None
            raise RemoteEngineError(f"{method} {self.base_url}{path}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
            raise Retryable(f"{type(error).__name__}: {error}") from None
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise Retryable(f"malformed JSON: {raw[:120]!r}") from None


def _local_context(directory: Path) -> int | None:
    """``max_position_embeddings`` from the model folder's config.json (the served model's own limit), or None."""
    try:
        value = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise ValueError(
            f"the server returned token {token!r}, not token_id:N; it must support return_tokens_as_token_ids "
            "(vLLM's OpenAI server does)"
        )
    return int(token.split(":", 1)[1])


def _read_completion(data: Any) -> tuple[list[int], list[dict[int, float]]]:
    """Generated ids and, per position, every id -> log-prob the server returned (top list or chosen ids)."""
    try:
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") or {}
        if not isinstance(logprobs.get("tokens"), list):
            raise TypeError(f"no logprobs.tokens in {str(choice)[:120]}")
        tokens = [_token_id(token) for token in logprobs.get("tokens") or []]
        tops = logprobs.get("top_logprobs") or []
        positions = [
            {_token_id(token): float(value) for token, value in (top or {}).items()} for top in tops
        ]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError) as error:
        raise Retryable(f"malformed completion ({type(error).__name__}: {error})") from None
    return tokens, positions
