"""The ``selfrag`` command line.

    selfrag quickstart                                   # demo data -> LoRA on SmolLM2 -> answers
    selfrag generate --config configs/data_gen/squad-demo.yaml output=runs/data
    selfrag train --config configs/train/smollm2-135m-cpu.yaml records=runs/data/records.jsonl output_dir=runs/model
    selfrag ask --model runs/model --corpus data_gen/demo/corpus.jsonl "Who ruled Normandy?"
    selfrag serve --model runs/model --corpus data_gen/demo/corpus.jsonl --port 8000

Each command only parses its arguments and calls the stage's ``run(config)``. A user's mistake (a
missing file, a malformed line, an unknown key or model) prints one line, no traceback, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from selfrag.errors import SelfragError

logger = logging.getLogger("selfrag")

PLANNED = {
    "eval": "evaluation across no-retrieval, plain RAG, prompted and single-pass Self-RAG",
}


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML config file (see configs/)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. training.max_steps=5")
    parser.add_argument("--help-config", action="store_true", help="list every config key with its help and exit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="selfrag", description="Reflection-token Self-RAG toolkit.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    generate = commands.add_parser("generate", help="label trajectories (gold labels from a data set's annotations)")
    _add_config_arguments(generate)
    train = commands.add_parser("train", help="LoRA fine-tune a model to emit reflection tokens (TRL + PEFT)")
    _add_config_arguments(train)
    export = commands.add_parser("export", help="merge a trained adapter into a full model (for vLLM)")
    export.add_argument("adapter", type=Path, help="adapter directory written by selfrag train")
    export.add_argument("output", type=Path, help="where to write the merged model")
    export.add_argument("--merge", action="store_true", default=True, help="merge LoRA weights (default)")

    ask = commands.add_parser("ask", help="answer one question, showing the reflection decisions")
    ask.add_argument("question", help="the question")
    ask.add_argument("--model", required=True, help="a model directory trained by selfrag")
    ask.add_argument("--corpus", required=True, type=Path, help="corpus JSONL (id, title, text) or a folder")
    ask.add_argument("--json", action="store_true", help="print the answer as JSON")
    _add_config_arguments(ask)

    serve = commands.add_parser("serve", help="OpenAI-compatible server (POST /v1/chat/completions, /health, /metrics)")
    serve.add_argument("--model", help="a model directory trained by selfrag (config key: model)")
    serve.add_argument("--corpus", help="corpus JSONL (id, title, text) or a folder (config key: corpus)")
    serve.add_argument("--engine", help="decoding backend (config key: engine; default hf)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 8000)")
    _add_config_arguments(serve)

    quickstart = commands.add_parser("quickstart", help="run everything on the demo data on CPU (~15 min)")
    _add_config_arguments(quickstart)

    for name, what in PLANNED.items():
        planned = commands.add_parser(name, help=f"[not available yet] {what}")
        planned.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    _quiet_libraries()
    handler = COMMANDS.get(args.command)
    if handler is None:
        print(
            f"selfrag {args.command}: not available yet — {PLANNED[args.command]} is planned but not built in "
            "this version. Use `selfrag ask` to answer questions with a trained model.",
            file=sys.stderr,
        )
        return 2
    try:
        return handler(args)
    except SelfragError as error:
        print(f"selfrag {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"selfrag {args.command}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def _quiet_libraries() -> None:
    # Deprecation notices from transformers/TRL internals are for their developers, not selfrag's users.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    for name in ("httpx", "urllib3", "datasets", "bm25s"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass


def _config(cls: type, args: argparse.Namespace, **base: Any) -> Any:
    from selfrag.config import describe, load_config

    if args.help_config:
        print("\n".join(describe(cls)))
        raise SystemExit(0)
    return load_config(cls, args.config, args.overrides, **base)


def _generate(args: argparse.Namespace) -> int:
    from selfrag.data_gen.config import GenerateConfig
    from selfrag.data_gen.run import run

    result = run(_config(GenerateConfig, args))
    print(result.summary())
    return 0


def _train(args: argparse.Namespace) -> int:
    from selfrag.training.config import TrainConfig
    from selfrag.training.run import run

    result = run(_config(TrainConfig, args))
    print(result.summary())
    return 0


def _export(args: argparse.Namespace) -> int:
    from selfrag.training.export import export

    path = export(args.adapter, args.output, merge=args.merge)
    print(f"merged model written to {path}")
    return 0


def _ask(args: argparse.Namespace) -> int:
    from selfrag.inference.ask import ask, format_answer
    from selfrag.inference.config import InferenceConfig

    config = _config(InferenceConfig, args)
    answer = ask(args.model, args.corpus, args.question, config)
    print(json.dumps(answer.to_json(), indent=2, ensure_ascii=False) if args.json else format_answer(answer))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from selfrag.inference.server.config import ServeConfig
    from selfrag.inference.server.run import run

    flags = {name: getattr(args, name) for name in ("model", "corpus", "engine", "host", "port")}
    return run(_config(ServeConfig, args, **{name: value for name, value in flags.items() if value is not None}))


def _quickstart(args: argparse.Namespace) -> int:
    from selfrag.app.quickstart import QuickstartConfig, run

    run(_config(QuickstartConfig, args))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "generate": _generate,
    "train": _train,
    "export": _export,
    "ask": _ask,
    "quickstart": _quickstart,
    "serve": _serve,
}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
