"""Settings of ``selfrag serve`` (the OpenAI-compatible server).

    config = load_config(ServeConfig, "configs/serve/default.yaml", ["model=runs/model", "retriever.index=runs/index",
                                                                    "inference.engine=vllm"])

Every field is documented; :meth:`ServeConfig.validate` names the field, the value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from selfrag.config import at_least_one, help_field
from selfrag.inference.config import InferenceConfig, inference_keys, misplaced_inference_keys
from selfrag.inference.retrievers.spec import RETRIEVER_KEYS, RetrieverConfig


@dataclass
class ServeConfig:
    """What the server loads, where it listens, and the limits it enforces."""

    #: the retriever's and the engine's top-level keys (serve took engine and engine_options there once): refused
    REMOVED_KEYS: ClassVar[dict[str, str]] = {**RETRIEVER_KEYS, **inference_keys(("engine", "engine_options"))}
    #: the runtime's other settings written at the top level: each named under inference
    MISPLACED_KEYS: ClassVar[dict[str, str]] = misplaced_inference_keys(("engine", "engine_options"))

    model: str = help_field("a model directory trained by selfrag (merged model or LoRA adapter with selfrag.json)")
    retriever: RetrieverConfig = help_field(
        "where passages come from, as in every command: retriever.index=DIR (from selfrag index), "
        "retriever.url=postgresql://...?table=NAME (pgvector, one table shared by every replica; mode, ef_search) or "
        "retriever.corpus=FILE|FOLDER (BM25 built at start-up)", default_factory=RetrieverConfig
    )
    host: str = help_field("address to bind; 127.0.0.1 keeps the server local, 0.0.0.0 exposes it", "127.0.0.1")
    port: int = help_field("TCP port", 8000)
    served_model_name: str = help_field(
        "another model id clients may send (as vLLM's --served-model-name); the model directory's name is always "
        "served too, and GET /v1/models lists both; empty: only the directory's name", ""
    )
    api_key_env: str = help_field(
        "name of the environment variable holding the API key; when it is set and non-empty, /v1/* requires "
        "'Authorization: Bearer <key>' (the key itself is never written to a config or a log)",
        "SELFRAG_API_KEY",
    )
    max_queue: int = help_field("requests waiting for the engine at most; one more is answered 429", 64)
    max_batch: int = help_field(
        "most requests grouped into one engine call per phase (streamed or not); 1 serves them one at a time", 16
    )
    batch_wait_ms: float = help_field(
        "how long the batching worker waits for more requests after the first one arrives", 10.0
    )
    concurrent_batches: int | None = help_field(
        "batches in the engine at once; null: 1 for inference.engine=hf and vllm (one in-process engine, not shared "
        "between threads), 4 for inference.engine=openai (a vllm serve tier batches every request in flight at each "
        "decode step, so a request need not wait for the batch before it)", None
    )
    timeout_s: float = help_field("per-request limit in seconds (queue wait + answer); past it: 504", 120.0)
    max_request_bytes: int = help_field("largest request body accepted; larger: 413", 65536)
    max_messages: int = help_field("most chat messages in one request", 64)
    max_question_chars: int = help_field("longest question (the last user message) in characters", 4000)
    max_tokens_limit: int = help_field("largest max_tokens a request may ask for (per decode)", 512)
    max_top_k: int = help_field("largest top_k a request may ask for (each passage is one decode)", 20)
    graceful_shutdown_s: float = help_field("on shutdown, how long in-flight requests may still take", 30.0)
    inference: InferenceConfig = help_field(
        "the runtime's settings, as in ask, eval, calibrate and the quickstart: the engine that decodes "
        "(inference.engine=hf|vllm|openai, inference.engine_options.batch_size=8, inference.engine_options.base_url=..."
        ") and each request's defaults; a request may override mode, top_k, threshold, relevance_threshold, "
        "on_unsupported, on_all_irrelevant, support_bound and max_tokens",
        default_factory=InferenceConfig,
    )

    def batches_at_once(self) -> int:
        """``concurrent_batches``, or its default for the engine."""
        if self.concurrent_batches is not None:
            return self.concurrent_batches
        return 4 if self.inference.engine == "openai" else 1

    def validate(self) -> list[str]:
        """Problems with the values, each naming the field, the value and the fix (empty when valid)."""
        problems = []
        if not self.retriever.is_set():
            problems.append("retriever: no passages; set retriever.index=DIR (built by selfrag index), retriever.url="
                            "postgresql://...?table=NAME or retriever.corpus=FILE (BM25 built at start-up)")
        if not 0 < self.port < 65536:
            problems.append(f"port must be in 1..65535, got {self.port}")
        problems += at_least_one(self, ("max_queue", "max_batch", "max_request_bytes", "max_messages",
                                        "max_question_chars", "max_tokens_limit", "max_top_k"))
        for name in ("timeout_s", "graceful_shutdown_s"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be positive seconds, got {getattr(self, name)}")
        if self.concurrent_batches is not None and self.concurrent_batches < 1:
            problems.append(f"concurrent_batches must be at least 1, got {self.concurrent_batches}")
        elif (self.concurrent_batches or 1) > 1 and self.inference.engine != "openai":
            problems.append(f"concurrent_batches={self.concurrent_batches} needs inference.engine=openai: "
                            f"inference.engine={self.inference.engine} runs in this process and is not shared between "
                            "threads; leave it unset (1)")
        if self.batch_wait_ms < 0:
            problems.append(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms}; use 0 to never wait")
        if self.inference.max_tokens > self.max_tokens_limit:
            problems.append(
                f"inference.max_tokens ({self.inference.max_tokens}) is above max_tokens_limit "
                f"({self.max_tokens_limit}); raise max_tokens_limit or lower inference.max_tokens"
            )
        return problems
