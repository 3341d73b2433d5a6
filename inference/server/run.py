"""Serve a trained model: ``selfrag serve`` calls :func:`run`.

    selfrag serve model=runs/quickstart/model retriever.corpus=data_gen/demo/corpus.jsonl port=8000
    SELFRAG_API_KEY=secret selfrag serve --config configs/serve/default.yaml model=DIR retriever.index=DIR max_batch=8

The port opens at once; ``GET /health`` says ``loading`` (503) until the index and the model are loaded, then
``ready``. SIGINT/SIGTERM stop accepting connections and let in-flight requests finish for ``graceful_shutdown_s``;
what still runs then is answered 503 ``server_shutting_down`` (a stream: an error event, then ``[DONE]``) and the
process exits without waiting for the engine's batch.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from selfrag.errors import InputError, SelfragError
from selfrag.models import resolve_model

from ..engines.options import import_vllm
from .app import create_app
from .backend import load_backend
from .config import ServeConfig

logger = logging.getLogger(__name__)

#: after graceful_shutdown_s, how long the answers to the requests still running may take to be written
SHUTDOWN_MARGIN_S = 2.0


def run(config: ServeConfig) -> int:
    """Serve until interrupted; a model or corpus that fails to load stops the server with its error."""
    corpus, index = config.retriever.corpus, config.retriever.index
    if corpus is not None and not Path(corpus).exists():
        raise InputError(f"retriever.corpus {corpus!r} not found; give a corpus JSONL or folder")
    if index is not None and "://" not in index and not Path(index).is_dir():
        raise InputError(f"retriever.index {index!r} not found; build it with `selfrag index` or give retriever.corpus")
    if config.inference.engine == "vllm":
        import_vllm("inference.engine=vllm")  # a missing vLLM fails here, with the line that installs it
    resolve_model(config.model)  # so does a wrong model=, before the port opens
    api_key = os.environ.get(config.api_key_env) or None
    if api_key is None and not _is_loopback(config.host):
        logger.warning("serving on %s without an API key; set %s to require one", config.host, config.api_key_env)
    failure: list[BaseException] = []
    server: uvicorn.Server | None = None

    def stop(error: BaseException) -> None:
        failure.append(error)
        if server is not None:
            server.should_exit = True

    app = create_app(config, lambda: load_backend(config), api_key=api_key, on_load_failure=stop)
    server = graceful_server(app, config.graceful_shutdown_s, host=config.host, port=config.port,
                             log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower())
    logger.info("serving on http://%s:%d (API key %s)", config.host, config.port,
                "required" if api_key else "not required")
    server.run()
    if failure:
        error = failure[0]
        raise error if isinstance(error, SelfragError) else InputError(f"loading failed: {error}")
    return 0


class GracefulServer(uvicorn.Server):
    """uvicorn's server whose shutdown, past ``graceful_shutdown_s``, calls ``expire`` (``ServerState.expire``:
    the requests still running are answered 503) instead of letting uvicorn cancel them (a bare text 500, a cut
    stream, a traceback each); uvicorn's own cut comes :data:`SHUTDOWN_MARGIN_S` later, for those answers."""

    def __init__(self, config: uvicorn.Config, graceful_shutdown_s: float, expire: Callable[[], object]) -> None:
        super().__init__(config)
        self.graceful_shutdown_s, self.expire = graceful_shutdown_s, expire

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(self.graceful_shutdown_s, self.expire)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def graceful_server(app: FastAPI, graceful_shutdown_s: float, **options: Any) -> GracefulServer:
    """A :class:`GracefulServer` for an app of :func:`~.app.create_app` (``options``: uvicorn's host, port, ...)."""
    config = uvicorn.Config(app, timeout_graceful_shutdown=graceful_shutdown_s + SHUTDOWN_MARGIN_S,  # type: ignore[arg-type]
                            lifespan="on", **options)
    return GracefulServer(config, graceful_shutdown_s, app.state.selfrag.expire)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
