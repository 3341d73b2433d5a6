"""The FastAPI application: OpenAI-compatible routes, the ``selfrag`` extension, limits, auth and metrics.

    app = create_app(config, loader=lambda: load_backend(config), api_key=os.environ.get("SELFRAG_API_KEY"))

Routes: ``POST /v1/chat/completions`` (JSON or server-sent events), ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus), ``GET /openapi.json``; ``GET /`` the trace inspector page (``static/``). Every error
is OpenAI's body ``{"error": {"message", "type", "param", "code"}}`` with a 4xx status naming the field; no
traceback is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from selfrag.inference.answer import Answer
from selfrag.inference.config import InferenceConfig
from selfrag.inference.engines.base import context_limit, context_problem
from selfrag.inference.events import FinalEvent, StreamEvent

from .backend import Backend
from .batcher import BatchWorker, Job, QueueFull, ShuttingDown
from .body import body_error, depth_error
from .checks import question_of, refuse_unsupported, settings_of
from .config import ServeConfig
from .errors import ApiError
from .format import ChunkWriter, completion
from .guard import BODY_SCOPE_KEY, BodyLimitAndMetrics
from .invalid import invalid_fields, surrogate_error
from .metrics import ServerMetrics
from .schemas import ChatCompletion, ChatCompletionRequest, ErrorResponse, Health, ModelList

logger = logging.getLogger(__name__)

KEEPALIVE_S = 10.0
STATIC = Path(__file__).parent / "static"
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": what}
    for code, what in {
        400: "a field is invalid; error.param names it", 401: "missing or wrong API key",
        404: "unknown model", 413: "request body too large", 429: "the queue is full; retry later",
        503: "the model or index is still loading, or the server stopped past graceful_shutdown_s",
        504: "no answer within timeout_s",
    }.items()
}


@dataclasses.dataclass
class ServerState:
    """What the routes share: settings, the backend once loaded, the worker and the metrics."""

    config: ServeConfig
    model_name: str  # the name answers carry: served_model_name where one is configured, else the folder's
    api_key: str | None
    metrics: ServerMetrics
    worker: BatchWorker
    backend: Backend | None = None
    status: str = "loading"
    detail: str | None = None
    served_names: tuple[str, ...] = ()  # every model id a request may name (model_name first)

    def expire(self) -> int:
        """Shutdown past graceful_shutdown_s: answer every request still waiting or decoding with 503 (a stream: an
        error event, then ``[DONE]``) instead of letting uvicorn cancel it (a bare 500, a cut stream, tracebacks)."""
        grace = self.config.graceful_shutdown_s
        failed = self.worker.expire(f"the server is shutting down and this request was still running after "
                                    f"graceful_shutdown_s={grace:g} s; retry it (another replica, or this one "
                                    "once restarted, answers it)")
        if failed:
            self.metrics.rejected.labels("shutdown").inc(failed)
            logger.warning("shutting down: %d request(s) still running after graceful_shutdown_s=%g s answered 503",
                           failed, grace)
        return failed

    def ready_backend(self) -> Backend:
        if self.backend is None:
            raise ApiError(503, f"the model is {self.status}; wait until GET /health says ready", "server_error",
                           code="model_not_ready")
        return self.backend


def create_app(
    config: ServeConfig,
    loader: Backend | Callable[[], Backend],
    api_key: str | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The application; ``loader`` is a loaded backend or a function that loads one (run in a thread)."""
    metrics = ServerMetrics()
    folder = loader.model_name if isinstance(loader, Backend) else str(config.model).rstrip("/").rsplit("/", 1)[-1]
    names = tuple(dict.fromkeys(name for name in (config.served_model_name, folder) if name))
    state = ServerState(config, names[0], api_key or None, metrics, BatchWorker(
        lambda settings, questions: state.ready_backend().stream_many(settings, questions),
        config.max_queue, config.max_batch, config.batch_wait_ms / 1000, metrics,
        abandon_check=lambda questions, gone: state.ready_backend().abandon_check(questions, gone),
        concurrent_batches=config.batches_at_once(),
    ))
    state.served_names = names

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.worker.start()
        loading = None if isinstance(loader, Backend) else asyncio.create_task(_load(state, loader, on_load_failure))
        if isinstance(loader, Backend):
            state.backend, state.status = loader, "ready"
        yield
        if loading is not None and not loading.done():
            loading.cancel()
        await state.worker.stop()  # uvicorn has already let in-flight requests finish

    app = FastAPI(title="selfrag", version="1", lifespan=lifespan,
                  description="OpenAI-compatible Self-RAG server: answers carry citations, flags and the trace.")
    app.state.selfrag = state
    app.add_middleware(BodyLimitAndMetrics, limit=config.max_request_bytes, metrics=metrics)
    _add_error_handlers(app)
    _add_routes(app, state)
    _add_page(app)
    if state.api_key is None:
        _drop_security_from_schema(app)
    return app


def _drop_security_from_schema(app: FastAPI) -> None:
    """Without a configured key the schema must not claim one is required (clients and fuzzers believe it)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema.get("components", {}).pop("securitySchemes", None)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.pop("security", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


async def _load(state: ServerState, loader: Callable[[], Backend], on_failure: Callable[[BaseException], None] | None
                ) -> None:
    started = time.monotonic()
    try:
        state.backend = await asyncio.to_thread(loader)
    except Exception as error:
        state.status, state.detail = "failed", str(error)
        logger.error("loading failed: %s", error)
        if on_failure is not None:
            on_failure(error)
        return
    state.status = "ready"
    logger.info("ready: %s loaded in %.1f s", state.model_name, time.monotonic() - started)


# -- routes ---------------------------------------------------------------------------------------------


_BEARER = HTTPBearer(auto_error=False, description="required when the server was started with an API key")


async def _check_key(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
) -> None:
    """Constant-time comparison with the configured key; no key configured: every request passes."""
    error = _key_error(request)
    if error is not None:
        raise error


def _key_error(request: Request) -> ApiError | None:
    """401 unless the request carries the configured key (None: it does, or none is configured). Also called before
    a body that failed to parse is reported: without the key a client learns nothing about the body."""
    key = request.app.state.selfrag.api_key
    if key is None:
        return None
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    given = given.strip() if scheme.lower() == "bearer" else ""
    if hmac.compare_digest(given.encode("utf-8", "surrogateescape"), key.encode("utf-8")):
        return None
    return ApiError(401, "missing or wrong API key; send the header 'Authorization: Bearer <key>'",
                    code="invalid_api_key")


async def _check_depth(request: Request) -> None:
    """400 ``invalid_json`` for a body nested deeper than :data:`.body.MAX_DEPTH` that FastAPI parsed (its parser
    goes far deeper): run after the key check, before the body's fields are validated."""
    error = depth_error(request.scope.get(BODY_SCOPE_KEY))
    if error is not None:
        raise error


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/v1/models", response_model=ModelList, dependencies=[Depends(_check_key)],
             responses={401: _ERRORS[401]})
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "selfrag"}
                                           for name in state.served_names]}

    @app.post("/v1/chat/completions", response_model=ChatCompletion,
              dependencies=[Depends(_check_key), Depends(_check_depth)],
              responses={**_ERRORS, 200: {"content": {"text/event-stream": {}},
                                          "description": "a completion, or with stream=true server-sent events"}})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        return await _chat(state, body, request)

    @app.get("/health", response_model=Health, responses={503: {"model": Health, "description": "not ready"}})
    async def health() -> JSONResponse:
        data = Health(status=state.status, model=state.model_name, queue_depth=state.worker.depth,  # type: ignore[arg-type]
                      detail=state.detail)
        return JSONResponse(data.model_dump(), status_code=200 if state.status == "ready" else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _add_page(app: FastAPI) -> None:
    """The trace inspector: static files shipped in the package; it calls this server's API like any client."""
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def icon() -> FileResponse:  # what a browser asks for on its own, whatever the page links
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")


async def _chat(state: ServerState, body: ChatCompletionRequest, request: Request) -> Any:
    backend = state.ready_backend()
    unreadable = surrogate_error(body.model, "model")
    if unreadable is not None:
        raise unreadable
    if body.model not in state.served_names:
        served = " or ".join(repr(name) for name in state.served_names)
        raise ApiError(404, f"model {body.model!r} is not served here; this server serves {served} (GET /v1/models; "
                       "served_model_name=NAME adds a name)", param="model", code="model_not_found")
    refuse_unsupported(body)
    question = question_of(body, state.config)
    settings = settings_of(body, state.config)
    prompt_tokens = await _check_context(backend, question, settings)
    try:
        job = state.worker.submit(question, settings, stream=bool(body.stream))
    except QueueFull as error:
        state.metrics.rejected.labels("queue_full").inc()
        wait = state.worker.retry_after_s()
        raise ApiError(429, f"the server is busy: {error}; retry in {wait} s", "rate_limit_error",
                       code="rate_limit_exceeded", headers={"Retry-After": str(wait)}) from None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_stream(state, job, prompt_tokens, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        answer = await _await_answer(state, job, request)
    except _Disconnected:
        return Response(status_code=499)
    state.metrics.observe_answer(answer)
    return JSONResponse(completion(answer, state.model_name, prompt_tokens))


async def _check_context(backend: Backend, question: str, settings: InferenceConfig) -> int:
    """The question's prompt tokens; 400 when the question, or the question with its longest retrieved passage (each
    passage branch decodes ``prompt + passage``), and max_tokens exceed the model's context."""
    prompt_tokens = backend.prompt_tokens(question)
    limit = context_limit(backend.engine)
    too_long = context_problem(prompt_tokens, settings.max_tokens, limit)
    if too_long:
        raise ApiError(400, too_long.replace("the question", "the last user message", 1), param="messages",
                       code="context_length_exceeded")
    if limit is None or settings.mode == "never":
        return prompt_tokens
    passage_tokens = await asyncio.to_thread(backend.passage_tokens, question, settings.top_k)
    needed = prompt_tokens + passage_tokens + settings.max_tokens
    if needed > limit:
        raise ApiError(400, f"the last user message is {prompt_tokens} tokens as a prompt, its longest retrieved "
                       f"passage needs {passage_tokens} more and max_tokens={settings.max_tokens}: {needed} exceeds "
                       f"the model's context of {limit} tokens; shorten the question (at most "
                       f"{max(limit - passage_tokens - settings.max_tokens, 0)} prompt tokens), lower max_tokens, or "
                       "send mode=never", param="messages", code="context_length_exceeded")
    return prompt_tokens


class _Disconnected(Exception):
    pass


async def _await_answer(state: ServerState, job: Job, request: Request, poll_s: float = 0.25) -> Answer:
    """The job's answer; 504 past timeout_s; frees the slot when ``request``'s client goes away."""
    deadline = job.enqueued + state.config.timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timed_out(state, job)
        done, _ = await asyncio.wait({job.future}, timeout=min(poll_s, remaining))
        if done:
            break
        if await request.is_disconnected():
            state.worker.cancel(job)
            state.metrics.rejected.labels("disconnected").inc()
            raise _Disconnected
    return _outcome(job)


def _outcome(job: Job) -> Answer:
    try:
        return job.future.result()
    except ShuttingDown as error:
        raise ApiError(503, str(error), "server_error", code="server_shutting_down") from None
    except Exception as error:
        raise ApiError(500, f"the engine failed on this request: {type(error).__name__}", "server_error") from None


def _timed_out(state: ServerState, job: Job) -> ApiError:
    state.worker.cancel(job)
    state.metrics.rejected.labels("timeout").inc()
    return ApiError(504, f"no answer within timeout_s={state.config.timeout_s} s; retry, or ask the operator to "
                    "raise timeout_s", "timeout", code="timeout")


async def _stream(state: ServerState, job: Job, prompt_tokens: int, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events, each sent as the runtime yields it; a disconnect cancels this generator, which frees
    the job's slot (or stops its decoding at the runtime's next event)."""
    writer = ChunkWriter(state.model_name)
    final: Answer | None = None
    try:
        yield _sse(writer.role())
        while final is None:
            try:
                event = await _next_event(state, job)
            except ApiError as error:
                yield _sse(error.body())
                yield "data: [DONE]\n\n"
                return
            if event is None:
                yield ": keep-alive\n\n"  # SSE comment: clients skip it; a gone client fails the write
                continue
            if isinstance(event, FinalEvent):
                final = event.answer
                state.metrics.observe_answer(final)
            yield _sse(writer.event(event))
        if include_usage:
            yield _sse(writer.usage(final, prompt_tokens))
        yield "data: [DONE]\n\n"
    except (asyncio.CancelledError, GeneratorExit):
        if final is None and not job.future.done():
            state.worker.cancel(job)
            state.metrics.rejected.labels("disconnected").inc()
        raise


async def _next_event(state: ServerState, job: Job) -> StreamEvent | None:
    """The streaming job's next event; None after KEEPALIVE_S without one (send a keep-alive).

    Raises :class:`ApiError` past timeout_s (queue wait and the whole stream), or when the engine failed.
    """
    assert job.events is not None, "a streaming job has an event queue"
    deadline = job.enqueued + state.config.timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timed_out(state, job)
        try:
            event = await asyncio.wait_for(job.events.get(), min(KEEPALIVE_S, remaining))
        except TimeoutError:
            if remaining > KEEPALIVE_S:
                return None
            continue
        if event is None:  # the worker is done without a final event: the engine failed
            _outcome(job)
            raise ApiError(500, "the stream ended without an answer; the server log has the details", "server_error")
        return event


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n"


# -- errors ---------------------------------------------------------------------------------------------


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        unauthorised = _key_error(request) if request.url.path.startswith("/v1/") else None
        if unauthorised is not None:
            return unauthorised.response()
        not_an_object = _body_error(request)
        if not_an_object is not None:
            return not_an_object.response()
        json_error = next((item for item in error.errors() if item.get("type") == "json_invalid"), None)
        if json_error is not None:
            return _invalid_json(request, json_error).response()
        return invalid_fields(error.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 400 and request.method == "POST":  # FastAPI could not parse the body
            refused = _key_error(request) or _body_error(request)
            if refused is not None:
                return refused.response()
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        code = {400: "invalid_json", 404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return ApiError(error.status_code, str(error.detail), kind, param="body" if error.status_code == 400 else None,
                        code=code).response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        return ApiError(500, "internal error; the server log has the details", "server_error").response()


def _body_error(request: Request) -> ApiError | None:
    """400 ``invalid_json`` for a POST body that is not one JSON object (see :mod:`.body`); None otherwise."""
    if request.method != "POST":
        return None
    return body_error(request.scope.get(BODY_SCOPE_KEY), request.headers.get("content-type"))


def _invalid_json(request: Request, item: dict[str, Any]) -> ApiError:
    """400 naming where the body stops being JSON: byte offset, line and column (FastAPI reports a character index)."""
    location = [part for part in item.get("loc", ()) if part != "body"]
    position = location[0] if location and isinstance(location[0], int) else None
    reason = str((item.get("ctx") or {}).get("error") or "invalid JSON")
    body = request.scope.get(BODY_SCOPE_KEY)
    where = "" if position is None else f" at character {position}"
    if position is not None and isinstance(body, bytes):
        text = body.decode("utf-8", "replace")[:position]
        line = text.count("\n") + 1
        column = position - (text.rfind("\n") + 1) + 1
        where = f" at byte {len(text.encode('utf-8'))} (line {line}, column {column})"
    return ApiError(400, f"the request body is not valid JSON: {reason}{where}; send one JSON object with "
                    "Content-Type: application/json", param="body", code="invalid_json")
