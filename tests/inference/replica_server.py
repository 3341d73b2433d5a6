"""One ``selfrag serve`` replica for the replica tests, in its own process (so a test can kill it): the server tests'
scripted engine (no model) behind the real app and uvicorn on 127.0.0.1.

    python tests/inference/replica_server.py --port 8001 [--ready-file PATH] [--delay 0.1] [--grace 5]

``--ready-file``: the backend "loads" until that file exists (``/health`` 503 meanwhile), as a real replica loads
its model; ``--delay``: seconds each engine call takes, so that requests overlap under load; ``--grace``: the
server's graceful_shutdown_s (served as ``selfrag serve`` serves: ``graceful_server``).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # server_harness


def main() -> None:
    import importlib.util

    from server_harness import MODEL, FixedRetriever, ScriptedBackendEngine, serve_config

    from selfrag.inference.server.app import create_app
    from selfrag.inference.server.backend import Backend
    from selfrag.inference.server.run import graceful_server
    from selfrag.reflection import TOKENS, reflection_ids

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--grace", type=float, default=5.0)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("tests_conftest", HERE.parent / "conftest.py")  # the tiny tokenizer
    assert spec is not None and spec.loader is not None
    shared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shared)
    tokenizer = copy.deepcopy(shared.build_tiny_tokenizer())
    tokenizer.add_tokens(list(TOKENS), special_tokens=True)
    engine = ScriptedBackendEngine(tokenizer, reflection_ids(tokenizer))
    engine.delay_s = args.delay

    def load() -> Backend:
        while args.ready_file is not None and not args.ready_file.exists():
            time.sleep(0.05)
        return Backend(engine, FixedRetriever(), MODEL)

    app = create_app(serve_config(max_queue=256, graceful_shutdown_s=args.grace), load)
    graceful_server(app, args.grace, host="127.0.0.1", port=args.port, log_level="warning").run()


if __name__ == "__main__":
    main()
