"""``selfrag serve``: an OpenAI-compatible HTTP server over the Self-RAG runtime.

    selfrag serve model=runs/quickstart/model retriever.corpus=data_gen/demo/corpus.jsonl port=8000

Modules: :mod:`.config` (ServeConfig), :mod:`.schemas` (request/response models, the OpenAPI schema),
:mod:`.format` (answers and stream events in OpenAI's shapes plus the ``selfrag`` extension),
:mod:`.batcher` (the bounded queue and the batching worker), :mod:`.metrics` (Prometheus),
:mod:`.app` (the FastAPI application), :mod:`.run` (load the model and index, serve with uvicorn).
FastAPI, uvicorn and prometheus-client come with the ``server`` extra: ``pip install 'selfrag[server]'``.
"""
