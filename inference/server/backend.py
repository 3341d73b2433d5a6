"""What the server answers with: one engine and one retriever, shared by every request.

    backend = load_backend(config)          # the retriever first (corpus errors before the model loads)
    for index, event in backend.stream_many(settings, ["Who wrote Hamlet?", "Who wrote Faust?"]): ...

Per-request settings build a :class:`~selfrag.inference.runtime.SelfRAG` over the shared engine and retriever
(cheap: no model or index is copied); it runs in one of the server's engine threads (``concurrent_batches`` of them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from selfrag.inference.ask import load_retriever
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines import Engine, GenerationRequest, build_engine
from selfrag.inference.engines.cancel import AbandonCheck
from selfrag.inference.events import StreamEvent
from selfrag.inference.runtime import SelfRAG
from selfrag.models import resolve_model
from selfrag.prompting import encode_prompt, passage_ids
from selfrag.retrieval import Retriever

from .config import ServeConfig

logger = logging.getLogger(__name__)


@dataclass
class Backend:
    engine: Engine
    retriever: Retriever | None
    model_name: str  # the model directory's name (served besides ServeConfig.served_model_name)

    def stream_many(self, settings: InferenceConfig, questions: Sequence[str]) -> Iterator[tuple[int, StreamEvent]]:
        """``(question index, event)`` as :meth:`SelfRAG.stream_many
        <selfrag.inference.runtime.SelfRAG.stream_many>` yields them (the engine calls of ``answer_many``)."""
        return SelfRAG(self.engine, self.retriever, settings).stream_many(list(questions))

    def abandon_check(self, questions: Sequence[str], gone: Callable[[int], bool]) -> AbandonCheck:
        """For :func:`~selfrag.inference.engines.cancel.abandon_when`: a request is abandoned when every question it
        serves is ``gone`` (its client left). Every request the runtime makes for a question extends that question's
        prompt (decision, passage branches, segments), so the longest question prompt a request starts with names
        its questions; a request that starts with none is never abandoned."""
        owners: dict[tuple[int, ...], list[int]] = {}
        for index, question in enumerate(questions):
            owners.setdefault(tuple(encode_prompt(self.engine.tokenizer, question, self.engine.prompt_template)),
                              []).append(index)
        lengths = sorted({len(prompt) for prompt in owners}, reverse=True)
        seen: dict[int, tuple[GenerationRequest, list[int]]] = {}  # id(request) -> (request, its questions)

        def questions_of(request: GenerationRequest) -> list[int]:
            entry = seen.get(id(request))
            if entry is None or entry[0] is not request:
                found = next((owners[request.prompt_ids[:n]] for n in lengths if request.prompt_ids[:n] in owners), [])
                entry = seen[id(request)] = (request, found)
            return entry[1]

        def check(requests: Sequence[GenerationRequest]) -> list[bool]:
            return [bool(indices) and all(gone(i) for i in indices) for indices in map(questions_of, requests)]

        return check

    def prompt_tokens(self, question: str) -> int:
        return len(encode_prompt(self.engine.tokenizer, question, self.engine.prompt_template))

    def passage_tokens(self, question: str, top_k: int) -> int:
        """Tokens the longest of the question's ``top_k`` passages adds to a branch prompt (``[Retrieval]<paragraph>
        ...</paragraph>``): the same search as the runtime's first retrieval round; 0 without a retriever."""
        if self.retriever is None:
            return 0
        hits = self.retriever.search(question, top_k)
        tokenizer, ids = self.engine.tokenizer, self.engine.token_ids
        return max((len(passage_ids(tokenizer, ids, hit.passage)) for hit in hits), default=0)


def load_backend(config: ServeConfig) -> Backend:
    """Index the corpus (or open the index), then load the model with the configured engine (the one slow step).

    The same loaders as ``selfrag ask``: :func:`~selfrag.inference.ask.load_retriever` and
    :func:`~selfrag.inference.engines.build_engine` (hf, vllm or openai, with their checked options).
    """
    retriever = load_retriever(config.retriever)
    logger.info("retrieval: %s", type(retriever).__name__)
    model_dir = resolve_model(config.model)
    logger.info("loading %s with the %s engine", model_dir, config.inference.engine)
    engine = build_engine(config.inference, model_dir)
    return Backend(engine, retriever, Path(str(config.model).rstrip("/")).name)
